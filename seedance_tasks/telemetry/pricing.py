"""What a second of one rank costs, from the configured price table (USD, Decimal end to end)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from seedance_tasks.errors import ConfigError

_HOUR = Decimal(3600)
CENT = Decimal("0.01")


@dataclass(frozen=True)
class Price:
    """The price of one rank's time: `per_hour` = hourly price x units (x PUE)."""

    basis: str  # device_hours | instance_hours
    key: str  # the price table entry used
    hourly: Decimal  # USD per device-hour or per instance-hour
    units: Decimal  # devices this rank uses, or this rank's share of the instance
    pue: Decimal
    per_hour: Decimal

    def cost(self, seconds: float) -> Decimal:
        """The cost of `seconds` of this rank (Decimal, not rounded; the division by 3600 comes last)."""
        return Decimal(repr(float(seconds))) * self.per_hour / _HOUR

    def describe(self) -> dict:
        """The inputs of the cost, for reports: basis, key, hourly price, units, PUE."""
        return {"basis": self.basis, "key": self.key, "hourly_usd": str(self.hourly), "units": str(self.units),
                "pue": str(self.pue), "usd_per_hour": str(self.per_hour)}


def _match(prices: dict[str, Decimal], name: str) -> str | None:
    """The longest key contained in `name` (case-insensitive): `H100` matches `NVIDIA H100 80GB HBM3`."""
    lowered = name.lower()
    hits = [key for key in prices if key.lower() in lowered]
    return max(hits, key=len) if hits else None


def resolve_price(pricing, *, device_name: str, devices: float = 1, ranks_per_instance: int = 1) -> Price:
    """The price of one rank from `telemetry.pricing` (a PricingSettings).

    device_hours: the entry `pricing.device` (or, for `auto`, the longest key contained in
    `device_name`, else `default`) x `devices` (1 GPU, or the CPU cores of a CPU rank) x PUE.
    instance_hours: `instance_hour_prices[instance_type]` / `ranks_per_instance`.
    Raises ConfigError naming the key when the table has no price for this rank.
    """
    if pricing.basis == "instance_hours":
        key = pricing.instance_type
        if not key or key not in pricing.instance_hour_prices:
            raise ConfigError(
                f"telemetry.pricing.instance_hour_prices has no price for instance_type {key!r}",
                hint="set telemetry.pricing.instance_type and add its USD/hour to telemetry.pricing.instance_hour_prices",
            )
        hourly, units, pue = pricing.instance_hour_prices[key], Decimal(1) / Decimal(max(1, ranks_per_instance)), Decimal(1)
    else:
        prices = pricing.device_hour_prices
        if pricing.device != "auto":
            key = pricing.device if pricing.device in prices else None
        else:
            key = "cpu" if device_name == "cpu" and "cpu" in prices else _match(
                {k: v for k, v in prices.items() if k not in ("cpu", "default")}, device_name)
        key = key or ("default" if "default" in prices and pricing.device == "auto" else None)
        if key is None:
            wanted = pricing.device if pricing.device != "auto" else device_name
            raise ConfigError(
                f"telemetry.pricing.device_hour_prices has no price for device {wanted!r}",
                hint="add it (USD per device-hour) or a `default` entry to telemetry.pricing.device_hour_prices",
            )
        hourly, units, pue = prices[key], Decimal(repr(float(devices))), pricing.pue
    return Price(pricing.basis, key, hourly, units, pue, hourly * units * pue)


def cents(amount: Decimal) -> Decimal:
    """Money for people: rounded to the cent (half-even, as the cost statements do)."""
    from decimal import ROUND_HALF_EVEN

    return amount.quantize(CENT, rounding=ROUND_HALF_EVEN)
