"""Telemetry across a relaunch (an Airflow retry of the launch task, or the CLI again on the same run
folder): torchrun's restart count starts at 0 each time, yet no attempt's samples may overwrite or
merge into another's, so the cost so far and the steps reached count every attempt once."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from seedance_tasks.config import load_settings
from seedance_tasks.telemetry.recorder import StepRecorder, free_attempt
from seedance_tasks.telemetry.samples import summarise
from seedance_tasks.training.launch import next_attempt


def _record(folder, steps, *, attempt=0, rank=0, tmp_path):
    settings = load_settings().telemetry
    settings.flush_every = 2
    settings.port = None
    settings.energy.powercap_root = str(tmp_path / "no-rapl")
    recorder = StepRecorder(settings, folder=folder, rank=rank, run="r", attempt=attempt)
    for step in steps:
        with recorder.step(step):
            with recorder.phase("compute"):
                sum(range(2_000))
    return recorder, recorder.close()


def test_a_second_recorder_of_the_same_rank_and_attempt_keeps_the_first_ones_files(tmp_path):
    folder = tmp_path / "telemetry"
    first, first_totals = _record(folder, [1, 2, 3, 4], tmp_path=tmp_path)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    second, second_totals = _record(folder, [5, 6], tmp_path=tmp_path)  # the relaunch, also "attempt 0"
    assert first.attempt == 0 and second.attempt == 1
    for name, data in before.items():  # nothing of the first attempt overwritten
        assert (folder / name).read_bytes() == data
    assert (folder / "samples-r0000-a001-00001.parquet").is_file() and (folder / "totals-r0000-a001.json").is_file()
    summary = summarise(folder)
    assert summary["steps"] == 6
    assert summary["cost_usd"] == (Decimal(repr(first_totals["totals"]["cost_usd"]))
                                   + Decimal(repr(second_totals["totals"]["cost_usd"])))
    other_rank, _ = _record(folder, [5], rank=1, tmp_path=tmp_path)
    assert other_rank.attempt == 0  # only its own rank's files count


def test_the_next_attempt_of_a_run_folder_follows_its_metrics_and_its_telemetry(tmp_path):
    metrics, telemetry = tmp_path / "metrics.jsonl", tmp_path / "telemetry"
    assert next_attempt(metrics, telemetry) == 0  # a new run folder
    metrics.write_text(json.dumps({"event": "start", "attempt": 0}) + "\n" + json.dumps({"event": "start", "attempt": 1})
                       + "\n{torn\n")
    assert next_attempt(metrics, telemetry) == 2
    telemetry.mkdir()
    (telemetry / "samples-r0001-a004-00002.parquet").write_bytes(b"")
    (telemetry / "totals-r0000-a003.json").write_text("{}")
    (telemetry / "targets-r0000.json").write_text("[]")
    assert next_attempt(metrics, telemetry) == 5
    assert free_attempt(telemetry, 1, 0) == 0 and free_attempt(telemetry, 1, 4) == 5


@pytest.mark.slow
def test_a_relaunched_job_counts_the_killed_attempts_telemetry_once_and_its_own(tmp_path):
    """What an Airflow retry of the launch does: same run, same log folder, a new torchrun."""
    from seedance_tasks.training.launch import launch
    from seedance_tasks.training.trainer import FAIL_AT_ENV

    settings = load_settings()
    settings.telemetry.flush_every = 2
    settings.telemetry.port = None
    schedule = {"micro_batch": 2, "start_batch": 4, "peak_batch": 8, "warmup_steps": 2, "base_batch": 4}

    def go(**kwargs):
        return launch(nproc_per_node=2, backend="gloo", steps=6, checkpoint_store=str(tmp_path / "store"), run="r",
                      checkpoint_every=2, log_dir=tmp_path / "r", schedule=schedule, max_restarts=0,
                      settings=settings, **kwargs)

    killed = go(extra_env={FAIL_AT_ENV: "5"})
    assert not killed["ok"] and killed["telemetry"]["steps"] == 4
    telemetry = tmp_path / "r" / "telemetry"
    kept = {path.name: path.read_bytes() for path in telemetry.glob("samples-*")}
    resumed = go()
    assert resumed["ok"], resumed["error"]
    for name, data in kept.items():
        assert (telemetry / name).read_bytes() == data
    summary = resumed["telemetry"]
    assert summary["steps"] == 6 and not summary["damaged_files"]
    assert Decimal(summary["cost_usd"]) > Decimal(killed["telemetry"]["cost_usd"])
    assert [(start["attempt"], start["resumed_from"]) for start in resumed["starts"]] == [(0, 0), (1, 4)]
    from seedance_tasks.dashboard.training import read_run

    run = read_run(tmp_path / "r")
    assert run.steps == 6 and run.attempts == 2 and run.cost == Decimal(summary["cost_usd"])
    assert run.cost_by_step[-1] == (6, run.cost)
