"""Owner statements: the CSV files people open in a spreadsheet, safe to open there.

A text cell that a spreadsheet would run as a formula (`=HYPERLINK(...)`, `+cmd|...`, `-1+2`,
`@SUM(...)`, or one starting with a tab, CR or LF) is written with a leading single quote, as
OWASP recommends for CSV injection; numbers are written as numbers.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from decimal import Decimal

from seedance_tasks.cost.money import fmt

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")
"""What makes a spreadsheet read a cell as a formula (OWASP's list, plus LF and the full-width forms)."""


def safe_text(value: str | None) -> str:
    """`value` as a CSV text cell that no spreadsheet runs: a formula-like start gets a `'` prefix."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def write_csv(header: Sequence[str], rows: Iterable[Sequence[str | int | Decimal | None]]) -> bytes:
    """A CSV document for people: text cells through `safe_text`, ints and Decimals as numbers."""
    buffer = io.StringIO()
    out = csv.writer(buffer, lineterminator="\n")
    out.writerow([safe_text(name) for name in header])
    for row in rows:
        out.writerow([
            cell if isinstance(cell, int) else fmt(cell) if isinstance(cell, Decimal) else safe_text(cell)
            for cell in row
        ])
    return buffer.getvalue().encode()


def statement(month: str, owner: str | None, basis: str, rows: list[tuple[tuple, list]]) -> bytes:
    """One owner's statement: a line per (currency, service, attribution, method), then a TOTAL per currency.

    `rows` are ((owner, currency, service, attributed_by, method), [cost, billed, lines]).
    """
    name = owner or "unallocated"
    lines: list[list] = []
    totals: dict[str, list] = {}
    for key, (cost, billed, count) in rows:
        lines.append([month, name, key[1], key[2] or "", key[3] or "", key[4] or "", count, cost, billed])
        entry = totals.setdefault(key[1], [Decimal(0), Decimal(0), 0])
        entry[0] += cost
        entry[1] += billed
        entry[2] += count
    for currency, (cost, billed, count) in sorted(totals.items()):
        lines.append([month, name, currency, "TOTAL", "", "", count, cost, billed])
    header = ["month", "owner", "currency", "service", "attributed_by", "allocation_method", "lines",
              f"charged_{basis}", "invoice_BilledCost"]
    return write_csv(header, lines)
