"""The dashboard and the report show money by the one rule of `cost.money.display` (the currency's
minor unit, half-up), and take it from the cost package, never the other way round."""

from __future__ import annotations

import ast
from decimal import Decimal
from pathlib import Path

import pytest

from seedance_tasks import cost
from seedance_tasks.cost.money import display
from seedance_tasks.cost.report import render_report
from seedance_tasks.dashboard import pages, svg


@pytest.mark.parametrize(("amount", "currency", "expected"), [
    ("1234567.5", "JPY", "1,234,568 JPY"),
    ("1234.0005", "KWD", "1,234.001 KWD"),
    ("3.005", "USD", "3.01 USD"),
    ("-3.005", "USD", "-3.01 USD"),
    ("2.5", "XYZ", "2.50 XYZ"),
])
def test_svg_money_is_the_money_rule(amount, currency, expected):
    assert svg.money(Decimal(amount), currency) == expected == display(Decimal(amount), currency)


def test_a_money_cell_uses_the_currency_s_minor_unit():
    assert str(pages.amount(Decimal("-1234.5"), "JPY", owner="a")) == "<span class='neg' data-owner='a'>-1,235 JPY</span>"
    assert str(pages.amount(Decimal("0.0005"), "KWD")) == "<span>0.001 KWD</span>"


def test_the_report_shows_yen_without_places_and_dinars_with_three():
    jpy = {"by_owner": {"alpha": "1234.5", "credit": "-99.5", **{f"idle{i}": "0" for i in range(3)}},
           "unallocated": "0.4", "total": "1135.4", "invoice_total": "1135.4", "effective_total": "1135.4"}
    kwd = {"by_owner": {"beta": "2.0005"}, "unallocated": "0", "total": "2.0005", "invoice_total": "2.0005",
           "effective_total": "2.0005"}
    summary = {"month": "2024-09", "basis": "EffectiveCost", "lines": 6, "currencies": {"JPY": jpy, "KWD": kwd},
               "rejected_count": 0, "tag_conflicts": {"count": 0}, "by_service": {}, "idle": [], "warnings": [],
               "over_budget": [{"owner": "alpha", "currency": "JPY", "spend": "1234.5", "budget": "1000",
                                "over_percent": "23.4", "approved": False}]}
    html = render_report(summary, [summary])
    assert "1,235 JPY" in html and "-100 JPY" in html and "1,135 JPY" in html and "1,000 JPY" in html
    assert "3 at 0 JPY not shown" in html
    assert "2.001 KWD" in html and "1234.5" not in html and "1,234.50" not in html


def test_the_cost_package_takes_no_money_from_the_dashboard():
    """Money display lives in `cost.money` (the dashboard imports it); the cost package imports
    nothing from the dashboard but the report's chart drawing and text escaping (`svg.escape`)."""
    taken = {}
    for path in sorted(Path(cost.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("seedance_tasks.dashboard"):
                taken.setdefault(path.name, set()).update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import) and any(a.name.startswith("seedance_tasks.dashboard") for a in node.names):
                taken.setdefault(path.name, set()).add("*")
    assert taken == {"report.py": {"escape", "hbars"}}


def test_findings_show_money_at_stake_by_the_rule_in_messages_and_the_night_s_page():
    from seedance_tasks.signals.audit import render_html
    from seedance_tasks.signals.notify import message

    finding = {"signal": "cost-surge", "key": "owner=alpha", "severity": "warning", "change": "new",
               "summary": "owner alpha: surge", "evidence": {}, "at_stake": "123456.50", "currency": "JPY",
               "fix": None, "first_seen": "2024-09-01", "last_seen": "2024-09-01"}
    assert "at stake: 123,457 JPY a month" in message(finding)[1]
    night = {"date": "2024-09-01", "signals": [{"id": "cost-surge", "fired": True, "findings": [finding]}]}
    assert "<td>123,457 JPY</td>" in render_html(night)


def test_a_cost_surge_summary_shows_money_by_the_rule(tmp_path):
    from datetime import timedelta

    from seedance_tasks.signals.audit import evaluate_rule
    from tests.signals.builders import NIGHT, days, focus_file, inputs, template

    row = template("On Demand Linux g5.4xlarge Instance Hour")
    lines = [(row, day, 98 if i % 2 else 102, 24) for i, day in enumerate(days(28, NIGHT - timedelta(days=1)))]
    lines.append((row, NIGHT, "1121.005", 24))
    found = evaluate_rule("cost-surge", NIGHT, inputs(billing_uri=focus_file(tmp_path / "m.csv", lines)))["findings"]
    summary = next(f["summary"] for f in found if f["key"].startswith("service="))
    assert f"1,121.01 USD on {NIGHT} against a median of 100.00 USD (MAD 2.00 USD)" in summary
