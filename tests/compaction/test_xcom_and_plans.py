"""What a DAG run leaves behind stays bounded: its XComs (a report of a lake of any number of
partitions fits an XCom: lists cut, figures whole) and its stored plans (purged with the trash)."""

from __future__ import annotations

import json
import os

import pytest

from seedance_tasks.compaction import airflow_tasks, run
from seedance_tasks.compaction.sample import make_sample_lake

HOLDER = "airflow:seedance_compaction:manual__xcom"


@pytest.fixture
def as_task(monkeypatch):
    monkeypatch.setattr(airflow_tasks, "airflow_lease_holder", lambda: HOLDER)


def _dag_run(lake, params: dict) -> tuple[dict, dict, dict]:
    """plan -> compact (each group) -> report -> purge, as the DAG runs them: (planned, report, purge)."""
    planned = airflow_tasks.plan_task({"uri": str(lake), **params})
    results = [airflow_tasks.compact_group_task(group) for group in planned["groups"]]
    report = airflow_tasks.report_task(planned, results)
    return planned, report, airflow_tasks.purge_task(params, report)


def test_a_dry_run_report_of_many_partitions_is_cut_for_the_xcom(tmp_path, as_task):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=130, files_per_partition=2, rows_per_file=5)
    planned = airflow_tasks.plan_task({"uri": str(lake), "min_age": "0", "dry_run": True})
    report = airflow_tasks.report_task(planned, [])
    assert report["partitions_compacted"] == 130 and report["files_before"] == 260  # figures whole
    assert len(report["partitions"]) == run.REPORT_LIST_LIMIT and report["omitted"] == {"partitions": 30}
    assert len(json.dumps(planned)) < 40_000 and len(json.dumps(report)) < 40_000


def test_a_compaction_report_is_cut_for_the_xcom_with_its_figures_whole(tmp_path, as_task, monkeypatch):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=4, files_per_partition=2, rows_per_file=50)
    monkeypatch.setattr(run, "REPORT_LIST_LIMIT", 3)
    _, report, _ = _dag_run(lake, {"min_age": "0", "target_file_size": "512KiB"})
    assert report["partitions_compacted"] == 4 and report["rows"] == 400 and report["files_before"] == 8
    assert len(report["partitions"]) == 3 and report["omitted"] == {"partitions": 1}
    assert "omitted" not in run.capped({"partitions": [1, 2, 3]})  # at the limit: as it is


def test_old_plans_are_purged_with_the_trash_and_the_runs_own_is_kept(tmp_path, as_task):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=2, files_per_partition=3, rows_per_file=50)
    plans = lake / "_seedance" / "plans"
    _, first, _ = _dag_run(lake, {"min_age": "0", "target_file_size": "512KiB", "purge_older_than": "7d"})
    assert os.listdir(plans) == [f"{first['run_id']}.json"]
    make_sample_lake(str(lake), partitions=2, files_per_partition=3, rows_per_file=50, seed=8)
    (plans / "notes.json").write_text("{}")  # not a plan of a run: not Seedance's to delete
    _, second, purge = _dag_run(lake, {"min_age": "0", "target_file_size": "512KiB", "purge_older_than": "0"})
    assert second["partitions_compacted"] == 2 and purge["plans_purged"] == 1
    assert sorted(os.listdir(plans)) == sorted([f"{second['run_id']}.json", "notes.json"])


def test_a_cli_run_purges_plans_older_than_the_trash_retention(tmp_path, small_settings):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=3, rows_per_file=50)
    plans = lake / "_seedance" / "plans"
    plans.mkdir(parents=True)
    (plans / "20200101T000000Z-abcdef.json").write_text("{}")
    report = run.compact_dataset(str(lake), small_settings)
    assert os.listdir(plans) == [f"{report['run_id']}.json"]
