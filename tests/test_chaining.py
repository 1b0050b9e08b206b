"""Chained pipelines: each output's Asset event carries its metadata, and a producing run queues
the consumer with that event (Airflow's own AssetDagRunQueue: what the scheduler turns into the
consumer's run); the consumer reads its targets from the events' extras.

`dag.test()` runs no scheduler, so the consumer's run is checked through the queue row the
producer's event created and by handing the stored events to the consumer's plan step.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import xcom_value


def _session():
    from airflow.utils.session import create_session

    return create_session()


def _events(asset_name: str, dag_run) -> list:
    """The AssetEvent rows `dag_run` emitted on `asset_name`."""
    from airflow.models.asset import AssetEvent, AssetModel

    with _session() as session:
        rows = (
            session.query(AssetEvent).join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .filter(AssetModel.name == asset_name, AssetEvent.source_run_id == dag_run.run_id).all()
        )
        for row in rows:
            _ = row.asset  # loaded while the session is open
        session.expunge_all()
        return rows


def _queued(consumer: str) -> set[str]:
    """The assets whose events queued a run of `consumer` (AssetDagRunQueue)."""
    from airflow.models.asset import AssetDagRunQueue, AssetModel

    with _session() as session:
        return {name for (name,) in session.query(AssetModel.name).join(
            AssetDagRunQueue, AssetDagRunQueue.asset_id == AssetModel.id
        ).filter(AssetDagRunQueue.target_dag_id == consumer)}


def _sync_dags() -> None:
    """Write every DAG of the DAGs folder to the metadata DB, as `dag.test()` and the DAG processor do."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    manager = DagBundlesManager()
    manager.sync_bundles_to_db()
    for bundle in manager.get_all_dag_bundles():
        if not bundle.is_initialized:
            bundle.initialize()
        sync_bag_to_db(BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name),
                       bundle.name, bundle.version)


@contextmanager
def _unpaused(dag_id: str):
    """Airflow queues only unpaused consumers; clears their queue afterwards."""
    from airflow.models.asset import AssetDagRunQueue
    from airflow.models.dag import DagModel

    _sync_dags()
    with _session() as session:
        session.query(AssetDagRunQueue).filter(AssetDagRunQueue.target_dag_id == dag_id).delete()
        session.query(DagModel).filter(DagModel.dag_id == dag_id).update({"is_paused": False})
    try:
        yield
    finally:
        with _session() as session:
            session.query(AssetDagRunQueue).filter(AssetDagRunQueue.target_dag_id == dag_id).delete()
            session.query(DagModel).filter(DagModel.dag_id == dag_id).update({"is_paused": True})


def _as_triggering(rows) -> dict:
    """Stored events shaped as a task's `triggering_asset_events` (asset -> its events)."""
    from airflow.sdk import Asset

    mapping: dict = {}
    for row in rows:
        mapping.setdefault(Asset(name=row.asset.name, uri=row.asset.uri), []).append(row)
    return mapping


def _drop_checkpoints(inbox: Path, run: str, steps) -> None:
    import torch

    for step in steps:
        path = inbox / run / f"step-{step:06d}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"w": torch.randn(32, 32, generator=torch.Generator().manual_seed(step))}, path)
        os.utime(path, (0, 0))


# --------------------------------------------------------------------------- schedules


def test_consumers_are_scheduled_on_their_assets_and_their_crons(dagbag):
    from airflow.sdk import AssetOrTimeSchedule

    expected = {
        "seedance_checkpoint_lifecycle": ({"seedance_checkpoint_store", "seedance_signal_checkpoint_bloat"}, "30 3 * * *"),
        "seedance_compaction": ({"seedance_signal_small_files"}, "0 2 * * *"),
        "seedance_checkpoints": ({"seedance_checkpoint_inbox"}, "0 * * * *"),
    }
    for dag_id, (assets, cron) in expected.items():
        dag = dagbag.dags[dag_id]
        assert isinstance(dag.timetable, AssetOrTimeSchedule), dag_id
        condition = dag.timetable.asset_condition
        names = {getattr(item, "name", None) for item in getattr(condition, "objects", [condition])}
        assert names == assets, dag_id
        assert dag.timetable.timetable.expression == cron, dag_id


