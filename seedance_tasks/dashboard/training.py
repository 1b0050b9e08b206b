"""The training view: per training run, its cost so far, $ per 1,000 steps, energy and utilisation.

Read from the telemetry the reference trainer writes (`seedance_tasks.telemetry`): the Parquet
samples of `<run folder>/telemetry/`, summed by the telemetry's own `summarise` (every rank, every
attempt, redone steps included), so the page shows what the DAG's summary shows. Run folders are
`<training.log_dir>/<run>/` (the DAG's layout), or the log folder itself when one launch wrote it.
The energy source (nvml, rapl, estimated) is carried as written; an estimate stays labelled.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from seedance_tasks.errors import InputError

TELEMETRY = "telemetry"
CHART_POINTS = 120  # points of the cost-over-steps line at most (evenly thinned)
MAX_RUNS = 200
"""Runs a training page reads per log root at most: the newest (by their telemetry folder's last
change); the page says how many older ones it leaves out, so years of runs never make it take minutes."""
_CACHE_SIZE = 2 * MAX_RUNS
_cache: OrderedDict[str, tuple[tuple, TrainingRun]] = OrderedDict()
_cache_lock = threading.Lock()
GPU_SOURCES = ("nvml", "compute_fraction")  # utilisation sources that measure a GPU (cpu_time: the CPU)


@dataclass
class TrainingRun:
    """One run's telemetry: the summary's figures, where its samples are, and its cost over steps."""

    name: str
    folder: str
    steps: int
    cost: Decimal
    currency: str
    per_1000_steps: Decimal | None
    energy_kwh: Decimal
    energy_sources: list[str]
    utilisation: float | None
    devices: list[str]  # "GPU" and/or "CPU": what the utilisation measures
    ranks: int
    attempts: int
    last_sample: datetime | None
    cost_by_step: list[tuple[int, Decimal]] = field(default_factory=list)

    @property
    def estimated(self) -> bool:
        """True when any of the energy is an estimate (TDP x utilisation), not a counter."""
        return "estimated" in self.energy_sources or not self.energy_sources


def _local_folder(uri: str) -> Path:
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    if "://" in uri:
        raise InputError(f"training run folder {uri!r} is not on local disk",
                         hint="set training.log_dir to the local folder the training runs write (telemetry is local)")
    return Path(uri)


def run_folders(uri: str) -> list[Path]:
    """The run folders under a training log root: itself if it has `telemetry/`, else each child that has.
    A run folder or `telemetry/` folder that is a symlink is not followed (`training_runs` names it)."""
    return _scan(uri)[0]


def _scan(uri: str) -> tuple[list[Path], list[Path]]:
    """(run folders, would-be run folders that are or hold a symlink) under a training log root."""
    root = _local_folder(uri)
    if not root.is_dir():
        raise InputError(f"training log folder {uri} does not exist",
                         hint="check training.log_dir (or the DAG's log_dir); it is made by the first run")
    if (root / TELEMETRY).is_dir() and not (root / TELEMETRY).is_symlink():
        return [root], []
    found = [child for child in root.iterdir() if child.is_dir() and (child / TELEMETRY).is_dir()]
    linked = [child for child in found if child.is_symlink() or (child / TELEMETRY).is_symlink()]
    return sorted(child for child in found if child not in linked), sorted(linked)


def _label_values(table, key: str) -> set[str]:
    """The distinct values of label `key` among the samples of `table`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not table.num_rows:
        return set()
    return set(pc.unique(pc.map_lookup(table["labels"], pa.scalar(key), "first")).drop_null().to_pylist())


def _cost_by_step(table) -> list[tuple[int, Decimal]]:
    """(highest step reached, cost so far summed over every rank and attempt) after each recorded step."""
    import pyarrow.compute as pc

    rows = table.filter(pc.equal(table["name"], "seedance_cost_usd_total")).sort_by("timestamp").to_pylist()
    last: dict[tuple[str, str], float] = {}
    reached, points = 0, []
    for row in rows:
        labels = dict(row["labels"] or [])
        step = labels.get("step", "0")
        if not (step.isascii() and step.isdigit()):
            raise ValueError(f"a seedance_cost_usd_total sample has the step label {step[:40]!r}, not a step number")
        last[(labels.get("rank", ""), labels.get("attempt", ""))] = row["value"]
        reached = max(reached, int(step))
        total = sum((Decimal(repr(value)) for value in last.values()), Decimal(0))
        if points and points[-1][0] == reached:
            points[-1] = (reached, total)
        else:
            points.append((reached, total))
    if len(points) > CHART_POINTS:
        stride = (len(points) - 1) / (CHART_POINTS - 1)
        points = [points[round(i * stride)] for i in range(CHART_POINTS)]
    return points


