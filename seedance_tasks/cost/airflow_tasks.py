"""The cost DAG's task bodies: read params and context, call one stage, return a small summary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any


def month_of_run(params: dict[str, Any], context: dict[str, Any]) -> str:
    """The month a run covers: the `month` param if set; else the data interval's (scheduled runs
    and backfills cover the previous month); else the month before the run's `run_after`."""
    if params.get("month"):
        return params["month"]
    start = context.get("data_interval_start")
    if start is not None:
        return start.astimezone(UTC).strftime("%Y-%m")
    run_after = getattr(context.get("dag_run"), "run_after", None) or datetime.now(UTC)
    first = run_after.astimezone(UTC).replace(day=1)
    return (first - timedelta(days=1)).strftime("%Y-%m")


def prepare_task(params: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """Describe the run (a Job dict): a backfill DAG run is always in backfill mode."""
    from seedance_tasks.cost import recover

    dag_run = context.get("dag_run")
    run_type = str(getattr(dag_run, "run_type", "") or "")
    backfill = params.get("backfill")
    if run_type.endswith("backfill"):
        backfill = True
    return recover.prepare(
        month=month_of_run(params, context),
        billing=params.get("billing") or None,
        out=params.get("out") or None,
        owners=params.get("owners") or None,
        format=params.get("format") or "focus",
        basis=params.get("basis") or None,
        apply=bool(params.get("apply")),
        backfill=backfill,
        utilization=params.get("utilization") or None,
        currency=params.get("currency") or None,
        refresh=bool(params.get("refresh")),
        run_key=context.get("run_id") or None,
    )
