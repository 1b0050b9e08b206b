"""Real 2-process gloo torchrun runs on CPU: checkpoint, kill a worker, resume, same loss trajectory."""

from __future__ import annotations

import json
import os
import re

import pytest
from typer.testing import CliRunner

from seedance_tasks import checkpoint
from seedance_tasks.cli import app
from seedance_tasks.training.launch import launch, read_metrics
from seedance_tasks.training.trainer import FAIL_AT_ENV

pytestmark = pytest.mark.slow

STEPS, EVERY, KILL_AT = 6, 2, 5  # killed after step 5: the last checkpoint is step 4, so step 5 is redone
SCHEDULE = {"micro_batch": 2, "start_batch": 4, "peak_batch": 12, "end_batch": 8, "warmup_steps": 3,
            "decay_steps": 2, "base_batch": 4}


def _launch(tmp_path, run: str, **kwargs):
    return launch(
        nproc_per_node=2, backend="gloo", steps=STEPS, checkpoint_store=str(tmp_path / "store"), run=run,
        checkpoint_every=EVERY, log_dir=tmp_path / run,  # a relaunch appends to the same metrics
        schedule=SCHEDULE, **kwargs,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run: the trajectory every interrupted run must reproduce."""
    tmp_path = tmp_path_factory.mktemp("reference")
    result = _launch(tmp_path, "reference")
    assert result["ok"], result["error"]
    return result


def test_uninterrupted_run_trains_and_checkpoints(reference, tmp_path):
    assert reference["steps_completed"] == STEPS and reference["exit_code"] == 0
    assert reference["checkpoints"] == [2, 4, 6]
    assert reference["final_loss"] < reference["first_loss"]  # it learns the synthetic language
    assert reference["restarts"] == 0 and reference["starts"] == [{"attempt": 0, "world": 2, "resumed_from": 0}]
    trajectory = read_metrics(reference["metrics"])["trajectory"]
    assert [row["global_batch"] for row in trajectory] == [4, 8, 8, 12, 8, 8]  # the schedule, realised
    assert [row["accumulation"] for row in trajectory] == [1, 2, 2, 3, 2, 2]  # micro-batch 2 x 2 ranks fixed
    assert checkpoint.latest_step(reference["checkpoint_store"], "reference") == STEPS
    state = checkpoint.load(reference["checkpoint_store"], "reference")
    assert state["step"] == STEPS and state["world"] == 2 and "optimizer" in state


def test_sigkilled_worker_restarts_and_resumes_with_the_same_losses(reference, tmp_path):
    result = _launch(tmp_path, "restarted", max_restarts=1, extra_env={FAIL_AT_ENV: str(KILL_AT)})
    assert result["ok"], result["error"]
    log = open(result["log"]).read()
    assert "killing myself with SIGKILL" in log  # a worker really died...
    # ...and torchrun saw the worker group fail (under load rank 0 may be noticed first, exiting
    # with 1 on the broken connection, rather than rank 1 with -9)
    assert re.search(r"failed \(exitcode: -?\d+\) local_rank: [01]", log), log[-3000:]
    assert [start["resumed_from"] for start in result["starts"]] == [0, 4]
    assert result["restarts"] == 1
    assert result["losses"] == reference["losses"]  # bit-identical trajectory
    assert result["checkpoints"] == [2, 4, 6]


def test_killed_job_reports_the_failing_rank_then_a_relaunch_resumes(reference, tmp_path):
    killed = _launch(tmp_path, "relaunched", max_restarts=0, extra_env={FAIL_AT_ENV: str(KILL_AT)})
    assert not killed["ok"] and killed["exit_code"] != 0
    root = killed["failures"][0]
    assert root["root_cause"] and root["rank"] == 1 and root["exitcode"] == -9 and root["signal"] == "SIGKILL"
    assert killed["error"].startswith("rank 1 (local rank 1) failed: SIGKILL")
    assert killed["losses"] == reference["losses"][:KILL_AT]
    from seedance_tasks.training import health

    verdict = health.report(open(killed["log"]).read())["verdict"]
    assert verdict["status"] == "failed" and verdict["cause"].startswith("rank 1 (local rank 1 on ")
    assert "SIGKILL" in verdict["cause"] and "OOM" in verdict["fix"]
    assert checkpoint.latest_step(str(tmp_path / "store"), "relaunched") == 4
    # no workers left behind: the job's process group is gone
    with pytest.raises(ProcessLookupError):
        os.killpg(killed["pgid"], 0)

    # relaunched from the command line, as a person (or an Airflow retry) would: same run, same log folder
    env = {f"SEEDANCE__TRAINING__SCHEDULE__{key.upper()}": str(value) for key, value in SCHEDULE.items()}
    cli = CliRunner().invoke(app, [
        "train", "launch", "--nproc-per-node", "2", "--backend", "gloo", "--steps", str(STEPS),
        "--checkpoint-store", str(tmp_path / "store"), "--run", "relaunched", "--checkpoint-every", str(EVERY),
        "--log-dir", str(tmp_path / "relaunched"), "--json",
    ], env=env)
    assert cli.exit_code == 0, cli.output
    resumed = json.loads(cli.stdout)
    assert resumed["ok"] and resumed["profile"] == "cpu-gloo"
    assert [start["resumed_from"] for start in resumed["starts"]] == [0, 4]
    assert resumed["losses"] == reference["losses"]
    health = CliRunner().invoke(app, ["train", "health", resumed["log"], "--json"])
    assert json.loads(health.stdout)["verdict"]["status"] == "unknown"  # gloo: no NCCL lines to judge


def test_data_from_preprocessed_shards_resumes_at_the_same_sample(tmp_path):
    """--data through the preprocessing pipeline's ShardDataset; after a SIGKILL and restart the
    recomputed step sees the very samples the killed attempt saw (same loss, bit for bit)."""
    from seedance_tasks.config import load_settings, settings_with
    from seedance_tasks.shards.build import build
    from seedance_tasks.shards.sample import make_sample_files

    make_sample_files(tmp_path / "src", 16, width=32, height=24)
    built = build(str(tmp_path / "src"), str(tmp_path / "shards"),
                  settings=settings_with(load_settings(), "shards", shard_size="48KiB"))
    assert built["shards"] >= 2  # one per rank at least
    result = launch(
        nproc_per_node=2, backend="gloo", steps=4, checkpoint_store=str(tmp_path / "store"), run="data",
        checkpoint_every=2, log_dir=tmp_path / "logs", data=str(tmp_path / "shards"), max_restarts=1,
        schedule={"micro_batch": 2, "start_batch": 4, "peak_batch": 8, "warmup_steps": 2, "base_batch": 4},
        extra_env={FAIL_AT_ENV: "3"},
    )
    assert result["ok"], result["error"]
    assert [start["resumed_from"] for start in result["starts"]] == [0, 2]
    records = [json.loads(line) for line in open(result["metrics"]) if '"loss"' in line]
    step3 = [row for row in records if row["step"] == 3]
    assert [row["attempt"] for row in step3] == [0, 1]
    assert step3[0]["loss"] == step3[1]["loss"]  # same samples after skipping the consumed ones
    assert result["steps_completed"] == 4 and result["final_loss"] < result["first_loss"]


def test_a_hung_job_is_killed_with_every_process(tmp_path):
    from seedance_tasks.config import load_settings
    from seedance_tasks.training.launch import _marked_pids
    from seedance_tasks.training.trainer import HANG_AT_ENV

    settings = load_settings()
    settings.training.hang_timeout = 15  # no output for 15 s: hung (start-up takes a few seconds)
    result = launch(nproc_per_node=2, backend="gloo", steps=4, log_dir=tmp_path, settings=settings,
                    schedule=SCHEDULE, extra_env={HANG_AT_ENV: "2"})
    assert result["hung"] and not result["ok"] and result["exit_code"] == 124
    assert "killed as hung" in result["error"]
    assert result["steps_completed"] == 2  # it hung after step 2, not at start-up
    assert _marked_pids(result["job_token"]) == []  # nothing of the job survives
