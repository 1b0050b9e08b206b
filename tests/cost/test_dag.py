"""The DAG: parses cheaply, monthly data-interval schedule, and a backfill of three past months
run for real through Airflow (`dag.test()` with explicit logical dates)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from airflow.sdk import CronDataIntervalTimetable

from tests.conftest import xcom_value
from tests.cost.helpers import three_months

DAG_ID = "seedance_cost_recovery"


def test_dag_parses_with_monthly_data_interval_schedule(dagbag):
    assert not dagbag.import_errors
    dag = dagbag.dags[DAG_ID]
    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    assert [task.task_id for task in dag.topological_sort()] == [
        "prepare", "ingest", "allocate", "rules", "statements", "check", "report"]
    assert dag.max_active_runs == 1
    source = (Path(__file__).resolve().parents[2] / "dags" / "seedance_cost_recovery.py").read_text()
    for heavy in ("import pyarrow", "import duckdb", "import boto3", "import polars", "import pandas"):
        assert heavy not in source


def test_backfill_of_three_months_through_airflow(run_dag, tmp_path):
    billing, owners = three_months(tmp_path)
    out = tmp_path / "out"
    conf = {"billing": str(billing), "owners": str(owners), "out": str(out), "apply": True}
    expected = {"2024-07": "10.5", "2024-08": "20.25", "2024-09": "30.125"}
    for run_month in (8, 9, 10):  # scheduled at 03:00 on the 1st -> covers the month before
        dag_run = run_dag(DAG_ID, conf, logical_date=datetime(2024, run_month, 1, 3, tzinfo=UTC))
        assert dag_run.state == "success", dag_run.state
        job = xcom_value(dag_run, "prepare")
        assert job["backfill"] is True  # months long closed: no side effects
    for month, alpha in expected.items():
        summary = json.loads((out / f"month={month}" / "summary.json").read_text())
        usd = summary["currencies"]["USD"]
        assert usd["by_owner"] == {"alpha": alpha, "beta": "5"}
        assert usd["unallocated"] == "-1.5"
        assert sum(map(Decimal, usd["by_owner"].values())) + Decimal(usd["unallocated"]) == Decimal(usd["total"])
        assert summary["over_budget"][0]["owner"] == "alpha"
        assert (out / f"month={month}" / "allocations.parquet").is_file()
        assert (out / f"month={month}" / "statements" / "owner=alpha.csv").is_file()
        assert (out / f"month={month}" / "report.html").is_file()
    state = out / "_seedance" / "cost"
    assert not (state / "quota-ledger.json").exists()  # a backfill never freezes ...
    assert not (state / "outbox.jsonl").exists()  # ... nor notifies


def test_manual_month_param_and_rerun_is_identical(run_dag, tmp_path):
    billing, owners = three_months(tmp_path)
    out = tmp_path / "out"
    conf = {"billing": str(billing), "owners": str(owners), "out": str(out), "month": "2024-08",
            "basis": "BilledCost"}
    first = run_dag(DAG_ID, conf)
    assert first.state == "success"
    before = {p.relative_to(out): p.read_bytes() for p in (out / "month=2024-08").rglob("*") if p.is_file()}
    second = run_dag(DAG_ID, conf)
    assert second.state == "success"
    after = {p.relative_to(out): p.read_bytes() for p in (out / "month=2024-08").rglob("*") if p.is_file()}
    assert before == after and len(before) >= 5
    assert xcom_value(second, "report")["month"] == "2024-08"


def test_an_empty_month_warns_or_fails_the_check_task_as_config_says(run_dag, tmp_path, monkeypatch):
    billing, owners = three_months(tmp_path)
    out = tmp_path / "out"
    conf = {"billing": str(billing), "owners": str(owners), "out": str(out), "month": "2023-01"}
    warned = run_dag(DAG_ID, conf)
    assert warned.state == "success"
    assert xcom_value(warned, "check")["warnings"][0].startswith("no billing lines in 2023-01: 9 rows read")
    published = {p.name: p.read_bytes() for p in (out / "month=2023-01").rglob("*") if p.is_file()}
    assert "summary.json" in published

    monkeypatch.setenv("SEEDANCE__COST__FAIL_ON_EMPTY_MONTH", "true")
    failed = run_dag(DAG_ID, conf)
    assert failed.state == "failed"
    states = {ti.task_id: ti.state for ti in failed.get_task_instances()}
    assert states["check"] == "failed" and states["report"] == "upstream_failed"
    assert states["statements"] == "success"
    assert {p.name: p.read_bytes() for p in (out / "month=2023-01").rglob("*") if p.is_file()} == published
