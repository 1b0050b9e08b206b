"""What users and other DAGs hand the lifecycle DAG: trigger forms, asset events, stores that are not there."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from seedance_tasks.lifecycle.events import event_targets

from ..conftest import xcom_value
from .conftest import make_store


def _tree(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


@dataclass(frozen=True)
class _Asset:
    name: str


def _events(asset: str, *extras: dict) -> dict:
    """`triggering_asset_events` as a task sees it: {asset: [event...]}, oldest first."""
    return {_Asset(asset): [SimpleNamespace(extra=extra, timestamp=index) for index, extra in enumerate(extras)]}


BLOAT = "seedance_signal_checkpoint_bloat"
STORED = "seedance_checkpoint_store"


@pytest.mark.parametrize("apply", ["false", "no", 0, 1, "true", None, [True]])
def test_a_bloat_fix_applies_only_on_a_json_true(apply):
    """`"false"` was truthy: an event asking for a dry run deleted checkpoints."""
    extra = {"apply": False, "targets": [{"dag_id": "seedance_checkpoint_lifecycle",
                                          "conf": {"store": "/data/ckpt", "run": "r", "apply": apply}}]}
    targets, ignored = event_targets(_events(BLOAT, extra), apply=False)
    assert targets == [{"store": "/data/ckpt", "run": "r", "apply": False}]
    assert "apply" in ignored[0]["reason"] and repr(apply) in ignored[0]["reason"]
    extra["targets"][0]["conf"]["apply"] = True
    assert event_targets(_events(BLOAT, extra), apply=False)[0] == [{"store": "/data/ckpt", "run": "r", "apply": True}]


@pytest.mark.parametrize(("asset", "extra", "key"), [
    (STORED, {"store": ["/data/ckpt"], "runs": ["r"]}, "store"),
    (STORED, {"store": 7}, "store"),
    (STORED, {"store": "relative/ckpt", "runs": ["r"]}, "relative"),
    (STORED, {"store": "/data/ckpt", "run": "../../etc"}, "run"),
    (STORED, {"store": "/data/ckpt", "runs": ["r", "a/b"]}, "runs[1]"),
    (STORED, {"store": "/data/ckpt", "runs": [None]}, "runs[0]"),
    (STORED, {"store": "/data/ckpt", "runs": [{"a": 1}]}, "runs[0]"),
    (STORED, {"store": "/data/ckpt", "runs": {"r": 1}}, "runs"),
    (BLOAT, {"targets": "xyz"}, "targets"),
    (BLOAT, {"targets": [None]}, "targets[0]"),
    (BLOAT, {"targets": [{"conf": "store=/x"}]}, "targets[0].conf"),
    (BLOAT, {"targets": [{"conf": {"store": "/data/ckpt", "run": "_seedance"}}]}, "targets[0].conf.run"),
])
def test_a_malformed_event_is_left_out_naming_the_key_and_the_others_still_run(asset, extra, key):
    good = {"store": "/data/other", "runs": ["ok"]}
    events = {**_events(asset, extra), **_events(STORED, good)} if asset != STORED else _events(STORED, extra, good)
    targets, ignored = event_targets(events, apply=False)
    assert targets == [{"store": "/data/other", "run": "ok", "apply": False}]
    assert len(ignored) == 1 and key in ignored[0]["reason"] and ignored[0]["asset"] == asset


def test_runs_as_one_string_is_one_run_not_its_letters():
    targets, ignored = event_targets(_events(STORED, {"store": "s3://bucket/ckpt", "runs": "gpt"}), apply=True)
    assert targets == [{"store": "s3://bucket/ckpt", "run": "gpt", "apply": True}] and not ignored


def test_an_event_naming_a_run_the_store_lacks_is_left_out(tmp_path):
    from seedance_tasks.lifecycle.airflow_tasks import plan_task

    store = tmp_path / "store"
    make_store(store, run="r", steps=[0])
    planned = plan_task({}, "asset_triggered", _events(STORED, {"store": str(store), "runs": ["r", "gone"]}))
    assert planned["runs"] == ["r"]
    assert [item["run"] for item in planned["ignored_events"]] == ["gone"]


def test_a_store_in_a_missing_bucket_fails_the_plan(run_dag, s3_server):
    """It used to succeed: no runs listed, nothing to do, a green run for a misspelt bucket."""
    from airflow.sdk.exceptions import AirflowFailException

    from seedance_tasks.lifecycle.airflow_tasks import plan_task

    dag_run = run_dag("seedance_checkpoint_lifecycle", {"store": "s3://no-such-bucket-f/ckpt", "apply": True})
    assert dag_run.state == "failed"
    with pytest.raises(AirflowFailException, match="bucket 'no-such-bucket-f' does not exist"):
        plan_task({"store": "s3://no-such-bucket-f/ckpt"}, "manual")


def test_relative_store_and_bad_run_fail_in_plan_and_touch_nothing(run_dag, tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from seedance_tasks.lifecycle.airflow_tasks import plan_task

    store = tmp_path / "store"
    make_store(store, run="r", steps=[0, 10, 20])
    before = _tree(store)
    monkeypatch.chdir(tmp_path)  # the relative path would name the store from here, and nowhere else
    dag_run = run_dag("seedance_checkpoint_lifecycle", {"store": "store", "keep_last": 1, "apply": True})
    assert dag_run.state == "failed" and _tree(store) == before
    with pytest.raises(AirflowFailException, match="relative path"):
        plan_task({"store": "store"}, "manual")
    for run in ("a/b", "..", "_seedance"):
        with pytest.raises(AirflowFailException, match="bad run name"):
            plan_task({"store": str(store), "run": run}, "manual")
    with pytest.raises(AirflowFailException, match="no run 'ünï'"):
        plan_task({"store": str(store), "run": "ünï"}, "manual")


def _result(run: str, apply: bool, deleted: int, before: str, after: str) -> dict:
    cost = {"monthly_usd": after}
    return {"store": "/s", "run": run, "apply": apply,
            "gc": {"deleted": deleted, "kept": 1, "bytes_freed": deleted * 100, "stray_files": 0, "stray_bytes": 0},
            "gc_cost": {"before": {"monthly_usd": before}, "after": cost}, "moved": {"warm": 1}, "bytes_moved": 10,
            "skipped": 0, "cost": {"before": cost, "after": cost}, "recovered": []}


def test_a_dry_run_of_one_run_is_not_counted_as_saved_by_the_apply_of_another(tmp_path):
    """A run triggered by a bloat fix (apply) and a stored checkpoint (dry) at once: the dashboard
    sums `monthly_usd_saved` of every run that `applied`, so a dry run's figures must not be in it."""
    from seedance_tasks.lifecycle.airflow_tasks import report_task

    store = tmp_path / "store"
    make_store(store, run="a", steps=[0])
    planned = {"store": str(store), "stores": [str(store)], "apply": True}
    results = [_result("a", True, 2, "10", "7"), _result("b", False, 5, "20", "1")]
    summary = report_task(planned, results, {"bytes": 0})
    assert summary["applied"] is True
    assert (summary["deleted"], summary["bytes_freed"], summary["moved"]) == (2, 200, 1)
    assert summary["monthly_usd_saved"] == "3"
    assert summary["would"]["deleted"] == 5 and summary["would"]["monthly_usd_saved"] == "19"
    dry = report_task({**planned, "apply": False}, [_result("b", False, 5, "20", "1")], {"bytes": 0})
    assert dry["applied"] is False and dry["deleted"] == 5 and "would" in dry["note"]


