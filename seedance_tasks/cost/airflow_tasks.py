"""The cost DAG's task bodies: read params and context, call one stage, return a small summary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from seedance_tasks.dag_support import airflow_lease_holder, fail_fast, run_type_of


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


@fail_fast
def prepare_task(params: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """Describe the run (a Job dict): a backfill DAG run is always in backfill mode."""
    from seedance_tasks.config import load_section
    from seedance_tasks.cost import recover
    from seedance_tasks.dag_support import skip

    settings = load_section("cost")
    missing = [what for what, param, key in (("billing source", "billing", "billing_uri"),
                                              ("output root", "out", "out_uri"))
               if not (params.get(param) or getattr(settings, key))]
    if missing:
        skip(f"no {' and no '.join(missing)} configured: set the billing/out params, or cost.billing_uri and "
             "cost.out_uri in config/seedance.yaml")
    backfill = params.get("backfill")
    if run_type_of(context.get("dag_run")) == "backfill":
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
        holder=airflow_lease_holder(),
        release=False,
    )


@fail_fast
def stage_task(stage: str, job: dict[str, Any]) -> dict[str, Any]:
    """Run one recovery stage of `job` (`ingest`, `allocate`, `rules`, `statements`, `check` or `report`)
    under the month's lease, held by this DAG run (every task and retry of it); the report releases it.
    Returns the stage's summary with its lists capped (`recover.xcom_summary`: the rest in the log)."""
    from seedance_tasks.cost import recover

    result = recover.run_stage(stage, {**job, "holder": airflow_lease_holder()}, release=stage == "report")
    return recover.xcom_summary(result, f"{stage} {job.get('month')}")


@fail_fast
def report_task(job: dict[str, Any], asset=None) -> dict[str, Any]:
    """The `report` stage (render, then publish the month); the event on `asset` carries the
    closed month: month, basis, totals and unallocated per currency, URIs of its outputs, and the
    owners charged (the first `recover.XCOM_LIST_LIMIT`; `owners_count` of them; all in the log)."""
    from seedance_tasks import storage
    from seedance_tasks.cost import recover
    from seedance_tasks.dag_support import announce

    result = stage_task.__wrapped__("report", job)
    folder = storage.resolve(result["out"])
    summary_path = folder.join("summary.json")
    summary = storage.read_json(folder.fs, summary_path) if storage.is_file(folder.fs, summary_path) else {}
    currencies = summary.get("currencies", {})
    extra = {
        "month": result["month"], "basis": summary.get("basis"), "out": result["out"],
        "summary": folder.uri_of(summary_path), "report": folder.uri_of(folder.join("report.html")),
        "totals": {currency: entry["total"] for currency, entry in currencies.items()},
        "unallocated": {currency: entry["unallocated"] for currency, entry in currencies.items()},
        "owners": sorted({owner for entry in currencies.values() for owner in entry.get("by_owner", {})}),
        "backfill": bool(job.get("backfill")),
    }
    extra = {**recover.xcom_summary(extra, f"report {result['month']}"), "owners_count": len(extra["owners"])}
    if asset is not None:
        announce(asset, extra, reports={"html": extra["report"], "summary": extra["summary"]})
    return {**result, "event": extra}
