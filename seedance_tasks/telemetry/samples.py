"""Telemetry samples as Parquet in the run's folder: one row per (timestamp, name, labels, value).

Files: `<run folder>/telemetry/samples-r<rank>-a<attempt>-<seq>.parquet`, each written under a
hidden name and renamed into place, so a reader (the signals pipeline, the DAG summary) never
sees half a file. Names are the Prometheus names (`seedance_...`); labels always hold `run`,
`rank`, `attempt` and `step`.
"""

from __future__ import annotations

import math
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

SCHEMA_FIELDS = ("timestamp", "name", "labels", "value")


def _schema():
    import pyarrow as pa

    return pa.schema([
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("name", pa.string()),
        ("labels", pa.map_(pa.string(), pa.string())),
        ("value", pa.float64()),
    ])


def write_samples(folder: str | Path, file_name: str, rows: tuple[list, list, list, list]) -> Path:
    """Write (timestamps in epoch seconds, names, label dicts, values) as one Parquet file, atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stamps, names, labels, values = rows
    table = pa.Table.from_arrays([
        pa.array([int(stamp * 1_000_000) for stamp in stamps], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array(names, pa.string()),
        pa.array([list(item.items()) for item in labels], pa.map_(pa.string(), pa.string())),
        pa.array(values, pa.float64()),
    ], schema=_schema())
    final = folder / file_name
    hidden = folder / f".{file_name}.tmp-{os.getpid()}"
    pq.write_table(table, hidden, compression="zstd")
    os.replace(hidden, final)
    return final


def read_sample_files(folder: str | Path, *, skip_damaged: bool = True) -> tuple[Any, list[str]]:
    """Every sample file under `folder` (the `telemetry/` folder of a run) as one Arrow table
    (hidden, half-written files skipped; an empty table with the schema when there are none),
    and the names of the files that could not be read as samples (empty or cut short after a
    crash, another schema, a link or anything but a plain file): those are left in place,
    untouched, and their samples not counted.
    With `skip_damaged=False` such a file raises instead (ArrowInvalid, a ValueError, or OSError)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(Path(folder).glob("samples-*.parquet")) if Path(folder).is_dir() else []
    tables, damaged = [], []
    for path in files:
        try:
            if path.is_symlink() or not path.is_file():  # the recorder writes plain files only
                raise OSError(f"{path} is not a plain file (a link, a folder or a device): not read as samples")
            tables.append(pq.read_table(path, schema=_schema()))
        except (pa.ArrowException, OSError):
            if not skip_damaged:
                raise
            damaged.append(path.name)
    return (pa.concat_tables(tables) if tables else _schema().empty_table()), damaged


def read_samples(folder: str | Path):
    """Every sample file under `folder` as one Arrow table; a file that cannot be read raises (see
    `read_sample_files`)."""
    return read_sample_files(folder, skip_damaged=False)[0]


def _last_by_series(table, names: set[str]) -> tuple[dict[tuple, tuple[dict, float]], int]:
    """The last value of each (name, rank, attempt, extra labels) series among `names`, and how
    many values were rejected: every series summarised is a count or total, so a value that is
    NaN, infinite or negative is damaged and not used."""
    last: dict[tuple, tuple[dict, float]] = {}
    rejected = 0
    columns = table.select(["name", "labels", "value"]).to_pylist()
    for row in columns:
        if row["name"] not in names:
            continue
        value = row["value"]
        if value is None or not math.isfinite(value) or value < 0:
            rejected += 1
            continue
        labels = dict(row["labels"] or [])
        key = (row["name"], *sorted((k, v) for k, v in labels.items() if k != "step"))
        last[key] = (labels, value)
    return last, rejected


def summarise(folder: str | Path, *, skip_damaged: bool = False) -> dict[str, Any]:
    """What a run cost so far, from its samples (every rank, every attempt, redone steps included).

    Returns cost_usd (Decimal, exact), cost (str, rounded to cents, with currency), currency,
    steps (optimizer steps completed), usd_per_1000_steps, energy_joules, energy_kwh,
    energy_sources (e.g. ["estimated"]), utilisation (step-time weighted mean), gpu_seconds
    (rank-seconds), data_wait_fraction, damaged_files (with `skip_damaged`: sample files that could
    not be read, left in place and not counted; without it such a file raises) and rejected_values
    (NaN, infinite or negative totals, not counted). Zeros and None when the run has no samples yet.
    """
    table, damaged = read_sample_files(folder, skip_damaged=skip_damaged)
    return summarise_table(table, damaged)


def summarise_table(table, damaged: list[str] | None = None) -> dict[str, Any]:
    """`summarise` of samples already read (`read_sample_files`): a reader that needs the table too
    reads the files once."""
    from seedance_tasks.telemetry.pricing import cents

    damaged = list(damaged or [])
    totals, rejected = _last_by_series(table, {"seedance_cost_usd_total", "seedance_energy_joules_total",
                                     "seedance_step_seconds_total", "seedance_phase_seconds_total",
                                     "seedance_busy_seconds_total", "seedance_step"})
    cost, energy, seconds, busy, data_wait, steps = Decimal(0), 0.0, 0.0, 0.0, 0.0, 0
    sources: set[str] = set()
    for (name, *_rest), (labels, value) in totals.items():
        if name == "seedance_cost_usd_total":
            cost += Decimal(repr(value))
        elif name == "seedance_energy_joules_total":
            energy += value
            sources.add(labels.get("source", "unknown"))
        elif name == "seedance_step_seconds_total":
            seconds += value
        elif name == "seedance_busy_seconds_total":
            busy += value
        elif name == "seedance_phase_seconds_total" and labels.get("phase") == "data":
            data_wait += value
        elif name == "seedance_step":
            steps = max(steps, int(value))
    per_1000 = cents(cost * 1000 / steps) if steps else None
    return {
        "cost_usd": cost,
        "cost": f"{cents(cost)} USD",
        "currency": "USD",
        "steps": steps,
        "usd_per_1000_steps": per_1000,
        "energy_joules": round(energy, 3),
        "energy_kwh": round(energy / 3.6e6, 6),
        "energy_sources": sorted(sources),
        "utilisation": round(busy / seconds, 4) if seconds else None,
        "rank_seconds": round(seconds, 3),
        "data_wait_fraction": round(data_wait / seconds, 4) if seconds else None,
        "damaged_files": damaged,
        "rejected_values": rejected,
    }
