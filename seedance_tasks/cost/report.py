"""The month's HTML report: cost by owner, by service, the unallocated trend, top idle resources.

Charts are inline SVG (no scripts, no network), and the page depends only on the summaries it
is given, so a re-run renders the same bytes.
"""

from __future__ import annotations

from decimal import Decimal
from html import escape
from typing import Any

from seedance_tasks.cost.money import fmt

_BAR = "#3b6ea8"
_NEG = "#b5473a"


def _money(value: Decimal) -> str:
    return f"{value:,.2f}"


def bar_chart(title: str, items: list[tuple[str, Decimal]], currency: str, width: int = 720) -> str:
    """A horizontal bar chart (inline SVG) of labelled amounts; negative amounts drawn red."""
    if not items:
        return f"<h3>{escape(title)}</h3><p class='none'>nothing to show</p>"
    row, label_w, value_w = 22, 220, 120
    scale = max(abs(value) for _, value in items) or Decimal(1)
    span = width - label_w - value_w
    parts = [f"<h3>{escape(title)}</h3>",
             f"<svg role='img' aria-label='{escape(title)}' width='{width}' height='{row * len(items) + 4}' "
             f"xmlns='http://www.w3.org/2000/svg'>"]
    for index, (label, value) in enumerate(items):
        y = index * row + 2
        length = int(abs(value) / scale * span)
        parts.append(f"<text x='{label_w - 6}' y='{y + 15}' text-anchor='end'>{escape(label[:34])}</text>")
        parts.append(f"<rect x='{label_w}' y='{y + 3}' width='{max(length, 1)}' height='{row - 6}' "
                     f"fill='{_NEG if value < 0 else _BAR}'><title>{escape(label)}: {fmt(value)} {currency}</title></rect>")
        parts.append(f"<text x='{label_w + length + 6}' y='{y + 15}'>{_money(value)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def render_report(summary: dict[str, Any], trend: list[dict[str, Any]]) -> str:
    """The report page for `summary`; `trend` is the summaries of up to 12 months ending with it."""
    month = summary["month"]
    sections = []
    for currency, entry in summary["currencies"].items():
        owners = sorted(((owner, Decimal(value)) for owner, value in entry["by_owner"].items()),
                        key=lambda item: (-item[1], item[0]))
        if Decimal(entry["unallocated"]):
            owners.append(("(unallocated)", Decimal(entry["unallocated"])))
        sections.append(
            f"<h2>{escape(currency)}</h2><p>Total ({escape(summary['basis'])}): <b>{_money(Decimal(entry['total']))}"
            f" {escape(currency)}</b> &middot; invoice (BilledCost): {_money(Decimal(entry['invoice_total']))} "
            f"&middot; unallocated: {_money(Decimal(entry['unallocated']))}</p>"
        )
        sections.append(bar_chart(f"Cost by owner ({currency})", owners[:25], currency))
        points = [(item["month"], Decimal(item["currencies"].get(currency, {}).get("unallocated", "0")))
                  for item in trend]
        sections.append(bar_chart(f"Unallocated by month ({currency})", points, currency))
    services = summary.get("by_service") or {}
    for currency, values in services.items():
        ranked = sorted(((name, Decimal(value)) for name, value in values.items()), key=lambda i: (-i[1], i[0]))
        sections.append(bar_chart(f"Cost by service ({currency}, top 15)", ranked[:15], currency))
    idle = summary.get("idle", [])[:15]
    if idle:
        rows = "".join(
            f"<tr><td>{escape(item['resource_id'])}</td><td>{escape(item.get('owner') or 'unallocated')}</td>"
            f"<td>{escape(', '.join(f'{v} {c}' for c, v in item.get('cost', {}).items()))}</td>"
            f"<td>{escape(item['max_cpu_percent'])}%</td></tr>"
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
            f"<tr><td>{escape(item['owner'])}</td><td>{item['spend']} {escape(item['currency'])}</td>"
            f"<td>{item['budget']}</td><td>+{item['over_percent']}%</td><td>{'yes' if item['approved'] else 'no'}</td></tr>"
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
        "body{font:14px system-ui,sans-serif;margin:2em;color:#222}svg text{font:12px system-ui,sans-serif}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
        ".none{color:#777}</style></head><body>"
        f"<h1>Cost recovery &mdash; {escape(month)}</h1>" + "".join(sections) + "</body></html>\n"
    )
