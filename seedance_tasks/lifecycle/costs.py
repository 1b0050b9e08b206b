"""Bytes per tier and their monthly storage cost, from the price table in config (Decimal, USD).

Figures a report shows are rounded to the cent (`money.rounded`, half-up); the tiers' figures are
the rounded total split by largest remainder, so they add up to it exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from seedance_tasks.cost import money
from seedance_tasks.lifecycle.settings import DEFAULT_PRICES, TIERS, LifecycleSettings

GB = Decimal(1024**3)  # S3 bills GB-months of 2^30 bytes
CURRENCY = "USD"  # of `lifecycle.prices`
CENT = Decimal(1).scaleb(-money.minor_units(CURRENCY))


def price_key(entry: dict, settings: LifecycleSettings) -> str:
    """The price class of one stored file: its storage class if it has one, else its tier's."""
    tier = entry.get("tier") or "hot"
    if entry.get("storage_class"):
        return entry["storage_class"]
    return settings.tiers.spec(tier if tier in TIERS else "hot").price_key()


def monthly(num_bytes: int, key: str, settings: LifecycleSettings) -> Decimal:
    """USD per month of keeping `num_bytes` at price class `key`, exact (not rounded).

    A storage class the configured table lacks (a file an older configuration tiered) is priced
    at its S3 list price (`DEFAULT_PRICES`), one S3 does not list (a manifest naming a class of
    its own) as STANDARD; a tier's own class is always in the table (settings). Classes are
    matched in capitals.
    """
    key = str(key).upper()
    price = settings.prices.get(key, DEFAULT_PRICES.get(key, DEFAULT_PRICES["STANDARD"]))
    return Decimal(num_bytes) / GB * price


class Tally:
    """Bytes, files and exact monthly cost per tier of the checkpoints added so far; keeps no
    manifest, so a pass over a large store adds each run's and lets it go."""

    def __init__(self, settings: LifecycleSettings):
        self.settings, self.checkpoints = settings, 0
        self.tiers: dict[str, dict] = {tier: {"bytes": 0, "files": 0, "monthly_usd": Decimal(0)} for tier in TIERS}

    def add(self, manifests: Iterable[dict]) -> Tally:
        """Count `manifests` in; returns self."""
        for manifest in manifests:
            self.checkpoints += 1
            for entry in manifest["files"].values():
                tier = entry.get("tier") or "hot"
                row = self.tiers.setdefault(tier, {"bytes": 0, "files": 0, "monthly_usd": Decimal(0)})
                size = int(entry.get("size") or 0)
                row["bytes"] += size
                row["files"] += 1
                row["monthly_usd"] += monthly(size, price_key(entry, self.settings), self.settings)
        return self

    def report(self) -> dict:
        """{"tiers": {tier: {"bytes", "files", "monthly_usd"}}, "bytes", "monthly_usd", "currency",
        "checkpoints"}: costs are strings of Decimals in cents; the tiers' add up to `monthly_usd`."""
        exact = [row["monthly_usd"] for row in self.tiers.values()]
        total = money.rounded(sum(exact, Decimal(0)), CURRENCY)
        parts = money.largest_remainder(total, exact, CENT) if any(exact) else [total] * len(exact)
        return {
            "checkpoints": self.checkpoints,
            "bytes": sum(row["bytes"] for row in self.tiers.values()),
            "monthly_usd": str(total),
            "currency": CURRENCY,
            "tiers": {tier: {**row, "monthly_usd": str(part)}
                      for (tier, row), part in zip(self.tiers.items(), parts, strict=True)},
        }


def report(manifests: Iterable[dict], settings: LifecycleSettings) -> dict:
    """`Tally.report` of `manifests`."""
    return Tally(settings).add(manifests).report()


def saving(before: dict, after: dict) -> dict:
    """Bytes and USD/month (cents) saved from report `before` to report `after`, and the fraction."""
    cost_before, cost_after = Decimal(before["monthly_usd"]), Decimal(after["monthly_usd"])
    return {
        "bytes": before["bytes"] - after["bytes"],
        "monthly_usd": str(cost_before - cost_after),
        "currency": CURRENCY,
        "fraction": float((cost_before - cost_after) / cost_before) if cost_before else 0.0,
    }


def shown(amount: str) -> str:
    """A cost of a report as a person reads it: cents, thousands separators, the currency."""
    return money.display(amount, CURRENCY)
