"""Money at stake follows the one money rule (`cost.money.rounded`): the currency's own minor unit."""

from __future__ import annotations

from decimal import Decimal

import pytest

from seedance_tasks.cost.money import display
from seedance_tasks.signals.audit import evaluate_rule
from seedance_tasks.signals.model import Finding
from tests.signals.builders import NIGHT, focus_file, inputs, template

COMPUTE = "On Demand Linux g5.4xlarge Instance Hour"


@pytest.mark.parametrize(("currency", "unowned", "stake", "shown"), [
    ("KWD", "10.0005", "10.001", "10.001 KWD"),  # three places: 2 would drop a digit the display shows
    ("JPY", "1000.495", "1000", "1,000 JPY"),  # no places: rounding to 2 first would give 1,001
    ("USD", "10.005", "10.01", "10.01 USD"),
])
def test_unowned_spend_at_stake_is_rounded_to_its_currency_minor_unit(tmp_path, currency, unowned, stake, shown):
    owned = {**template(COMPUTE), "Tags": '{"owner": "PlatformTeam"}', "BillingCurrency": currency}
    untagged = {**template(COMPUTE), "Tags": "NULL", "BillingCurrency": currency}
    lines = [(owned, NIGHT, "10", 1), (untagged, NIGHT, unowned, 1)]
    result = evaluate_rule("unallocated-share", NIGHT, inputs(billing_uri=focus_file(tmp_path / "m.csv", lines)))
    [finding] = result["findings"]
    assert (finding["currency"], finding["at_stake"]) == (currency, stake)  # the night's day 30 of 30: x 30/30
    assert display(finding["at_stake"], currency) == shown


def test_a_finding_keeps_its_currency_digits_through_json():
    finding = Finding("s", "k", "warning", "x", {}, Decimal("1.2345"), "KWD")
    assert Finding.from_json(finding.to_json()).at_stake == Decimal("1.235")
