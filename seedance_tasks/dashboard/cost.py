"""The cost view: what the cost pipeline published for each closed month, over the last 12.

Reads `OUT/month=YYYY-MM/summary.json` (owners' totals, unallocated, idle and over-budget
findings; see `cost.recover.statements_stage`) of a chargeback output root. Amounts stay the
Decimal strings the pipeline wrote; nothing is re-allocated here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from seedance_tasks.dashboard.reading import MAX_SUMMARY_BYTES, read_root_file

MONTH_DIR = re.compile(r"month=(\d{4}-(?:0[1-9]|1[0-2]))")  # a real month: month=2024-13 is no month
WINDOW = 12
TOP_OWNERS = 8  # owners drawn by name in the stacked chart; the rest are "(other owners)"
OTHER = "(other owners)"
UNALLOCATED = "(unallocated)"


@dataclass
class CurrencyView:
    """One currency over the window: per owner per month, totals, unallocated share, movers."""

    currency: str
    months: list[str]
    by_owner: dict[str, list[Decimal | None]]  # owner -> amount per month (None: month has no data)
    totals: list[Decimal | None]
    unallocated: list[Decimal | None]
    movers: list[dict[str, Any]] = field(default_factory=list)  # latest month against the one before

    def share(self, index: int) -> Decimal | None:
        """Unallocated as a percentage of the month's total (None without data or total)."""
        total, unallocated = self.totals[index], self.unallocated[index]
        if total is None or unallocated is None or not total:
            return None
        return unallocated / total * 100

    def chart_series(self) -> list[tuple[str, list[Decimal | None]]]:
        """The top owners by the window's total |amount|, the rest summed as "(other owners)", then unallocated."""
        weight = {owner: sum(abs(v or 0) for v in values) for owner, values in self.by_owner.items()}
        ranked = sorted((owner for owner in self.by_owner if weight[owner]), key=lambda owner: (-weight[owner], owner))
        series = [(owner, self.by_owner[owner]) for owner in ranked[:TOP_OWNERS]]
        rest = ranked[TOP_OWNERS:]
        if rest:
            series.append((OTHER, [None if self.totals[i] is None else
                                   sum((self.by_owner[o][i] or Decimal(0) for o in rest), Decimal(0))
                                   for i in range(len(self.months))]))
        if any(self.unallocated):
            series.append((UNALLOCATED, self.unallocated))
        return series


@dataclass
class CostView:
    """One chargeback output root: its months, per-currency views, and the latest month's findings."""

    uri: str
    months: list[str]  # the window: consecutive closed months, oldest first
    published: list[str]  # months in the window that have a summary
    summaries: dict[str, dict[str, Any]]
    currencies: list[CurrencyView]
    empty_months: list[str]  # published months without any billing line
    open_months: list[str]  # published months not closed yet (not shown in the window)
    errors: list[str] = field(default_factory=list)

    @property
    def latest(self) -> dict[str, Any] | None:
        return self.summaries[self.published[-1]] if self.published else None


def _month_index(month: str) -> int:
    year, number = month.split("-")
    return int(year) * 12 + int(number) - 1


def _month_name(index: int) -> str:
    return f"{index // 12:04d}-{index % 12 + 1:02d}"


def published_months(root) -> list[str]:
    """Months under the output root `root` (a storage.Location) that have a published summary.json."""
    import pyarrow.fs as pafs

    from seedance_tasks import storage

    months = []
    for info in root.fs.get_file_info(pafs.FileSelector(root.path, allow_not_found=True)):
        match = MONTH_DIR.fullmatch(info.base_name)
        if info.type == pafs.FileType.Directory and match and storage.is_file(root.fs, f"{info.path}/summary.json"):
            months.append(match.group(1))
    return sorted(months)


