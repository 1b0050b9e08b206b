"""Pool sizing: CPU workers from the cores, I/O threads from a short measurement of read vs. CPU cost."""

from __future__ import annotations

import math
import time

from seedance_tasks.errors import InputError, RefusedError
from seedance_tasks.preprocess.pipeline import available_cores
from seedance_tasks.shards.index import ShardRef
from seedance_tasks.shards.tario import iter_members, iter_samples

MAX_IO_WORKERS = 8


def measure(shard: ShardRef, size: int, *, samples: int = 16, draft: bool = True) -> dict[str, float]:
    """Seconds per sample to read (`io`, first sample's open latency included) and to transform (`cpu`).

    Never raises for a hostile or unreadable shard (the pipeline quarantines it): it measures the
    samples read before the problem, if any."""
    from seedance_tasks.preprocess.transform import image_extension, to_chw

    images = []
    started = time.perf_counter()
    try:
        with shard.location.fs.open_input_stream(shard.location.path) as stream:
            for sample in iter_samples(iter_members(stream, shard.uri), shard.uri):
                ext = image_extension(sample.members)
                if ext:
                    images.append(sample.members[ext])
                if len(images) >= samples:
                    break
    except (InputError, RefusedError):  # a hostile or broken shard is the pipeline's to quarantine
        pass  # the samples read before the problem still measure
    read = (time.perf_counter() - started) / max(1, len(images))
    started = time.perf_counter()
    done = 0
    for data in images[:4]:
        try:
            to_chw(data, size, draft=draft)
            done += 1
        except Exception:  # a bad image is the pipeline's to report; here it only skews the estimate
            pass
    cpu = (time.perf_counter() - started) / done if done else 0.0  # 0: nothing measured, ratio 1
    return {"io": read, "cpu": cpu}


def choose_pools(
    shards: list[ShardRef], size: int, *, io_workers: int = 0, cpu_workers: int = 0, draft: bool = True
) -> dict:
    """The pool sizes to use: given values win; else CPU = cores, I/O = enough threads to feed them.

    Returns {"io_workers", "cpu_workers", "basis"}; `basis` says how they were chosen.
    """
    cores = available_cores()
    cpu = cpu_workers or cores
    if io_workers:
        return {"io_workers": io_workers, "cpu_workers": cpu, "basis": f"given; {cores} core(s)"}
    if not shards:
        return {"io_workers": 1, "cpu_workers": cpu, "basis": "no shards"}
    cost = measure(shards[0], size, draft=draft)
    ratio = cost["io"] / cost["cpu"] if cost["cpu"] > 0 else 1.0
    io = max(1, min(MAX_IO_WORKERS, len(shards), math.ceil(cpu * ratio)))
    basis = (f"{cores} core(s); read {cost['io'] * 1e3:.2f} ms/sample, transform {cost['cpu'] * 1e3:.2f} ms/sample"
             f" -> {io} I/O thread(s) keep {cpu} CPU worker(s) busy")
    return {"io_workers": io, "cpu_workers": cpu, "basis": basis}
