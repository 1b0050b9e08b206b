"""Inputs built to cross (or just miss) each signal's threshold, in real formats: FOCUS lines derived
from the FinOps sample, metric samples with DCGM / node_exporter / Seedance telemetry names."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from seedance_tasks.config import load_settings
from seedance_tasks.signals.sample import focus_file, samples_file, template  # noqa: F401 - re-exported
from seedance_tasks.signals.sources import Inputs

DATA = Path(__file__).resolve().parent.parent / "data" / "signals"
NIGHT = date(2024, 10, 30)


def days(count: int, end: date = NIGHT) -> list[date]:
    return [end - timedelta(days=n) for n in range(count - 1, -1, -1)]


def night_points(value, day: date = NIGHT, step: int = 300, count: int | None = None, start_days: int = 0):
    """(ts, value(i)) every `step` s over `day` (and `start_days` before it)."""
    first = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() - start_days * 86400
    total = count if count is not None else (86400 * (1 + start_days)) // step
    return [(first + i * step, value(i) if callable(value) else value) for i in range(total)]


def counter(rate: float, **kwargs):
    """A counter growing at `rate` per second."""
    step = kwargs.get("step", 300)
    return night_points(lambda i: i * step * rate, **kwargs)


def settings(**changes):
    current = load_settings().signals
    return type(current).model_validate({**current.model_dump(), **changes})


def inputs(**kwargs) -> Inputs:
    config = kwargs.pop("settings", None) or settings()
    return Inputs(config, **kwargs)
