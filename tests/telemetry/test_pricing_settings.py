"""The price table is money: a price no table can mean is refused when the settings load, naming the key."""

from __future__ import annotations

from decimal import Decimal

import pytest

from seedance_tasks.config import load_settings
from seedance_tasks.errors import ConfigError
from seedance_tasks.telemetry.pricing import cents, resolve_price


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("DEVICE_HOUR_PRICES", "{default: 1e999999}", "price of 'default' is 1E+999999, above 1,000,000 USD an hour"),
    ("INSTANCE_HOUR_PRICES", "{p5.48xlarge: 98.32, typo: 9832000000}", "price of 'typo'"),
    ("PUE", "1e999999", "'telemetry.pricing.pue'"),
])
def test_a_price_too_large_to_be_one_is_refused_naming_the_key(variable, value, said):
    # was accepted: each step's cost became an infinite float, which the summary rejects, so the run
    # showed a cost of 0.00 (or, rounded to the cent, decimal.Overflow)
    with pytest.raises(ConfigError, match=f"SEEDANCE__TELEMETRY__PRICING__{variable}") as caught:
        load_settings(environ={f"SEEDANCE__TELEMETRY__PRICING__{variable}": value})
    assert said in caught.value.message


def test_a_real_price_table_still_loads_and_prices_to_the_cent():
    pricing = load_settings(environ={"SEEDANCE__TELEMETRY__PRICING__DEVICE_HOUR_PRICES": "{default: 2.5, H100: 12.29}",
                                     "SEEDANCE__TELEMETRY__PRICING__PUE": "1.3"}).telemetry.pricing
    price = resolve_price(pricing, device_name="NVIDIA H100 80GB HBM3")
    assert price.key == "H100" and cents(price.cost(3600)) == Decimal("15.98")
