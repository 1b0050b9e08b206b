"""Sample inputs in the signals' real formats, shared by the demo and the tests: FOCUS lines made
from rows of the FinOps FOCUS sample, and Parquet metric samples under real exporter names."""

from __future__ import annotations

import csv
import json
from datetime import date, datetime, timedelta
from pathlib import Path

from seedance_tasks.signals.sources import SAMPLES, write_samples

FOCUS_SAMPLE = Path(__file__).resolve().parents[2] / "tests" / "data" / "signals" / "focus_sample.csv"


def sample_rows(sample: Path = FOCUS_SAMPLE) -> tuple[list[str], list[dict]]:
    """(header, rows) of the FOCUS sample CSV."""
    with open(sample, newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def template(match: str, sample: Path = FOCUS_SAMPLE) -> dict:
    """The first real sample row whose ChargeDescription contains `match`."""
    return next(row for row in sample_rows(sample)[1] if match in row["ChargeDescription"])


def focus_file(path: Path, lines: list[tuple[dict, date, object, float]], sample: Path = FOCUS_SAMPLE) -> str:
    """A FOCUS CSV of daily `(template row, day, cost, quantity)` lines, in the sample's own columns."""
    header, _ = sample_rows(sample)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, header)
        writer.writeheader()
        for row, day, cost, quantity in lines:
            start = datetime(day.year, day.month, day.day)
            writer.writerow({**row, "ChargePeriodStart": f"{start:%Y-%m-%d %H:%M:%S}",
                             "ChargePeriodEnd": f"{start + timedelta(days=1):%Y-%m-%d %H:%M:%S}",
                             "BilledCost": cost, "EffectiveCost": cost, "ConsumedQuantity": quantity})
    return str(path)


def samples_file(path: Path, series: list[tuple[str, dict, list[tuple[float, float]]]]) -> str:
    """Parquet metric samples (timestamp, name, labels, value) of `(name, labels, [(unix s, value)...])`."""
    import pyarrow as pa

    rows: dict[str, list] = {"timestamp": [], "name": [], "labels": [], "value": []}
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