def cost_view(uri: str, now: datetime | None = None) -> CostView:
    """The last 12 closed months published under `uri` (ending at the latest one), per currency."""
    from seedance_tasks import storage

    root = storage.resolve(uri)
    current = (now or datetime.now(UTC)).strftime("%Y-%m")
    months = published_months(root)
    closed = [month for month in months if month < current]
    open_months = [month for month in months if month >= current]
    if not closed:
        return CostView(root.uri, [], [], {}, [], [], open_months)
    last = _month_index(closed[-1])
    first = max(last - WINDOW + 1, _month_index(closed[0]))
    window = [_month_name(index) for index in range(first, last + 1)]
    summaries, errors = {}, []
    for month in window:
        if month in closed:
            try:
                raw = read_root_file(root, f"month={month}/summary.json", MAX_SUMMARY_BYTES)
                summaries[month] = check_summary(json.loads(raw))
            except (OSError, ValueError) as exc:
                errors.append(f"error: {root.uri_of(root.join(f'month={month}', 'summary.json'))}: not shown, "
                              f"unreadable or not a month summary ({str(exc)[:300]}) hint: publish the month again "
                              f"(trigger seedance_cost_recovery with month={month}); the other months are shown")
    published = [month for month in window if month in summaries]
    empty = [month for month in published if not summaries[month].get("lines")]
    return CostView(root.uri, window, published, summaries, _currencies(window, summaries), empty, open_months,
                    errors)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} is not a JSON object")
    return value


def _objects(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ValueError(f"{where} is not a list of JSON objects")
    return value


def _amount(value: Any, where: str) -> None:
    from seedance_tasks.cost.money import parse_amount

    try:
        parse_amount(value)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def check_summary(summary: Any) -> dict[str, Any]:
    """`summary` (a month's summary.json, read back: untrusted) if the cost page can show all of it:
    every amount it shows is one `money.parse_amount` reads (finite, |amount| < 10**18), every
    currency a string; else ValueError naming the first field that is not."""
    _object(summary, "the document")
    for currency, entry in _object(summary.get("currencies", {}), "currencies").items():
        entry = _object(entry, f"currencies.{currency}")
        for value in _object(entry.get("by_owner", {}), f"currencies.{currency}.by_owner").values():
            _amount(value, f"currencies.{currency}.by_owner")
        for key in ("total", "unallocated"):
            _amount(entry.get(key, "0"), f"currencies.{currency}.{key}")
    for index, item in enumerate(_objects(summary.get("idle", []), "idle")):
        for value in _object(item.get("cost") or {}, f"idle[{index}].cost").values():
            _amount(value, f"idle[{index}].cost")
    for index, item in enumerate(_objects(summary.get("over_budget", []), "over_budget")):
        for key in ("spend", "budget"):
            _amount(item.get(key), f"over_budget[{index}].{key}")
        if not isinstance(item.get("currency"), str | None):
            raise ValueError(f"over_budget[{index}].currency is not a currency code")
        if not isinstance(item.get("approved", False), bool):  # "false" would read as approved
            raise ValueError(f"over_budget[{index}].approved is not true or false")
    return summary


def _currencies(window: list[str], summaries: dict[str, dict[str, Any]]) -> list[CurrencyView]:
    names = sorted({currency for summary in summaries.values() for currency in summary.get("currencies", {})})
    views = []
    for currency in names:
        owners = sorted({owner for summary in summaries.values()
                         for owner in summary.get("currencies", {}).get(currency, {}).get("by_owner", {})})
        by_owner: dict[str, list[Decimal | None]] = {owner: [] for owner in owners}
        totals: list[Decimal | None] = []
        unallocated: list[Decimal | None] = []
        for month in window:
            summary = summaries.get(month)
            entry = None if summary is None else summary.get("currencies", {}).get(currency, {})
            for owner in owners:
                by_owner[owner].append(None if entry is None else Decimal(entry.get("by_owner", {}).get(owner, "0")))
            totals.append(None if entry is None else Decimal(entry.get("total", "0")))
            unallocated.append(None if entry is None else Decimal(entry.get("unallocated", "0")))
        view = CurrencyView(currency, window, by_owner, totals, unallocated)
        view.movers = _movers(view)
        views.append(view)
    return views


def _movers(view: CurrencyView, limit: int = 10) -> list[dict[str, Any]]:
    """Owners whose amount changed most between the last two months with data (largest |change| first)."""
    with_data = [index for index, total in enumerate(view.totals) if total is not None]
    if len(with_data) < 2:
        return []
    before, after = with_data[-2], with_data[-1]
    rows = []
    for owner, values in [*view.by_owner.items(), (UNALLOCATED, view.unallocated)]:
        old, new = values[before] or Decimal(0), values[after] or Decimal(0)
        if old != new:
            rows.append({"owner": owner, "before": old, "after": new, "change": new - old,
                         "percent": None if not old else (new - old) / abs(old) * 100,
                         "from": view.months[before], "to": view.months[after]})
    rows.sort(key=lambda row: (-abs(row["change"]), row["owner"]))
    return rows[:limit]