def test_a_dry_run_from_the_form_changes_nothing_and_says_would(run_dag, tmp_path, monkeypatch):
    store, warm = tmp_path / "store", tmp_path / "warm"
    make_store(store, run="a", steps=range(0, 50, 10))
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__WARM__URI", str(warm))
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__WARM_AFTER", "0")
    before = _tree(store)
    dag_run = run_dag("seedance_checkpoint_lifecycle", {"store": str(store), "keep_last": 1, "keep_every": 1000,
                                                        "apply": False, "purge_older_than": "0"})
    assert dag_run.state == "success"
    summary = xcom_value(dag_run, "report")
    assert _tree(store) == before and not warm.exists()
    assert summary["applied"] is False and summary["would"]["deleted"] == summary["deleted"] > 0
    assert "nothing was deleted" in summary["note"]
    assert xcom_value(dag_run, "purge")["skipped"] == "dry run"


def test_a_store_of_thousands_of_runs_reports_a_small_summary(tmp_path, caplog):
    from seedance_tasks.lifecycle.airflow_tasks import report_task

    caplog.set_level(logging.INFO)
    store = tmp_path / "store"
    make_store(store, run="a", steps=[0])
    results = [_result(f"run-{index:04d}", True, 1, "2", "1") for index in range(1500)]
    summary = report_task({"store": str(store), "stores": [str(store)], "apply": True}, results, {"bytes": 0})
    assert summary["runs_count"] == 1500 and len(summary["runs"]) == 50
    assert summary["deleted"] == 1500 and summary["monthly_usd_saved"] == "1500"  # totals over every run
    assert len(json.dumps(summary)) < 60_000
    assert "run-1499" in caplog.text
