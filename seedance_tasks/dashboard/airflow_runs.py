"""What Airflow knows: the last run of each Seedance DAG, and the reports of successful runs.

Read-only queries on the metadata DB through Airflow's own session; only the API server (where
the plugin runs) and code outside tasks may call these (tasks have no DB access in Airflow 3).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from seedance_tasks.dashboard.savings import RunReport

DAG_PREFIX = "seedance_"
REPORT_TASK = "report"
REPORTS_PER_DAG = 400  # about a year of nightly runs


def last_runs() -> list[dict[str, Any]]:
    """One row per Seedance DAG known to Airflow: its last run (by run_after), state and times."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    rows = []
    with create_session() as session:
        dags = (session.query(DagModel.dag_id, DagModel.is_paused)
                .filter(DagModel.dag_id.like(f"{DAG_PREFIX}%")).order_by(DagModel.dag_id).all())
        for dag_id, paused in dags:
            run = (session.query(DagRun).filter(DagRun.dag_id == dag_id)
                   .order_by(DagRun.run_after.desc(), DagRun.id.desc()).first())
            rows.append({
                "dag_id": dag_id, "paused": bool(paused),
                "run_id": run.run_id if run else None,
                "state": str(run.state.value if hasattr(run.state, "value") else run.state) if run else None,
                "run_type": str(getattr(run.run_type, "value", run.run_type)) if run else None,
                "started": run.start_date if run else None,
                "ended": run.end_date if run else None,
            })
    return rows


def report_runs(dag_ids: list[str]) -> list[RunReport]:
    """The `report` task's XCom of each successful run of `dag_ids` (newest REPORTS_PER_DAG each)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    found = []
    with create_session() as session:
        for dag_id in dag_ids:
            rows = (session.query(DagRun.run_id, DagRun.end_date, XComModel)
                    .join(XComModel, XComModel.dag_run_id == DagRun.id)
                    .filter(DagRun.dag_id == dag_id, DagRun.state == "success", XComModel.task_id == REPORT_TASK,
                            XComModel.key == "return_value", XComModel.map_index == -1)
                    .order_by(DagRun.end_date.desc()).limit(REPORTS_PER_DAG).all())
            for run_id, ended, xcom in rows:
                value = XComModel.deserialize_value(xcom)
                if isinstance(value, dict):
                    when = ended or xcom.timestamp or datetime.now(UTC)
                    found.append(RunReport(dag_id, run_id, when.astimezone(UTC), value))
    return found