def read_run(folder: str | Path) -> TrainingRun:
    """The figures of one run folder, from its telemetry samples (zeros when it has none yet).

    Sample files are untrusted: one that is not Parquet, has another schema, or holds a value the
    figures cannot use (a step label that is no number, a timestamp past year 9999) is an
    InputError naming the run's telemetry folder, never another exception."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from seedance_tasks.telemetry.samples import read_samples, summarise_table

    folder = Path(folder)
    telemetry = folder / TELEMETRY
    try:
        table = read_samples(telemetry)  # once: the summary is made of the same table
        summary = summarise_table(table)
        names, ranks, attempts = (_label_values(table, key) for key in ("run", "rank", "attempt"))
        sources = _label_values(table.filter(pc.equal(table["name"], "seedance_utilisation_ratio")), "source")
        devices = sorted({"GPU" if source in GPU_SOURCES else "CPU" for source in sources})
        last = pc.max(table["timestamp"]).as_py() if table.num_rows else None
        return TrainingRun(
            name=", ".join(sorted(names)) or folder.name, folder=str(folder), steps=summary["steps"],
            cost=summary["cost_usd"], currency=summary["currency"], per_1000_steps=summary["usd_per_1000_steps"],
            energy_kwh=Decimal(str(summary["energy_kwh"])), energy_sources=summary["energy_sources"],
            utilisation=summary["utilisation"], devices=devices, ranks=len(ranks), attempts=len(attempts),
            last_sample=last.astimezone(UTC) if last else None, cost_by_step=_cost_by_step(table))
    # a corrupt or foreign Parquet file among the samples (ArrowNotImplementedError: a column of
    # another type that cannot be cast), or a value out of range (OverflowError: a timestamp)
    except (OSError, ValueError, ArithmeticError, pa.ArrowException) as exc:
        raise InputError(f"{telemetry}: telemetry samples unreadable ({exc})",
                         hint="move the bad samples-*.parquet file aside; the others are read again") from exc


def _signature(telemetry: Path) -> tuple:
    """What a run's figures depend on: the name, size and modification time of each sample file."""
    found = []
    with os.scandir(telemetry) as entries:
        for entry in entries:
            if entry.name.startswith("samples-") and entry.name.endswith(".parquet"):
                info = entry.stat(follow_symlinks=False)
                found.append((entry.name, info.st_size, info.st_mtime_ns, entry.is_symlink()))
    return tuple(sorted(found))


def cached_run(folder: Path) -> TrainingRun:
    """`read_run(folder)`, read again only when a sample file of it was added, removed or changed
    since the last call (a finished run's figures are read once per server, not per page view)."""
    key = str(folder)
    signature = _signature(folder / TELEMETRY)
    with _cache_lock:
        hit = _cache.get(key)
        if hit and hit[0] == signature:
            _cache.move_to_end(key)
            return hit[1]
    run = read_run(folder)
    with _cache_lock:
        _cache[key] = (signature, run)
        _cache.move_to_end(key)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return run


def _newest(folders: list[Path], limit: int) -> tuple[list[Path], int]:
    """The `limit` run folders whose telemetry changed last, and how many older ones are left out."""
    if len(folders) <= limit:
        return folders, 0

    def changed(folder: Path) -> int:
        try:
            return (folder / TELEMETRY).stat().st_mtime_ns
        except OSError:
            return 0

    return sorted(folders, key=changed, reverse=True)[:limit], len(folders) - limit


def training_runs(uri: str, limit: int | None = None) -> tuple[list[TrainingRun], list[str]]:
    """The newest `limit` (default MAX_RUNS) runs under a training log root (newest sample first) and
    an `error:` line per unreadable run, plus a `note:` line saying how many older runs were left out."""
    limit = MAX_RUNS if limit is None else limit
    folders, linked = _scan(uri)
    folders, older = _newest(folders, limit)
    runs, errors = [], [f"error: {folder}: a symlink (or one holding a symlinked telemetry/ folder): not followed, "
                        "it may lead out of the training log folder hint: move the run folder itself there"
                        for folder in linked]
    if older:
        errors.append(f"note: the {limit:,} runs whose telemetry changed last are shown; {older:,} older runs "
                      "are left out")
    for folder in folders:
        try:
            runs.append(cached_run(folder))
        except (InputError, OSError) as exc:
            message = exc.message if isinstance(exc, InputError) else f"{folder}: {exc}"
            hint = exc.hint if isinstance(exc, InputError) else "check the run folder's permissions"
            errors.append(f"error: {message} hint: {hint}")
    oldest = datetime.min.replace(tzinfo=UTC)
    runs.sort(key=lambda run: (run.last_sample or oldest, run.name), reverse=True)
    return runs, errors