# --------------------------------------------------------------------------- checkpoint -> lifecycle


def test_a_stored_checkpoint_queues_the_lifecycle_with_its_store(tmp_path, run_dag, caplog):
    inbox, store = tmp_path / "inbox", tmp_path / "store"
    _drop_checkpoints(inbox, "r", (10, 20))
    with _unpaused("seedance_checkpoint_lifecycle"), caplog.at_level(logging.INFO, logger="seedance_tasks.dag"):
        producer = run_dag("seedance_checkpoints", {"inbox": str(inbox), "store": str(store), "min_age": "0"})
        assert producer.state == "success"
        queued = _queued("seedance_checkpoint_lifecycle")
    assert "seedance_checkpoint_store" in queued  # the scheduler's next loop creates the lifecycle run

    (event,) = _events("seedance_checkpoint_store", producer)
    assert event.extra["store"] == str(store) and event.extra["runs"] == ["r"]
    assert event.extra["steps"] == {"r": [10, 20]} and event.extra["stored"] == 2
    assert event.extra["stored_bytes"] > 0 and event.extra["raw_bytes"] > event.extra["stored_bytes"] / 10

    from seedance_tasks.lifecycle.airflow_tasks import plan_task

    planned = plan_task({}, "asset_triggered", _as_triggering([event]))  # the consumer's plan step
    assert planned["stores"] == [str(store)] and planned["runs"] == ["r"]
    assert planned["apply"] is False  # asset-triggered runs follow lifecycle.apply_on_schedule (false)


def test_a_checkpoint_bloat_signal_targets_the_store_and_run_it_names(tmp_path, airflow_db, dagbag):
    from seedance_tasks.lifecycle.airflow_tasks import plan_task
    from tests.lifecycle.conftest import make_store

    store = tmp_path / "store"
    make_store(store, run="big", steps=range(0, 30, 10))
    make_store(store, run="small", steps=range(0, 20, 10))
    extra = {"signal": "checkpoint-bloat", "date": "2026-01-02", "apply": True, "targets": [
        {"key": "k", "dag_id": "seedance_checkpoint_lifecycle", "conf": {"store": str(store), "run": "big",
                                                                          "apply": True}}]}
    with _unpaused("seedance_checkpoint_lifecycle"):
        event = _register("seedance_signal_checkpoint_bloat", extra)
        assert "seedance_signal_checkpoint_bloat" in _queued("seedance_checkpoint_lifecycle")
    planned = plan_task({}, "asset_triggered", _as_triggering([event]))
    assert planned["runs"] == ["big"] and planned["items"][0]["apply"] is True


def _register(asset_name: str, extra: dict):
    """An event on `asset_name` registered the way the REST API's POST /api/v2/assets/events does."""
    from airflow.assets.manager import AssetManager
    from airflow.models.asset import AssetModel

    with _session() as session:
        asset = session.query(AssetModel).filter(AssetModel.name == asset_name).one()
        event = AssetManager.register_asset_change(asset=asset, extra=extra, session=session, source_is_api=True)
        session.flush()
        session.refresh(event)
        _ = event.asset
        session.expunge_all()
    return event


def test_a_trainer_event_on_the_inbox_queues_the_checkpoint_dag(airflow_db, dagbag):
    """What docs/checkpoints.md tells trainers to POST: the inbox asset's event queues the DAG."""
    with _unpaused("seedance_checkpoints"):
        event = _register("seedance_checkpoint_inbox", {"run": "gpt", "step": 100})
        assert "seedance_checkpoint_inbox" in _queued("seedance_checkpoints")
    assert event.extra == {"run": "gpt", "step": 100}


# --------------------------------------------------------------------------- signals -> compaction


