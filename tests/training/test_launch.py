"""Real 2-process gloo torchrun runs on CPU: checkpoint, kill a worker, resume, same loss trajectory."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from decimal import Decimal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedance_tasks import checkpoint
from seedance_tasks.cli import app
from seedance_tasks.config import load_settings
from seedance_tasks.training.launch import launch, read_metrics
from seedance_tasks.training.resilience import INTERRUPTED_EXIT
from seedance_tasks.training.trainer import FAIL_AT_ENV
from tests.airflow_services import free_port
from tests.prometheus_support import MISSING, prometheus_server
from tests.telemetry.imds_server import ImdsServer

pytestmark = pytest.mark.slow

STEPS, EVERY, KILL_AT = 6, 2, 5  # killed after step 5: the last checkpoint is step 4, so step 5 is redone
SCHEDULE = {"micro_batch": 2, "start_batch": 4, "peak_batch": 12, "end_batch": 8, "warmup_steps": 3,
            "decay_steps": 2, "base_batch": 4}


def _launch(tmp_path, run: str, **kwargs):
    kwargs.setdefault("checkpoint_every", EVERY)
    return launch(
        nproc_per_node=2, backend="gloo", steps=STEPS, checkpoint_store=str(tmp_path / "store"), run=run,
        log_dir=tmp_path / run,  # a relaunch appends to the same metrics
        schedule=SCHEDULE, **kwargs,
    )


def _two_free_ports() -> int:
    """A base port p with p and p + 1 free (rank r exports on p + r)."""
    import socket

    for _ in range(50):
        base = free_port()
        try:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus on loopback scraping the two ranks' exporters every second (None without it)."""
    if MISSING:
        yield None
        return
    base = _two_free_ports()
    with prometheus_server(tmp_path_factory.mktemp("prometheus") / "data",
                           [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"], scrape_interval="1s") as server:
        server.exporter_port = base
        yield server


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prometheus):
    """One uninterrupted run: the trajectory every interrupted run must reproduce (scraped by
    Prometheus while it runs, where Prometheus is installed)."""
    tmp_path = tmp_path_factory.mktemp("reference")
    settings = load_settings()
    if prometheus is not None:
        settings.telemetry.port = prometheus.exporter_port
        settings.telemetry.final_scrape_wait = 30  # the last step's totals are scraped before exit
    result = _launch(tmp_path, "reference", settings=settings)
    assert result["ok"], result["error"]
    return result


def test_prometheus_scrapes_the_recorders_totals_during_a_torchrun_job(reference, prometheus):
    if prometheus is None:
        pytest.skip(MISSING)
    folder = Path(reference["telemetry"]["folder"])
    sums = {rank: json.loads((folder / f"totals-r{rank:04d}-a000.json").read_text())["totals"] for rank in (0, 1)}
    now = time.time()

    def scraped(metric: str) -> dict[tuple, float]:
        series = prometheus.query_range(f"last_over_time({metric}[10m])", now, now, 1)
        return {tuple(sorted((k, v) for k, v in item["metric"].items() if k in ("rank", "phase", "source"))):
                float(item["values"][-1][1]) for item in series if item["metric"].get("run") == "reference"}

    for rank in (0, 1):
        assert sums[rank]["steps"] == STEPS
    for metric, key in [("seedance_steps_total", "steps"), ("seedance_cost_usd_total", "cost_usd"),
                        ("seedance_step_seconds_total", "step_seconds"), ("seedance_busy_seconds_total", "busy_seconds"),
                        ("seedance_loader_samples_total", "loader_samples"),
                        ("seedance_loader_bytes_total", "loader_bytes")]:
        got = scraped(metric)
        assert got == {(("rank", str(rank)),): float(sums[rank][key]) for rank in (0, 1)}, metric
    energy = scraped("seedance_energy_joules_total")
    assert {labels: value for labels, value in energy.items()} == {
        (("rank", str(rank)), ("source", source)): sums[rank]["energy_joules"]
        for rank in (0, 1) for source in [dict(labels)["source"] for labels in energy if dict(labels)["rank"] == str(rank)]}
    phases = scraped("seedance_phase_seconds_total")
    for rank in (0, 1):
        for phase, seconds in sums[rank]["phase_seconds"].items():
            assert phases[(("phase", phase), ("rank", str(rank)))] == seconds
    # and the Parquet samples, the DAG's summary, say the same as the recorder
    telemetry = reference["telemetry"]
    assert Decimal(telemetry["cost_usd"]) == sum(Decimal(repr(sums[rank]["cost_usd"])) for rank in (0, 1))
    assert telemetry["steps"] == STEPS and telemetry["cost"].endswith(" USD")
    assert sums[0]["phase_seconds"]["collective"] > 0 and sums[0]["phase_seconds"]["checkpoint"] > 0


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


def test_sigterm_finishes_the_step_saves_and_the_restart_resumes_bit_exact(reference, tmp_path):
    """SIGTERM to one worker only (a Slurm preemption, a Kubernetes eviction): both ranks stop after
    the same step, rank 0 saves it, every worker exits 75, torchrun restarts them, they resume."""
    pids: dict[int, int] = {}
    sent: list[int] = []

    def on_line(line: str) -> None:
        if match := re.match(r"\[rank(\d)\] start: .* attempt=0 pid=(\d+)", line):
            pids[int(match.group(1))] = int(match.group(2))
        if line.startswith("[rank0] step 2/") and not sent:
            os.kill(pids[1], signal.SIGTERM)
            sent.append(pids[1])

    result = _launch(tmp_path, "sigterm", max_restarts=1, on_line=on_line)
    assert sent and result["ok"], result["error"]
    [interruption] = result["interruptions"]
    stopped = interruption["step"]
    assert interruption["reason"] == "SIGTERM" and interruption["saved"] and 2 <= stopped <= STEPS
    log = open(result["log"]).read()
    assert f"[rank0] interrupted (SIGTERM) after step {stopped}" in log  # rank 0 had no signal: it agreed
    assert f"[rank1] interrupted (SIGTERM) after step {stopped}" in log
    assert re.search(rf"exitcode\s*:\s*{INTERRUPTED_EXIT}", log) or f"exitcode: {INTERRUPTED_EXIT}" in log, log[-3000:]
    assert [start["resumed_from"] for start in result["starts"]] == [0, stopped]
    assert stopped in result["checkpoints"] and result["interrupted"] is None  # the last attempt finished
    assert result["losses"] == reference["losses"]  # bit-identical trajectory


def test_spot_notice_saves_exits_retryably_and_the_relaunch_resumes_bit_exact(reference, tmp_path):
    """The EC2 spot notice from a loopback IMDSv2 server: the job saves the step it is in, exits
    retryably (torchrun out of restarts: the launch fails as retryable, as the Airflow task does),
    and the relaunch (Airflow's retry, elsewhere: no notice there) resumes bit-exact."""
    settings = load_settings()
    with ImdsServer() as imds:
        settings.training.spot.endpoint = imds.endpoint
        settings.training.spot.poll_interval = 0.1

        def on_line(line: str) -> None:
            if line.startswith("[rank0] step 2/"):
                imds.notice = {"action": "terminate", "time": "2026-01-01T00:02:00Z"}

        first = _launch(tmp_path, "spot", settings=settings, on_line=on_line)
        assert imds.polls() >= 1 and all(status != 401 for _m, _p, status in imds.requests if _m == "GET")
        assert not first["ok"] and first["retryable"] and first["exit_code"] != 0
        interrupted = first["interrupted"]
        stopped = interrupted["step"]
        assert interrupted["reason"] == "spot-notice" and interrupted["notice"]["action"] == "terminate"
        assert interrupted["saved"] and 2 <= stopped <= STEPS and stopped in first["checkpoints"]
        assert first["error"].startswith(f"interrupted (spot-notice) after step {stopped}: checkpoint saved")
        assert checkpoint.latest_step(str(tmp_path / "store"), "spot") == stopped
        assert first["losses"] == reference["losses"][:stopped]
        assert first["failures"][0]["exitcode"] == INTERRUPTED_EXIT  # the root cause: a retryable exit

        imds.notice = None  # the retry runs on an instance with no notice
        second = _launch(tmp_path, "spot", settings=settings, checkpoint_every="auto")
    assert second["ok"], second["error"]
    assert [start["resumed_from"] for start in second["starts"]] == [0, stopped]
    assert second["losses"] == reference["losses"]  # bit-identical, whatever the checkpoint steps
    interval = second["checkpoint_interval"]  # Young-Daly from the measured stalls and the run's history
    assert interval["mode"] == "young-daly" and interval["mtbf_source"] == "observed" and interval["failures"] == 1
    assert interval["interval_s"] == pytest.approx((2 * interval["save_cost_s"] * interval["mtbf_s"]) ** 0.5, abs=2e-3)
    assert interval["interval_steps"] >= 1 and STEPS in second["checkpoints"]
    assert second["telemetry"]["steps"] == STEPS  # the cost of both attempts, in one summary
