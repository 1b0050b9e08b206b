"""Savings per pipeline per month, from the reports the pipelines' runs wrote (their `report` XCom).

Figures are taken from each report as it is: compaction's `estimated_monthly_saving`
(S3 requests and USD a month), the checkpoint store's raw and stored bytes, the lifecycle pass's
GC (`bytes_freed`), tiering (`moved`) and `monthly_usd_saved`. The one figure a report does not
carry, the dollars a month of checkpoint compression saves, is the saved bytes at the configured
hot-tier price (`lifecycle.prices`) and is marked as an estimate. A dry run saves nothing.
A report is untrusted: a figure in it that is not a number is left out and named (run, key, value)
in the result's errors; the other figures and reports are summed as usual.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

PIPELINES = {  # dag_id -> label
    "seedance_compaction": "compaction",
    "seedance_checkpoints": "checkpoint compression",
    "seedance_checkpoint_lifecycle": "lifecycle GC + tiering",
}
MAX_DIGITS = 24  # a figure of this many digits or more is no saving (and `1e999999999` would not fit in memory)


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
    unreadable: int = 0  # figures of these runs left out (not numbers); each is named in the result's "errors"
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


class UnreadableFigure(ValueError):
    """A report figure that is not a finite number (a whole one for counts and bytes): its dotted key
    and the value found there."""

    def __init__(self, key: str, value: Any, expected: str = "a number"):
        super().__init__(f"{key} is {_shown(value)}, not {expected}")
        self.key, self.value = key, value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _number(report: dict[str, Any], key: str, *, whole: bool) -> Any:
    """The figure at dotted `key` of `report` as a Decimal (an int if `whole`), 0 where the key is
    absent or null; UnreadableFigure naming the key where it holds anything but a finite number."""
    value: Any = report
    walked = []
    for part in key.split("."):
        if not isinstance(value, dict):
            raise UnreadableFigure(".".join(walked), value, "a mapping")
        walked.append(part)
        value = value.get(part)
        if value is None:
            return 0 if whole else Decimal(0)
    expected = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise UnreadableFigure(key, value, expected)
    try:
        number = Decimal(value.strip() if isinstance(value, str) else str(value) if isinstance(value, float) else value)
    except (InvalidOperation, ValueError):
        raise UnreadableFigure(key, value, expected) from None
    if (not number.is_finite() or number and number.adjusted() >= MAX_DIGITS
            or (whole and number != number.to_integral_value())):
        raise UnreadableFigure(key, value, expected)
    return int(number) if whole else number


def figures(dag_id: str, report: dict[str, Any], hot_price=None) -> dict[str, Any] | None:
    """The saving figures of one report (None for a dry run or a report that saved nothing). A figure
    the report does not hold as a number is left out, its UnreadableFigure listed under
    "unreadable"; the report's other figures are kept."""
    found: dict[str, Any] = {}
    unreadable: list[UnreadableFigure] = []

    def take(name: str, compute) -> None:
        try:
            found[name] = compute()
        except UnreadableFigure as exc:
            if all(exc.key != seen.key for seen in unreadable):  # two figures under one damaged mapping: named once
                unreadable.append(exc)

    if dag_id == "seedance_compaction":
        if report.get("dry_run") or not report.get("partitions_compacted"):
            return None
        take("usd", lambda: _number(report, "estimated_monthly_saving.usd", whole=False))
        take("requests", lambda: _number(report, "estimated_monthly_saving.s3_requests", whole=True))
        take("bytes_saved", lambda: _number(report, "bytes_before", whole=True) - _number(report, "bytes_after", whole=True))
    elif dag_id == "seedance_checkpoints":
        if not report.get("raw_bytes"):
            return None
        take("bytes_saved", lambda: _number(report, "raw_bytes", whole=True) - _number(report, "stored_bytes", whole=True))
        if "bytes_saved" in found:
            found.update(usd=hot_price(found["bytes_saved"]) if hot_price else Decimal(0), usd_estimated=True)
    elif dag_id == "seedance_checkpoint_lifecycle":
        if not report.get("applied"):
            return None
        take("usd", lambda: _number(report, "monthly_usd_saved", whole=False))
        take("bytes_saved", lambda: _number(report, "bytes_freed", whole=True))
        take("moved", lambda: _number(report, "moved", whole=True))
    else:
        return None
    return {**found, "unreadable": unreadable}


def savings(reports: list[RunReport]) -> dict[str, Any]:
    """{"months": [...], "rows": [Saving...] by pipeline then month, "totals": {month: Decimal},
    "errors": [...]}: a report figure that is not a number is left out of its row, and named in
    "errors" (DAG, run, key and value); every other figure is summed as usual."""
    hot_price = _hot_price() if any(r.dag_id == "seedance_checkpoints" for r in reports) else None
    table: dict[tuple[str, str], Saving] = {}
    errors = []
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
        entry.unreadable += len(found["unreadable"])
        errors += [f"{run.dag_id} run {run.run_id} (its `report` XCom): {exc}; that figure is left out of "
                   f"{label} {month}" for exc in found["unreadable"]]
    months = sorted({month for _, month in table})[-12:]
    rows = [table[key] for key in sorted(table) if key[1] in months]
    totals = {month: sum((row.usd for row in rows if row.month == month), Decimal(0)) for month in months}
    return {"months": months, "rows": rows, "totals": totals, "errors": errors}
