"""The budget pools view: what the cost actions workflow deducted and froze, per owner and month.

Reads the budget ledger of a chargeback output root (`OUT/_seedance/cost/budget-ledger.json`,
see `cost.budget_ledger`); amounts are the ledger's Decimals, shown by `svg.money` (the currency's
minor unit, with its code). A tampered or malformed ledger is shown as an error, never half-read.
"""

from __future__ import annotations

from seedance_tasks.dashboard.svg import escape
from seedance_tasks.errors import SeedanceError


def budget_section(uri: str) -> str:
    """The HTML section: one row per owner, month and currency (answer, deducted, frozen budget)."""
    from seedance_tasks.cost.actions import owner_positions
    from seedance_tasks.dashboard.pages import amount, error_box, table

    parts = ["<h3>Budget pools: deductions and freezes</h3>"]
    try:
        rows = owner_positions(uri)
    except (SeedanceError, OSError, ValueError) as exc:
        return "".join(parts) + error_box(f"budget ledger: {exc}")
    parts.append(table(
        ["owner", "month", "answer", "deducted", "budget frozen"],
        [[row["owner"], row["month"], row["answer"] or "—",
          "—" if row["deducted"] is None else amount(row["deducted"], row["currency"], owner=row["owner"],
                                                      deduction=row["month"]),
          row["frozen"] or "—"] for row in rows],
        "No deduction or freeze recorded yet (seedance_cost_actions settles on the 5th working day).",
        numeric=(3,)))
    return "".join(parts).replace("<h3>", f"<h3 data-root='{escape(uri, quote=True)}'>", 1)
