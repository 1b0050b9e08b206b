"""Savings per pipeline per month, from the reports the pipelines' runs wrote (their `report` XCom).

Figures are taken from each report as it is: compaction's `estimated_monthly_saving`
(S3 requests and USD a month), the checkpoint store's raw and stored bytes, the lifecycle pass's
GC (`bytes_freed`), tiering (`moved`) and `monthly_usd_saved`. The one figure a report does not
carry, the dollars a month of checkpoint compression saves, is the saved bytes at the configured
hot-tier price (`lifecycle.prices`) and is marked as an estimate. A dry run saves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

PIPELINES = {  # dag_id -> label
    "seedance_compaction": "compaction",
    "seedance_checkpoints": "checkpoint compression",
    "seedance_checkpoint_lifecycle": "lifecycle GC + tiering",
}


@dataclass(frozen=True)
class RunReport:
    """The report one successful DAG run wrote, and when the run ended."""

    dag_id: str
    run_id: str
    ended: datetime
    report: dict[str, Any]


@dataclass
class Saving:
    """What one pipeline saved in one month (sums over that month's runs)."""

    pipeline: str
    month: str
    runs: int = 0
    usd: Decimal = Decimal(0)
    usd_estimated: bool = False
    requests: int = 0
    bytes_saved: int = 0
    moved: int = 0
    run_ids: list[str] = field(default_factory=list)


def _hot_price():
    """USD per GiB-month of the hot tier (None if the lifecycle settings cannot be read)."""
    from seedance_tasks.errors import SeedanceError

    try:
        from seedance_tasks.lifecycle import costs
        from seedance_tasks.lifecycle.gc import load_lifecycle_settings

        settings = load_lifecycle_settings()
        return lambda num_bytes: costs.monthly(num_bytes, settings.tiers.spec("hot").price_key(), settings)
    except (SeedanceError, KeyError, AttributeError):
        return None


def figures(dag_id: str, report: dict[str, Any], hot_price=None) -> dict[str, Any] | None:
    """The saving figures of one report (None for a dry run or a report that saved nothing)."""
    if dag_id == "seedance_compaction":
        if report.get("dry_run") or not report.get("partitions_compacted"):
            return None
        saving = report.get("estimated_monthly_saving") or {}
        return {"usd": Decimal(str(saving.get("usd", "0"))), "requests": int(saving.get("s3_requests", 0)),
                "bytes_saved": int((report.get("bytes_before") or 0) - (report.get("bytes_after") or 0))}
    if dag_id == "seedance_checkpoints":
        saved = int(report.get("raw_bytes") or 0) - int(report.get("stored_bytes") or 0)
        if not report.get("raw_bytes"):
            return None
        usd = hot_price(saved) if hot_price else Decimal(0)
        return {"usd": usd, "usd_estimated": True, "bytes_saved": saved}
    if dag_id == "seedance_checkpoint_lifecycle":
        if not report.get("applied"):
            return None
        return {"usd": Decimal(str(report.get("monthly_usd_saved", "0"))), "bytes_saved": int(report.get("bytes_freed") or 0),
                "moved": int(report.get("moved") or 0)}
    return None


def savings(reports: list[RunReport]) -> dict[str, Any]:
    """{"months": [...], "rows": [Saving...] by pipeline then month, "totals": {month: Decimal}}."""
    hot_price = _hot_price() if any(r.dag_id == "seedance_checkpoints" for r in reports) else None
    table: dict[tuple[str, str], Saving] = {}
    for run in sorted(reports, key=lambda r: (r.ended, r.run_id)):
        found = figures(run.dag_id, run.report, hot_price)
        if found is None:
            continue
        month = run.ended.strftime("%Y-%m")
        label = PIPELINES[run.dag_id]
        entry = table.setdefault((label, month), Saving(label, month))
        entry.runs += 1
        entry.usd += found.get("usd", Decimal(0))
        entry.usd_estimated = entry.usd_estimated or found.get("usd_estimated", False)
        entry.requests += found.get("requests", 0)
        entry.bytes_saved += found.get("bytes_saved", 0)
        entry.moved += found.get("moved", 0)
        entry.run_ids.append(run.run_id)
    months = sorted({month for _, month in table})[-12:]
    rows = [table[key] for key in sorted(table) if key[1] in months]
    totals = {month: sum((row.usd for row in rows if row.month == month), Decimal(0)) for month in months}
    return {"months": months, "rows": rows, "totals": totals}
