"""Bytes per tier and their monthly storage cost, from the price table in config (Decimal, USD)."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import ROUND_HALF_UP, Decimal

from seedance_tasks.lifecycle.settings import TIERS, LifecycleSettings

GB = Decimal(1024**3)  # S3 bills GB-months of 2^30 bytes
CENT = Decimal("0.0001")


def price_key(entry: dict, settings: LifecycleSettings) -> str:
    """The price class of one stored file: its storage class if it has one, else its tier's."""
    tier = entry.get("tier") or "hot"
    if entry.get("storage_class"):
        return entry["storage_class"]
    return settings.tiers.spec(tier if tier in TIERS else "hot").price_key()


def monthly(num_bytes: int, key: str, settings: LifecycleSettings) -> Decimal:
    """USD per month of keeping `num_bytes` at price class `key`."""
    return Decimal(num_bytes) / GB * settings.prices[key]


def report(manifests: Iterable[dict], settings: LifecycleSettings) -> dict:
    """{"tiers": {tier: {"bytes", "files", "monthly_usd"}}, "bytes", "monthly_usd", "checkpoints"}.

    Costs are Decimal rounded to 1/100 of a cent, as strings in JSON.
    """
    tiers: dict[str, dict] = {tier: {"bytes": 0, "files": 0, "monthly_usd": Decimal(0)} for tier in TIERS}
    count = 0
    for manifest in manifests:
        count += 1
        for entry in manifest["files"].values():
            tier = entry.get("tier") or "hot"
            row = tiers.setdefault(tier, {"bytes": 0, "files": 0, "monthly_usd": Decimal(0)})
            size = int(entry.get("size") or 0)
            row["bytes"] += size
            row["files"] += 1
            row["monthly_usd"] += monthly(size, price_key(entry, settings), settings)
    total = sum((row["monthly_usd"] for row in tiers.values()), Decimal(0))
    return {
        "checkpoints": count,
        "bytes": sum(row["bytes"] for row in tiers.values()),
        "monthly_usd": str(total.quantize(CENT, ROUND_HALF_UP)),
        "tiers": {
            tier: {**row, "monthly_usd": str(row["monthly_usd"].quantize(CENT, ROUND_HALF_UP))}
            for tier, row in tiers.items()
        },
    }


def saving(before: dict, after: dict) -> dict:
    """Bytes and USD/month saved from report `before` to report `after`, and the fraction."""
    cost_before, cost_after = Decimal(before["monthly_usd"]), Decimal(after["monthly_usd"])
    return {
        "bytes": before["bytes"] - after["bytes"],
        "monthly_usd": str(cost_before - cost_after),
        "fraction": float((cost_before - cost_after) / cost_before) if cost_before else 0.0,
    }
