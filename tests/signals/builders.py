"""Inputs built to cross (or just miss) each signal's threshold, in real formats: FOCUS lines derived
from the FinOps sample, metric samples with DCGM / node_exporter / Seedance telemetry names."""

from __future__ import annotations

import csv
import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from seedance_tasks.config import load_settings
from seedance_tasks.signals.sources import SAMPLES, Inputs, write_samples

DATA = Path(__file__).resolve().parent.parent / "data" / "signals"
NIGHT = date(2024, 10, 30)


def sample_rows() -> tuple[list[str], list[dict]]:
    with open(DATA / "focus_sample.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        return reader.fieldnames, list(reader)


def template(match: str) -> dict:
    """The first real sample row whose ChargeDescription contains `match`."""
    return next(row for row in sample_rows()[1] if match in row["ChargeDescription"])


def focus_file(path: Path, lines: list[tuple[dict, date, str, float]]) -> str:
    """A FOCUS CSV of `(template row, day, cost, quantity)` lines, in the sample's own columns."""
    header, _ = sample_rows()
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, header)
        writer.writeheader()
        for row, day, cost, quantity in lines:
            start = datetime(day.year, day.month, day.day)
            writer.writerow({**row, "ChargePeriodStart": f"{start:%Y-%m-%d %H:%M:%S}",
                             "ChargePeriodEnd": f"{start + timedelta(days=1):%Y-%m-%d %H:%M:%S}",
                             "BilledCost": cost, "EffectiveCost": cost, "ConsumedQuantity": quantity})
    return str(path)


def days(count: int, end: date = NIGHT) -> list[date]:
    return [end - timedelta(days=n) for n in range(count - 1, -1, -1)]


def samples_file(path: Path, series: list[tuple[str, dict, list[tuple[float, float]]]]) -> str:
    """Parquet metric samples of `(name, labels, [(unix seconds, value)...])`."""
    rows = {"timestamp": [], "name": [], "labels": [], "value": []}
    for name, labels, points in series:
        for ts, value in points:
            rows["timestamp"].append(int(ts * 1000))
            rows["name"].append(name)
            rows["labels"].append(json.dumps(labels, sort_keys=True))
            rows["value"].append(float(value))
    table = pa.table({"timestamp": pa.array(rows["timestamp"], pa.int64()).cast(SAMPLES.field(0).type),
                      "name": rows["name"], "labels": rows["labels"], "value": rows["value"]}, schema=SAMPLES)
    write_samples(table, str(path))
    return str(path)


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
