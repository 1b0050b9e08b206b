"""DAG `seedance_checkpoint_lifecycle`: real Airflow runs (dag.test) over a local store with tiers."""

from __future__ import annotations

import hashlib

from seedance_tasks import storage
from seedance_tasks.checkpoint.store import committed_steps, list_checkpoints

from ..conftest import xcom_value
from .conftest import assert_restorable, make_store


def _tree(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def test_dag_parses_with_params(dagbag):
    dag = dagbag.dags["seedance_checkpoint_lifecycle"]
    assert not dagbag.import_errors
    assert dag.params["apply"] is False
    assert {t.task_id for t in dag.tasks} == {"plan", "runs", "gc", "tier", "purge", "report"}


def test_dry_run_by_default_then_apply(run_dag, tmp_path, monkeypatch):
    store, warm = tmp_path / "store", tmp_path / "warm"
    digests = make_store(store, run="a", steps=range(0, 80, 10))
    digests_b = make_store(store, run="b", steps=range(0, 30, 10))
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__WARM__URI", str(warm))
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__WARM_AFTER", "0")
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__COLD_AFTER", "30d")
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__KEEP_LATEST_HOT", "false")
    before = _tree(store)

    dry = run_dag("seedance_checkpoint_lifecycle", {"store": str(store), "keep_last": 2, "keep_every": 1000})
    assert dry.state == "success"
    summary = xcom_value(dry, "report")
    assert summary["applied"] is False and summary["deleted"] > 0 and summary["moved"] > 0
    assert _tree(store) == before and not warm.exists()

    applied = run_dag("seedance_checkpoint_lifecycle",
                      {"store": str(store), "keep_last": 2, "keep_every": 1000, "apply": True, "purge_older_than": "0"})
    assert applied.state == "success"
    summary = xcom_value(applied, "report")
    assert summary["applied"] is True and {r["run"] for r in summary["runs"]} == {"a", "b"}
    kept_a = set(committed_steps(storage.resolve(store), "a"))
    assert kept_a == {0, 60, 70} | kept_a and len(kept_a) < 8
    assert summary["deleted"] == (8 - len(kept_a)) + (3 - len(committed_steps(storage.resolve(store), "b")))
    assert {row["tier"] for row in list_checkpoints(str(store))} == {"warm"}
    assert summary["purged_bytes"] > 0 and not list((store / "_seedance" / "trash").rglob("*.bin"))
    assert float(summary["monthly_usd_after"]) <= float(summary["monthly_usd_before"])
    assert_restorable(store, "a", {s: digests[s] for s in kept_a})
    assert_restorable(store, "b", {s: digests_b[s] for s in committed_steps(storage.resolve(store), "b")})


def test_bad_policy_fails_the_run_with_a_clear_error(run_dag, tmp_path, monkeypatch):
    store = tmp_path / "store"
    make_store(store, steps=[0, 10])
    before = _tree(store)
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__RETENTION__METRIC", "")  # no metric to rank the best by
    dag_run = run_dag("seedance_checkpoint_lifecycle", {"store": str(store), "keep_best": 2, "apply": True})
    assert dag_run.state == "failed"
    assert _tree(store) == before


def test_apply_rule_scheduled_runs_follow_config_manual_runs_their_param(monkeypatch):
    from seedance_tasks.config import load_settings
    from seedance_tasks.lifecycle.airflow_tasks import _apply

    settings = load_settings()
    assert settings.lifecycle.apply_on_schedule is False
    assert _apply({"apply": True}, "scheduled", settings) is False
    assert _apply({}, "manual", settings) is False and _apply({"apply": True}, "manual", settings) is True
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__APPLY_ON_SCHEDULE", "true")
    assert _apply({}, "scheduled", load_settings()) is True
