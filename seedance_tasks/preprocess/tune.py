"""`seedance preprocess tune`: try a few I/O/CPU pool splits on a sample of the shards, pick the fastest."""

from __future__ import annotations

import time
from typing import Any

from seedance_tasks.preprocess.pipeline import Pipeline, Processed, available_cores
from seedance_tasks.preprocess.settings import PreprocessSettings
from seedance_tasks.shards.index import resolve_shards


def candidate_splits(cores: int, shards: int) -> list[tuple[int, int]]:
    """(io_workers, cpu_workers) pairs worth trying on `cores` cores and `shards` shards."""
    cpus = sorted({1, max(1, cores - 1), cores, cores + 1})
    ios = sorted({1, 2, 4} & set(range(1, max(1, shards) + 1))) or [1]
    return [(io, cpu) for cpu in cpus for io in ios]


def tune(shards_uri: str, *, settings: PreprocessSettings | None = None, samples: int | None = None,
         splits: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    """Run the pipeline (read, decode, resize, convert; no writing) on the first `samples` samples
    with each split; returns the table (samples/s and stage shares per split) and the best split.
    """
    settings = settings or PreprocessSettings()
    samples = samples or settings.tune_samples
    shard_set = resolve_shards(shards_uri)
    cores = available_cores()
    splits = splits or candidate_splits(cores, len(shard_set.shards))
    rows = []
    for io, cpu in splits:
        pipeline = Pipeline(shard_set.shards, size=settings.size, io_workers=io, cpu_workers=cpu,
                            batch_size=settings.batch_size, draft=settings.draft, max_samples=samples)
        started = time.perf_counter()
        count = sum(1 for item in pipeline if isinstance(item, Processed))
        elapsed = time.perf_counter() - started
        rows.append({"io_workers": io, "cpu_workers": cpu, "samples": count,
                     "samples_per_s": round(count / elapsed, 1) if elapsed > 0 else None,
                     "stage_shares": pipeline.times.shares()})
    best = max(rows, key=lambda row: row["samples_per_s"] or 0)
    return {"shards_uri": shards_uri, "cores": cores, "samples": samples, "table": rows,
            "chosen": {"io_workers": best["io_workers"], "cpu_workers": best["cpu_workers"]},
            "hint": f"seedance preprocess run ... --io-workers {best['io_workers']} --cpu-workers {best['cpu_workers']}"
                    f" (or SEEDANCE__PREPROCESS__IO_WORKERS / __CPU_WORKERS)"}