def test_a_small_files_signal_compacts_the_lakes_it_names(tmp_path, airflow_db, dagbag):
    from seedance_tasks.compaction import airflow_tasks
    from seedance_tasks.compaction.sample import make_sample_lake
    from seedance_tasks.compaction.settings import CompactionSettings

    lakes = [tmp_path / "a", tmp_path / "b"]
    for lake in lakes:
        make_sample_lake(str(lake), partitions=1, files_per_partition=3, rows_per_file=100)
    extra = {"signal": "small-files", "date": "2026-01-02", "apply": False, "targets": [
        {"key": f"k{i}", "dag_id": "seedance_compaction", "conf": {"uri": str(lake), "dry_run": i == 0}}
        for i, lake in enumerate(lakes)]}
    with _unpaused("seedance_compaction"):
        event = _register("seedance_signal_small_files", extra)
        assert "seedance_signal_small_files" in _queued("seedance_compaction")
    found = airflow_tasks.lakes_to_compact({}, CompactionSettings(), _as_triggering([event]))
    assert found == [{"uri": str(lakes[0]), "dry_run": True}, {"uri": str(lakes[1]), "dry_run": False}]
    assert airflow_tasks.lakes_to_compact({"dry_run": True}, CompactionSettings(), _as_triggering([event]))[1][
        "dry_run"] is True
    assert airflow_tasks.lakes_to_compact({}, CompactionSettings(default_uri="/x")) == [{"uri": "/x", "dry_run": False}]


def test_a_compaction_run_emits_its_figures(tmp_path, run_dag):
    from seedance_tasks.compaction.sample import make_sample_lake

    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=2, files_per_partition=3, rows_per_file=300)
    dag_run = run_dag("seedance_compaction", {"uri": str(lake), "target_file_size": "512KiB", "min_age": "0",
                                              "dry_run": False})
    assert dag_run.state == "success"
    report = xcom_value(dag_run, "report")
    (event,) = _events("seedance_compacted_lake", dag_run)
    assert event.extra["uris"] == [report["uri"]] and event.extra["run_ids"] == [report["run_id"]]
    for key in ("partitions_compacted", "files_before", "files_after", "bytes_before", "bytes_after", "rows"):
        assert event.extra[key] == report[key], key
    assert event.extra["files_before"] == 6 and event.extra["files_after"] == 2


# --------------------------------------------------------------------------- cost -> dashboard


def test_a_closed_cost_month_emits_its_totals_and_links_its_report(tmp_path, run_dag, caplog):
    import json

    from tests.cost.helpers import three_months

    billing, owners = three_months(tmp_path)
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="seedance_tasks.dag"):
        dag_run = run_dag("seedance_cost_recovery", {"billing": str(billing), "owners": str(owners), "out": str(out),
                                                     "month": "2024-08", "basis": "BilledCost"})
    assert dag_run.state == "success"
    (event,) = _events("seedance_cost_statements", dag_run)
    summary = json.loads((out / "month=2024-08" / "summary.json").read_text())
    assert event.extra["month"] == "2024-08" and event.extra["basis"] == "BilledCost"
    assert event.extra["totals"] == {cur: entry["total"] for cur, entry in summary["currencies"].items()}
    assert event.extra["unallocated"] == {cur: e["unallocated"] for cur, e in summary["currencies"].items()}
    assert Path(event.extra["report"]) == out / "month=2024-08" / "report.html"
    assert Path(event.extra["report"]).is_file() and Path(event.extra["summary"]).is_file()
    assert f"report html: {event.extra['report']}" in caplog.text  # the task log links to the report


@pytest.mark.parametrize("extras, expected", [
    ([], []),
    ([{"targets": [{"dag_id": "seedance_preprocess", "conf": {}}]}], []),  # another DAG's fix: not ours
    ([{"targets": [{"dag_id": "seedance_compaction", "conf": {"uri": "/a"}}]}], [{"uri": "/a", "dry_run": True}]),
])
def test_compaction_reads_only_its_own_targets(extras, expected, airflow_db, dagbag):
    from seedance_tasks.compaction import airflow_tasks
    from seedance_tasks.compaction.settings import CompactionSettings

    events = [_register("seedance_signal_small_files", extra) for extra in extras]
    assert airflow_tasks.lakes_to_compact({}, CompactionSettings(), _as_triggering(events)) == expected
