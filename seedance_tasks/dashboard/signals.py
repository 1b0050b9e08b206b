"""The open findings of the cost signals pipeline, as its latest audited night left them.

Read-only, through the signals pipeline's own reader (`signals.audit.open_findings`) of the
findings files it writes under `signals.root` (`nights/<date>/findings.json`); nothing is
re-evaluated here. Amounts are the Decimal strings the audit wrote (2 places).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any


def open_findings(uri: str, warnings: list[str] | None = None) -> list[Any]:
    """The open findings (`signals.model.Finding`) under the signals root `uri`, most at stake first;
    [] when no night has been audited there yet. Given `warnings`, an `error:` line there names a
    damaged night passed over and the malformed findings left out (the others are still returned)."""
    from seedance_tasks.errors import InputError
    from seedance_tasks.signals.audit import open_findings as read

    try:
        return read(uri, warnings)
    except (ValueError, KeyError, TypeError) as exc:  # a findings.json that is not the audit's document
        raise InputError(f"{uri}: the latest nights/<date>/findings.json is malformed ({type(exc).__name__}: {exc})",
                         hint="re-run that night's audit (`seedance signals run --date DATE`) or move the "
                              "file aside; the night before is read then") from exc


def at_stake_by_currency(findings: list[Any]) -> dict[str, Decimal]:
    """Money at stake a month over `findings`, per currency (sorted by currency)."""
    totals: dict[str, Decimal] = {}
    for finding in findings:
        totals[finding.currency] = totals.get(finding.currency, Decimal(0)) + finding.at_stake
    return dict(sorted(totals.items()))
