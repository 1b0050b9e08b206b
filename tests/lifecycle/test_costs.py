"""Cost figures: cents with their currency, tiers that add up to the total, any storage class priced."""

from __future__ import annotations

from decimal import Decimal

import pytest

from seedance_tasks.errors import ConfigError
from seedance_tasks.lifecycle import costs

GB = 1024**3


def _manifest(files):
    return {"files": {f"data-{i}.bin": entry for i, entry in enumerate(files)}}


def test_costs_are_cents_with_currency_and_the_tiers_add_up(lifecycle_settings):
    settings = lifecycle_settings.model_copy(deep=True)
    settings.prices["HALF_CENT"] = Decimal("0.005")
    for tier in ("hot", "warm", "cold"):
        settings.tiers.spec(tier).price_class, settings.tiers.spec(tier).storage_class = "HALF_CENT", None
    report = costs.report([_manifest([{"size": GB, "tier": tier} for tier in ("hot", "warm", "cold")])], settings)
    shown = [report["monthly_usd"], *(row["monthly_usd"] for row in report["tiers"].values())]
    assert report["monthly_usd"] == "0.02" and report["currency"] == "USD"  # 0.015 exact, half up
    assert all(len(value.partition(".")[2]) == 2 for value in shown), shown
    assert sum(Decimal(row["monthly_usd"]) for row in report["tiers"].values()) == Decimal("0.02")
    empty = costs.report([], settings)
    assert empty["monthly_usd"] == "0.00" and {r["monthly_usd"] for r in empty["tiers"].values()} == {"0.00"}
    saving = costs.saving(report, empty)
    assert (saving["monthly_usd"], saving["currency"]) == ("0.02", "USD")
    assert costs.shown("1234.5") == "1,234.50 USD"


def test_a_storage_class_the_price_table_lacks_is_priced_at_its_list_price(lifecycle_settings):
    """A file an older configuration tiered to DEEP_ARCHIVE still gets a cost, not a KeyError."""
    settings = lifecycle_settings.model_copy(deep=True)
    del settings.prices["DEEP_ARCHIVE"]
    report = costs.report([_manifest([{"size": 1000 * GB, "tier": "cold", "storage_class": "DEEP_ARCHIVE"}])],
                          settings)
    assert report["tiers"]["cold"]["monthly_usd"] == report["monthly_usd"] == "0.99"


def test_a_negative_price_is_refused_naming_the_key(tmp_path):
    from seedance_tasks.config import load_settings

    path = tmp_path / "c.yaml"
    path.write_text('lifecycle:\n  prices: {STANDARD: "0.023", STANDARD_IA: "-0.0125", GLACIER_IR: "0.004"}\n')
    with pytest.raises(ConfigError, match="prices.STANDARD_IA"):
        load_settings(path, environ={})


def test_one_price_given_is_merged_over_the_default_table(tmp_path):
    """`prices: {STANDARD: ...}` used to replace the whole table: tier warm's STANDARD_IA was then
    "not listed" and the settings refused."""
    from seedance_tasks.config import load_settings
    from seedance_tasks.lifecycle.settings import DEFAULT_PRICES

    path = tmp_path / "c.yaml"
    path.write_text('lifecycle:\n  prices: {STANDARD: "0.03", MY_NAS: "0.01"}\n')
    prices = load_settings(path, environ={}).lifecycle.prices
    assert prices == {**DEFAULT_PRICES, "STANDARD": Decimal("0.03"), "MY_NAS": Decimal("0.01")}


def test_prices_given_by_environment_override_or_in_lower_case_count_and_odd_classes_never_crash(tmp_path):
    from seedance_tasks.config import load_settings
    from seedance_tasks.lifecycle import costs

    path = tmp_path / "c.yaml"
    path.write_text("lifecycle:\n  tiers:\n    warm: {price_class: my_nas}\n  prices: {my_nas: \"0.01\"}\n")
    settings = load_settings(path, environ={"SEEDANCE__LIFECYCLE__PRICES__GLACIER_IR": "0.005"}).lifecycle
    assert settings.prices["GLACIER_IR"] == Decimal("0.005") and settings.prices["MY_NAS"] == Decimal("0.01")
    assert settings.tiers.spec("warm").price_key() == "MY_NAS"
    assert costs.monthly(costs.GB, "glacier_ir", settings) == Decimal("0.005")
    assert costs.monthly(costs.GB, "EXPRESS_ONEZONE_OF_ITS_OWN", settings) == settings.prices["STANDARD"]
