"""Settings of training telemetry (section `telemetry:` of config/seedance.yaml)."""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from pydantic import Field, field_validator

from seedance_tasks.settings_base import StrictModel
from seedance_tasks.units import Duration

MAX_HOURLY_PRICE = Decimal(1_000_000)
"""The largest price per device- or instance-hour accepted (a whole 72-GPU rack rents for a few hundred)."""


class PricingSettings(StrictModel):
    """The price table a step's cost comes from (USD; Decimal, exact)."""

    basis: Literal["device_hours", "instance_hours"] = Field(
        "device_hours",
        description="device_hours: step seconds x devices x price per device-hour x PUE; instance_hours: "
        "step seconds x the instance's hourly price / the ranks sharing the instance",
    )
    pue: Decimal = Field(Decimal("1.0"), ge=1, le=100,
                         description="power usage effectiveness applied to device-hour costs (1.0 to about 3)")
    device: str = Field(
        "auto", description="key of device_hour_prices; auto = the GPU's NVML name (first key it contains), or cpu"
    )
    device_hour_prices: dict[str, Decimal] = Field(
        default_factory=lambda: {"default": Decimal("2.00"), "cpu": Decimal("0.04")},
        description="USD per device-hour (a GPU; `cpu` is per CPU core the rank uses); `default` when no key matches",
    )
    instance_type: str | None = Field(None, description="key of instance_hour_prices (instance_hours basis)")
    instance_hour_prices: dict[str, Decimal] = Field(default_factory=dict, description="USD per instance-hour")

    @field_validator("device_hour_prices", "instance_hour_prices")
    @classmethod
    def _non_negative(cls, prices: dict[str, Decimal]) -> dict[str, Decimal]:
        for key, price in prices.items():
            if price < 0:
                raise ValueError(f"price of {key!r} is negative ({price})")
            if price > MAX_HOURLY_PRICE:  # `1e999999` is a valid Decimal: every cost would be infinite
                raise ValueError(f"price of {key!r} is {price}, above {MAX_HOURLY_PRICE:,} USD an hour: a typo")
        return prices


class EnergySettings(StrictModel):
    """Where energy comes from when no hardware counter can be read: TDP x utilisation (labelled `estimated`)."""

    source: Literal["auto", "nvml", "rapl", "estimated"] = Field(
        "auto", description="auto = NVML on a GPU, else RAPL if readable, else the estimate"
    )
    powercap_root: str = Field("/sys/class/powercap", description="where the RAPL counters are (Linux powercap)")
    gpu_tdp_watts: float = Field(700.0, gt=0, allow_inf_nan=False,
                                 description="GPU board power for the estimate (NVML's limit if readable)")
    cpu_watts_per_core: float = Field(10.0, gt=0, allow_inf_nan=False,
                                      description="CPU power per busy core for the estimate")


class TelemetrySettings(StrictModel):
    enabled: bool = Field(True, description="record per-step cost, energy and utilisation in the reference trainer")
    port: int | None = Field(
        0, ge=0, le=65535,
        description="Prometheus exporter: rank r listens on port + r; 0 = an ephemeral port per rank "
        "(written to the run folder); null = no exporter",
    )
    bind: str = Field("127.0.0.1", description="address the exporter listens on (0.0.0.0 for a remote Prometheus)")
    flush_every: int = Field(50, ge=1, description="steps per Parquet sample file in the run folder")
    final_scrape_wait: Duration = Field(
        0, ge=0, description="at the end, keep the exporter up until it was scraped once more, at most this long"
    )
    pricing: PricingSettings = PricingSettings()
    energy: EnergySettings = EnergySettings()
