"""What every signal shares: the `Rule` protocol, the `Finding` it returns, and the inputs it reads.

A rule names the inputs it needs (`needs`: billing, metrics, lakes, checkpoints, logs) and the metric
names it reads (`metrics`); `evaluate(day, inputs)` returns its findings for that night. A rule
whose inputs are missing is skipped with the reason (`Skipped`), never silently passes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import date
from decimal import Decimal
from typing import Any, Protocol

from seedance_tasks.cost.money import rounded

SEVERITIES = ("info", "warning", "critical")


class Skipped(Exception):
    """A rule cannot run tonight; the message says why (an input or a metric is missing)."""


def dollars(value: Any, currency: str | None = "USD") -> Decimal:
    """Money in `currency` rounded as `cost.money.rounded` rounds it (half up, to the currency's minor
    unit: 2 places for USD, 0 for JPY, 3 for KWD), from a Decimal, int, str or float."""
    return rounded(value if isinstance(value, Decimal) else Decimal(str(value)), currency)


@dataclass
class Finding:
    """One leak: `signal` (rule id) on `key` (resource, dataset, job), its evidence in numbers, the
    money at stake per month, and the fix (a DAG id and its conf), owned by `owner`."""

    signal: str
    key: str
    severity: str
    summary: str
    evidence: dict[str, Any]
    at_stake: Decimal = Decimal("0.00")
    currency: str = "USD"
    fix: dict[str, Any] | None = None
    owner: str | None = None
    first_seen: str | None = None
    last_seen: str | None = None
    status: str = "open"  # open (new or persisting) | resolved
    change: str = "new"  # new | persisting | escalated | resolved
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.signal}:{self.key}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict: money as a string to its currency's minor unit (`dollars`)."""
        out = asdict(self)
        out.pop("extra")
        out["id"] = self.id
        out["at_stake"] = str(dollars(self.at_stake, self.currency))
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        values = {key: value for key, value in data.items() if key in cls.__dataclass_fields__}
        values["at_stake"] = Decimal(values.get("at_stake", "0"))
        return cls(**values)


class Rule(Protocol):
    """A signal: `id`, `family`, the inputs it `needs`, the `metrics` it reads, and `evaluate`."""

    id: str
    family: str
    needs: tuple[str, ...]
    metrics: tuple[str, ...]
    description: str

    def evaluate(self, day: date, inputs: Any) -> list[Finding]: ...


def severity_for(at_stake: Decimal, settings, floor: str = "warning") -> str:
    """critical at `signals.critical_dollars` a month and above, else `floor`."""
    return "critical" if at_stake >= settings.critical_dollars else floor


def require_metrics(inputs, names, day: date) -> None:
    """Skipped naming the metrics in `names` that the metrics source has no sample of on `day` (a
    metric whose exporter stopped weeks ago is missing tonight, not silently empty)."""
    missing = sorted(set(names) - inputs.metric_names(day))
    if missing:
        raise Skipped("metrics missing: " + ", ".join(missing))
