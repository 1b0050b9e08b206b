"""The one rule for an amount a person reads (`money.rounded`, `money.display`): half-up, ties away
from zero, to the currency's minor unit; and the deduction workflow showing and recording that
same amount (plan, confirmation, ledger, notification), while the published outputs stay exact."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.cost import actions
from seedance_tasks.cost.budget_ledger import BudgetLedger
from seedance_tasks.cost.money import display, minor_units, rounded
from seedance_tasks.cost.recover import recover_month
from tests.cost.helpers import line, write_focus, write_owners

MONTH = "2024-08"


@pytest.mark.parametrize(("currency", "places"), [
    ("USD", 2), ("EUR", 2), ("JPY", 0), ("KRW", 0), ("KWD", 3), ("BHD", 3), ("jpy", 0),
    ("XYZ", 2), ("", 2), (None, 2),
])
def test_minor_units_come_from_the_currency(currency, places):
    assert minor_units(currency) == places


@pytest.mark.parametrize(("amount", "currency", "expected"), [
    ("3.005", "USD", "3.01"),  # half-up: half-even would give 3.00
    ("2.665", "USD", "2.67"),
    ("3.00499", "USD", "3.00"),
    ("-3.005", "USD", "-3.01"),  # ties away from zero, symmetric
    ("-0.004", "USD", "0.00"),  # never a negative zero
    ("12.5", "USD", "12.50"),
    ("1234.5", "JPY", "1235"),
    ("-1234.5", "JPY", "-1235"),
    ("0.4", "JPY", "0"),
    ("1.2345", "KWD", "1.235"),
    ("2.0005", "KWD", "2.001"),
    ("-2.0005", "KWD", "-2.001"),
    ("7", "KWD", "7.000"),
    ("1.005", "XYZ", "1.01"),
    ("1.005", None, "1.01"),
])
def test_rounded_is_half_up_to_the_minor_unit(amount, currency, expected):
    value = rounded(Decimal(amount), currency)
    assert str(value) == expected and value.as_tuple().exponent == -minor_units(currency)


@pytest.mark.parametrize(("amount", "currency", "expected"), [
    ("3.005", "USD", "3.01 USD"),
    ("1234567.005", "USD", "1,234,567.01 USD"),
    ("-1234567.005", "USD", "-1,234,567.01 USD"),
    ("-4.125", "EUR", "-4.13 EUR"),
    ("-0.001", "USD", "0.00 USD"),
    ("1234567.5", "JPY", "1,234,568 JPY"),
    ("-999.5", "JPY", "-1,000 JPY"),
    ("1234.0005", "KWD", "1,234.001 KWD"),
    ("-0.0005", "KWD", "-0.001 KWD"),
    ("1234.5", "XYZ", "1,234.50 XYZ"),  # unknown code: 2 places, the code as given
    ("1234.5", None, "1,234.50"),  # no currency: 2 places, the number alone
    ("1234.5", "", "1,234.50"),
    ("999999999999999999.995", "USD", "1,000,000,000,000,000,000.00 USD"),
])
def test_display_rounds_separates_thousands_and_names_the_currency(amount, currency, expected):
    assert display(Decimal(amount), currency) == expected


def test_display_takes_ints_and_strings():
    assert display(5, "JPY") == "5 JPY" and display("1000.005", "USD") == "1,000.01 USD"


AMOUNTS = st.decimals(min_value=Decimal("-1e15"), max_value=Decimal("1e15"), places=6, allow_nan=False,
                      allow_infinity=False)
CODES = st.sampled_from(["USD", "JPY", "KWD", "EUR", "XYZ", None])


@given(amount=AMOUNTS, currency=CODES)
def test_rounding_is_symmetric_and_display_shows_the_rounded_amount(amount, currency):
    value = rounded(amount, currency)
    assert rounded(-amount, currency) == -value
    assert abs(value - amount) <= Decimal(1).scaleb(-minor_units(currency)) / 2
    assert display(amount, currency) == display(value, currency)
    assert Decimal(display(amount, currency).split(" ")[0].replace(",", "")) == value
    assert display(amount, currency).startswith("-") == (value < 0)


# --------------------------------------------------------------------------- deductions


def _published(tmp_path):
    """A published month: alpha owes 3.005 USD, 1234.5 JPY and 2.0005 KWD; beta a credit of -3.005 USD."""
    billing = write_focus(tmp_path / "billing" / "focus.csv", [
        line(f"{MONTH}-05 00:00:00", "3.005", tags={"owner": "alpha"}),
        line(f"{MONTH}-06 00:00:00", "1234.5", currency="JPY", tags={"owner": "alpha"}),
        line(f"{MONTH}-07 00:00:00", "2.0005", currency="KWD", tags={"owner": "alpha"}),
        line(f"{MONTH}-08 00:00:00", "-3.005", tags={"owner": "beta"}, category="Credit"),
    ])
    owners = write_owners(tmp_path / "owners.yaml")
    out = tmp_path / "out"
    recover_month(month=MONTH, billing=str(billing), owners=str(owners), out=str(out), backfill=True)
    return out


def test_the_plan_shows_the_amount_the_ledger_deducts(tmp_path):
    out = _published(tmp_path)
    summary = json.loads((out / f"month={MONTH}" / "summary.json").read_text())
    assert summary["currencies"]["USD"]["by_owner"]["alpha"] == "3.005"  # the published outputs stay exact

    dry = actions.settle(actions.plan(month=MONTH, out=str(out), apply=False))
    assert dry["planned"] == [
        "deduct 1,235 JPY from alpha's budget pool if the owner confirms",
        "deduct 2.001 KWD from alpha's budget pool if the owner confirms",
        "deduct 3.01 USD from alpha's budget pool if the owner confirms",
        "deduct -3.01 USD from beta's budget pool if the owner confirms"]

    plan = actions.plan(month=MONTH, out=str(out), apply=True)
    asked = next(r for r in plan["confirmations"] if r["request"]["owner"] == "alpha")
    assert asked["subject"].endswith(": 1,235 JPY, 2.001 KWD, 3.01 USD")
    assert "**1,235 JPY, 2.001 KWD, 3.01 USD**" in asked["body"]
    actions.record_decision(asked["request"], actions.CONFIRM, "ok", {"id": "admin", "name": "admin"})
    settled = actions.settle(plan)
    assert sorted(settled["deducted"]) == [f"deduct:{MONTH}:alpha:{c}" for c in ("JPY", "KWD", "USD")]

    entries = BudgetLedger(str(out)).load()
    recorded = {e.currency: e.amount for e in entries.values() if e.kind == "deduction"}
    assert {c: str(a) for c, a in recorded.items()} == {"USD": "3.01", "JPY": "1235", "KWD": "2.001"}
    stored = json.loads((out / "_seedance" / "cost" / "budget-ledger.json").read_text())["entries"]
    assert {e["currency"]: e["amount"] for e in stored if e["kind"] == "deduction"} == {
        "USD": "3.01", "JPY": "1235", "KWD": "2.001"}

    outbox = [json.loads(row) for row in (out / "_seedance" / "cost" / "outbox.jsonl").read_text().splitlines()]
    sent = {row["details"]["currency"]: row for row in outbox if row["key"].startswith("deduct:")}
    for currency, shown in (("USD", "3.01 USD"), ("JPY", "1,235 JPY"), ("KWD", "2.001 KWD")):
        assert sent[currency]["subject"] == f"{MONTH} chargeback deducted: {shown}"
        assert sent[currency]["message"].startswith(f"{shown} (confirmed) was deducted")
        assert Decimal(sent[currency]["details"]["amount"]) == recorded[currency]
        assert display(recorded[currency], currency) == shown

    human = CliRunner().invoke(app, ["cost", "ledger", "--out", str(out)], env={"COLUMNS": "200"})
    assert human.exit_code == 0, human.output
    assert "3.01 USD" in human.stdout and "1,235 JPY" in human.stdout and "2.001 KWD" in human.stdout


def test_the_cli_tables_use_the_currency_s_minor_unit(tmp_path):
    out = _published(tmp_path)
    owners = str(tmp_path / "owners.yaml")
    shown = CliRunner().invoke(app, ["cost", "actions", "--month", MONTH, "--out", str(out), "--owners", owners],
                               env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "1,235 JPY" in shown.stdout and "2.001 KWD" in shown.stdout and "3.01 USD" in shown.stdout
    assert "-3.01 USD" in shown.stdout and "1234.50" not in shown.stdout

    billing = tmp_path / "billing" / "focus.csv"
    recovered = CliRunner().invoke(app, ["cost", "recover", "--month", MONTH, "--billing", str(billing), "--owners",
                                         owners, "--out", str(tmp_path / "again"), "--backfill"],
                                   env={"COLUMNS": "200"})
    assert recovered.exit_code == 0, recovered.output
    assert "1,235 JPY" in recovered.stdout and "2.001 KWD" in recovered.stdout and "-3.01 USD" in recovered.stdout
