"""rank 0's metrics file after a crash: a torn line is skipped, counted, and never glues the next record."""

from __future__ import annotations

import json

from seedance_tasks.training.launch import read_metrics
from seedance_tasks.training.resilience import mtbf_from_history
from seedance_tasks.training.trainer import _metrics_line

START = {"event": "start", "attempt": 1, "world": 2, "resumed_from": 0}


def _write(path, *records: object, tail: str = "") -> None:
    path.write_text("".join(json.dumps(item) + "\n" for item in records) + tail)


def test_a_line_torn_by_kill_9_is_skipped_and_counted_not_fatal(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _write(metrics, START, {"step": 0, "loss": 4.5, "seconds": 0.5}, {"step": 1, "loss": 4.0, "seconds": 0.5},
           tail='{"step": 2, "lo')
    found = read_metrics(metrics)
    assert found["losses"] == [4.5, 4.0]
    assert found["damaged_lines"] == 1
    assert mtbf_from_history(metrics, 100)["exposure_s"] == 1.0


def test_records_without_their_fields_or_not_objects_are_damaged_not_fatal(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _write(metrics, START, [1, 2], "text", {"step": "x", "loss": 1.0}, {"loss": 2.0}, {"event": "checkpoint"},
           {"event": "start"}, {"step": 0, "loss": 3.0, "seconds": "later"}, {"event": "checkpoint", "step": 0,
                                                                           "stall_s": "slow"})
    found = read_metrics(metrics)
    assert found["losses"] == [3.0] and found["checkpoints"] == [0] and len(found["starts"]) == 1
    assert found["damaged_lines"] == 6
    history = mtbf_from_history(metrics, 100)
    assert history["exposure_s"] == 0.0 and history["save_stalls"] == []


def test_the_record_after_a_torn_line_starts_its_own_line(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _write(metrics, START, {"step": 0, "loss": 4.5, "seconds": 0.5}, tail='{"step": 1, "lo')
    _metrics_line(metrics, {**START, "attempt": 2})  # the next attempt, after the crash
    _metrics_line(metrics, {"step": 1, "loss": 4.0, "seconds": 0.5})
    found = read_metrics(metrics)
    assert [start["attempt"] for start in found["starts"]] == [1, 2]
    assert found["losses"] == [4.5, 4.0] and found["damaged_lines"] == 1
    assert mtbf_from_history(metrics, 100)["failures"] == 2  # neither attempt has finished


def test_the_dag_summary_says_what_a_crash_left_unreadable():
    from seedance_tasks.training.airflow_tasks import _summary

    summary = _summary({"ok": False, "damaged_metrics_lines": 1,
                        "telemetry": {"damaged_files": ["samples-r0000-a000-00002.parquet"], "cost": "1.25 USD"}})
    assert summary["damaged_metrics_lines"] == 1
    assert summary["damaged_telemetry_files"] == ["samples-r0000-a000-00002.parquet"]
    assert _summary({"ok": True})["damaged_metrics_lines"] is None
