"""The month's HTML report: cost by owner, by service, the unallocated trend, top idle resources.

Charts are inline SVG (no scripts, no network), and the page depends only on the summaries it
is given, so a re-run renders the same bytes.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from seedance_tasks.cost.money import display
from seedance_tasks.dashboard.svg import escape, hbars

TOP = 25  # owners, services and idle resources drawn per chart


def _ranked(values: dict[str, str], top: int = TOP) -> tuple[list[tuple[str, Decimal]], int, int]:
    """The `top` non-zero amounts by size (negative ones included), largest first; and how many
    were zero and how many more were left out."""
    items = [(name, Decimal(value)) for name, value in values.items()]
    nonzero = [item for item in items if item[1]]
    shown = sorted(nonzero, key=lambda item: (-abs(item[1]), item[0]))[:top]
    return sorted(shown, key=lambda item: (-item[1], item[0])), len(items) - len(nonzero), len(nonzero) - len(shown)


def _over(finding: dict[str, Any]) -> str:
    """An over-budget finding's excess: `+12.5%`, or a dash for a zero budget (no percentage of it)."""
    return "\u2014" if finding.get("over_percent") is None else f"+{finding['over_percent']}%"


def bar_chart(title: str, items: list[tuple[str, Decimal]], currency: str, *, zero: int = 0, more: int = 0) -> str:
    """A titled horizontal bar chart (inline SVG) of labelled amounts, negatives left of the axis in red;
    a note says how many zero amounts and how many smaller ones are not drawn."""
    notes = []
    if zero:
        notes.append(f"{zero:,} at {display(0, currency)} not shown")
    if more:
        notes.append(f"{more:,} smaller ones not shown")
    note = f"<p class='none'>{escape('; '.join(notes))}.</p>" if notes else ""
    return f"<h3>{escape(title)}</h3>" + hbars(title, items, lambda value: display(value, currency)) + note


def render_report(summary: dict[str, Any], trend: list[dict[str, Any]]) -> str:
    """The report page for `summary`; `trend` is the summaries of up to 12 months ending with it.

    Money is shown by `cost.money.display` (half-up to the currency's minor unit, with its code);
    owners at zero are counted, not drawn; negative amounts (credits) are drawn left of the axis;
    an empty month says so.
    """
    month = summary["month"]
    sections = []
    if not summary.get("lines") or not summary["currencies"]:
        warnings = "".join(f"<li>{escape(warning)}</li>" for warning in summary.get("warnings", []))
        sections.append(f"<p class='empty'><b>No billing lines in {escape(month)}</b>: nothing was charged back "
                        f"this month.</p>" + (f"<ul>{warnings}</ul>" if warnings else ""))
    for currency, entry in summary["currencies"].items():
        by_owner = dict(entry["by_owner"])
        if Decimal(entry["unallocated"]):
            by_owner["(unallocated)"] = entry["unallocated"]
        owners, zero, more = _ranked(by_owner)
        sections.append(
            f"<h2>{escape(currency)}</h2><p>Total ({escape(summary['basis'])}): "
            f"<b>{escape(display(Decimal(entry['total']), currency))}</b> &middot; invoice (BilledCost): "
            f"{escape(display(Decimal(entry['invoice_total']), currency))} &middot; unallocated: "
            f"{escape(display(Decimal(entry['unallocated']), currency))}</p>"
        )
        sections.append(bar_chart(f"Cost by owner ({currency})", owners, currency, zero=zero, more=more))
        points = [(item["month"], Decimal(item["currencies"].get(currency, {}).get("unallocated", "0")))
                  for item in trend]
        sections.append(bar_chart(f"Unallocated by month ({currency})", points, currency))
    services = summary.get("by_service") or {}
    for currency, values in services.items():
        ranked, zero, more = _ranked(values, 15)
        sections.append(bar_chart(f"Cost by service ({currency}, top 15)", ranked, currency, zero=zero, more=more))
    idle = summary.get("idle", [])[:15]
    if idle:
        rows = "".join(
            f"<tr><td>{escape(item['resource_id'])}</td><td>{escape(item.get('owner') or 'unallocated')}</td>"
            f"<td>{escape(', '.join(display(Decimal(v), c) for c, v in item.get('cost', {}).items()))}</td>"
            f"<td>{escape(str(item['max_cpu_percent']))}%</td></tr>"
            for item in idle
        )
        sections.append("<h2>Top idle resources</h2><table><tr><th>resource</th><th>owner</th><th>cost</th>"
                        f"<th>max CPU</th></tr>{rows}</table>")
        first = next(iter(summary["currencies"]), "USD")
        sections.append(bar_chart("Idle resources by cost", [
            (item["resource_id"].rsplit("/", 1)[-1], Decimal(item.get("cost", {}).get(first, "0"))) for item in idle
        ], first))
    else:
        sections.append("<h2>Top idle resources</h2><p class='none'>none found (or no utilization data)</p>")
    if summary.get("over_budget"):
        rows = "".join(
            f"<tr><td>{escape(item['owner'])}</td><td>{escape(display(Decimal(item['spend']), item['currency']))}</td>"
            f"<td>{escape(display(Decimal(item['budget']), item['currency']))}</td>"
            f"<td>{escape(_over(item))}</td><td>{'yes' if item['approved'] is True else 'no'}</td></tr>"
            for item in summary["over_budget"]
        )
        sections.append("<h2>Over budget</h2><table><tr><th>owner</th><th>spend</th><th>budget</th><th>over</th>"
                        f"<th>approved</th></tr>{rows}</table>")
    rejected = summary.get("rejected_count", 0)
    sections.append(f"<p>{summary['lines']:,} lines in {escape(month)}; {rejected:,} rejected; "
                    f"{summary['tag_conflicts']['count']:,} with conflicting owner tags.</p>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>Seedance cost recovery {escape(month)}</title><style>"
        "body{font:14px system-ui,sans-serif;margin:2em;color:#222}svg{max-width:100%;height:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;"
        "overflow-wrap:anywhere;max-width:30em}.none{color:#777}"
        ".empty{background:#fff8e1;border:1px solid #e6d28a;padding:.5em .8em}</style></head><body>"
        f"<h1>Cost recovery &mdash; {escape(month)}</h1>" + "".join(sections) + "</body></html>\n"
    )
