"""Charts and the monthly report.html: money to the cent with its currency, negatives drawn below
the axis, long labels cut with a tooltip, every label escaped, zero owners counted not drawn."""

from __future__ import annotations

import re
from decimal import Decimal

from seedance_tasks.cost.report import render_report
from seedance_tasks.dashboard import svg


def _rects(chart: str) -> list[dict[str, float]]:
    return [{key: float(value) for key, value in re.findall(r"(\w+)='(-?[\d.]+)'", rect)}
            for rect in re.findall(r"<rect ([^>]*)>", chart)]


def test_money_rounds_half_up_to_cents_with_the_currency():
    assert svg.money(Decimal("20.52022672899"), "USD") == "20.52 USD"
    assert svg.money(Decimal("-4.125"), "EUR") == "-4.13 EUR"
    assert svg.money(Decimal("1234567.005")) == "1,234,567.01"
    assert svg.money(Decimal("-0.001"), "USD") == "0.00 USD"


def test_horizontal_bars_put_negatives_left_of_the_axis_and_cut_long_labels_with_a_tooltip():
    long = "a-team-with-a-very-long-name-that-does-not-fit-" * 2
    chart = svg.hbars("t", [(long, Decimal("10")), ("<b>credit</b>", Decimal("-5"))], lambda v: svg.money(v, "USD"))
    zero = float(re.search(r"<line x1='([\d.]+)'", chart).group(1))
    positive, negative = _rects(chart)
    assert positive["x"] == zero and negative["x"] + negative["width"] == zero and negative["x"] < zero
    assert f"<title>{long}</title>" in chart and "…" in chart and long not in chart.replace(f"<title>{long}", "")
    assert "&lt;b&gt;credit&lt;/b&gt;" in chart and "<b>" not in chart
    assert "-5.00 USD" in chart and "10.00 USD" in chart


def test_stacked_bars_stack_negatives_below_the_zero_line():
    chart = svg.stacked("t", ["2024-08", "2024-09"], [
        ("a", "#111", [Decimal("10"), Decimal("4")]),
        ("b", "#222", [None, Decimal("-6")]),
    ], lambda v: svg.money(v, "USD"))
    zero = re.findall(r"<line x1='[\d.]+' x2='[\d.]+' y1='([\d.]+)' y2='\1' stroke='#333'/>", chart)
    assert len(zero) == 1
    bars = [rect for rect in _rects(chart) if "height" in rect and rect.get("width", 0) > 12]
    below = [rect for rect in bars if rect["y"] >= float(zero[0])]
    above = [rect for rect in bars if rect["y"] + rect["height"] <= float(zero[0])]
    assert len(below) == 1 and len(above) == 2
    assert "b, 2024-09: -6.00 USD" in chart


def _summary(**currencies):
    return {"month": "2024-09", "basis": "EffectiveCost", "lines": 3, "currencies": currencies,
            "rejected_count": 0, "tag_conflicts": {"count": 0}, "by_service": {}, "idle": [], "warnings": [],
            "over_budget": [{"owner": "big", "currency": "USD", "spend": "20.52022672899", "budget": "10",
                             "over_percent": "105.2", "approved": False}]}


def test_report_draws_non_zero_owners_and_negatives_and_rounds_every_amount():
    long = "Platform-Engineering-Shared-Services-" * 3
    usd = {"by_owner": {"big": "20.52022672899", long: "3.5", "credit": "-2.125",
                        **{f"idle{i}": "0" for i in range(30)}},
           "unallocated": "0", "total": "21.89522672899", "invoice_total": "21.9", "effective_total": "21.9"}
    summary = _summary(USD=usd)
    html = render_report(summary, [summary])
    assert "-2.13 USD" in html and "credit" in html  # the negative owner is drawn
    assert "30 at 0.00 USD not shown" in html and "idle0" not in html
    assert f"<title>{long}</title>" in html  # cut on the chart, whole in the tooltip
    amounts = re.findall(r"-?\d[\d,]*\.\d+", re.sub(r"<(svg|rect|line|text)[^>]*>", "", html))
    assert amounts and all(re.fullmatch(r"-?[\d,]+\.\d{2}|\d+\.\d", a) for a in amounts), amounts
    assert "20.52022672899" not in html and "20.52 USD" in html


def test_an_empty_month_says_so():
    summary = {**_summary(), "lines": 0, "currencies": {}, "over_budget": [],
               "warnings": ["no billing lines in 2024-09: 3 rows read from x.csv, none valid"]}
    html = render_report(summary, [summary])
    assert "No billing lines in 2024-09" in html and "3 rows read from x.csv" in html
