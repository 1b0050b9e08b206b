"""A run triggered by small-files events names its lakes as the events spelled them: one lake
named twice (`lake`, `lake/`, `file:///…/lake`), or a partition of a lake named beside the lake,
is planned once. Two plans of one run over the same files would let two mapped tasks of one
lease holder rewrite them at the same time (their rows doubled)."""

from __future__ import annotations

from collections import namedtuple
from types import SimpleNamespace

import pendulum

from seedance_tasks.compaction import airflow_tasks
from seedance_tasks.compaction.sample import make_sample_lake

from .conftest import lake_digest

HOLDER = "airflow:seedance_compaction:asset_triggered__many"


def _events(*targets):
    extra = {"targets": [{"dag_id": "seedance_compaction", "conf": {"uri": uri, "dry_run": dry}}
                         for uri, dry in targets]}
    event = SimpleNamespace(timestamp=pendulum.now("UTC"), extra=extra)
    return {namedtuple("Asset", "name")("seedance_signal_small_files"): [event]}


def test_one_lake_named_several_ways_is_planned_once(tmp_path, monkeypatch):
    monkeypatch.setattr(airflow_tasks, "airflow_lease_holder", lambda: HOLDER)
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=2, files_per_partition=3, rows_per_file=100)
    digest = lake_digest(lake)
    events = _events((str(lake), False), (f"{lake}/", False), (f"file://{lake}", False),
                     (f"{lake}/date=2026-11-01", False), (f"{lake}/date=2026-11-02", True))
    planned = airflow_tasks.plan_task({"min_age": "0", "target_file_size": "512KiB"}, events)
    assert [one["uri"] for one in planned["lakes"]] == [str(lake)]
    assert sorted(index for group in planned["groups"] for index in group["indices"]) == [0, 1]
    assert not (lake / "date=2026-11-01" / "_seedance").exists()  # the partition was not planned as a lake
    results = [airflow_tasks.compact_group_task(group) for group in planned["groups"]]
    report = airflow_tasks.report_task(planned, results)
    assert report["partitions_compacted"] == 2 and lake_digest(lake) == digest


def test_lakes_side_by_side_are_all_planned(tmp_path, monkeypatch):
    monkeypatch.setattr(airflow_tasks, "airflow_lease_holder", lambda: HOLDER)
    first, second = tmp_path / "lake", tmp_path / "lake2"  # a common prefix is not nesting
    for lake in (first, second):
        make_sample_lake(str(lake), partitions=1, files_per_partition=3, rows_per_file=100)
    lakes = airflow_tasks.lakes_to_compact({}, None, _events((str(first), False), (str(second), False)))
    assert [lake["uri"] for lake in lakes] == [str(first), str(second)]
