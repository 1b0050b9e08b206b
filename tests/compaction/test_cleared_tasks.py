"""A task cleared and rerun on its own after its DAG run ended (Airflow's "clear" without
downstream): no later task of the run (no teardown) releases the lake's lease any more, so the
task releases it itself at its end; while other tasks of the run are still to run, it keeps it."""

from __future__ import annotations

import pytest

from seedance_tasks import dag_support, lease, storage
from seedance_tasks.compaction import airflow_tasks
from seedance_tasks.compaction.run import LEASE_NAME
from seedance_tasks.compaction.sample import make_sample_lake

HOLDER = "airflow:seedance_compaction:manual__cleared"
PARAMS = {"min_age": "0", "target_file_size": "512KiB", "purge_older_than": "7d"}


@pytest.fixture
def finished_run(tmp_path, monkeypatch):
    """A lake and the groups of a DAG run that ended (plan, compact, report, purge: lease released)."""
    monkeypatch.setattr(airflow_tasks, "airflow_lease_holder", lambda: HOLDER)
    monkeypatch.setattr(dag_support, "airflow_lease_holder", lambda: HOLDER)
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=2, files_per_partition=3, rows_per_file=100)
    planned = airflow_tasks.plan_task({"uri": str(lake), **PARAMS})
    results = [airflow_tasks.compact_group_task(group) for group in planned["groups"]]
    airflow_tasks.purge_task(PARAMS, airflow_tasks.report_task(planned, results))
    assert lease.current(storage.resolve(lake), LEASE_NAME) is None
    return lake, planned


def _states(monkeypatch, **states):
    monkeypatch.setattr(dag_support, "_run_task_states", lambda: ("compact_0", {
        "plan": "success", "groups": "success", "compact_0": "running", "compact_1": "success",
        "report": "success", "purge_trash": "success", "release_leases": "success", **states}))


def test_a_compact_task_cleared_alone_releases_the_lake_at_its_end(finished_run, monkeypatch):
    lake, planned = finished_run
    _states(monkeypatch)
    result = airflow_tasks.compact_group_task(planned["groups"][0])
    assert result["results"][0]["status"] == "compacted"  # the earlier attempt's work, reported
    assert lease.current(storage.resolve(lake), LEASE_NAME) is None


@pytest.mark.parametrize("pending", [{"release_leases": None}, {"compact_1": "running"}, {"report": "scheduled"}])
def test_a_compact_task_keeps_the_lease_while_its_run_goes_on(finished_run, monkeypatch, pending):
    lake, planned = finished_run
    _states(monkeypatch, **pending)
    airflow_tasks.compact_group_task(planned["groups"][0])
    assert lease.current(storage.resolve(lake), LEASE_NAME).holder == HOLDER  # for the run's next task


def test_a_plan_task_cleared_alone_releases_the_lake_too(finished_run, monkeypatch):
    lake, _ = finished_run
    monkeypatch.setattr(dag_support, "_run_task_states", lambda: ("plan", {
        "plan": "running", "groups": "success", "compact_0": "success", "release_leases": "skipped"}))
    airflow_tasks.plan_task({"uri": str(lake), **PARAMS})
    assert lease.current(storage.resolve(lake), LEASE_NAME) is None


def test_outside_a_task_nothing_is_released():
    assert dag_support.last_of_its_run() is False


def test_in_a_real_dag_run_no_task_but_the_last_releases(tmp_path, run_dag, monkeypatch):
    """Through Airflow's own execution API (`get_task_states`): in a run going its normal way, the
    plan and each compact task see tasks still to run, and keep the lease for them."""
    seen: list[tuple[str, dict, bool]] = []
    real = dag_support._run_task_states

    def recorded():
        me, states = real()
        seen.append((me, dict(states)))
        return me, states

    monkeypatch.setattr(dag_support, "_run_task_states", recorded)
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=2, files_per_partition=3, rows_per_file=100)
    dag_run = run_dag("seedance_compaction", {"uri": str(lake), **PARAMS})
    assert dag_run.state == "success"
    assert sorted(me for me, _ in seen) == ["compact_0", "compact_1", "plan"]
    for me, states in seen:
        assert states[me] == "running" and states["release_leases"] not in dag_support.FINISHED_STATES
    assert lease.current(storage.resolve(lake), LEASE_NAME) is None
