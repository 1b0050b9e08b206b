"""Whole shards per worker process: the fast path of `seedance preprocess run` on local disk.

    shards (largest first) --> CPU processes: each reads one local shard, transforms every image
                               and writes that shard's staged output tar itself --> outcome per shard

The I/O-pool/CPU-pool `Pipeline` moves every sample through the parent (queues, pickled image
bytes, a shared-memory copy back, the tar write): about a quarter of the CPU a sample costs on
top of its transform. When the input shards and the output are on local disk and there are
enough shards to keep every worker busy, none of that is needed: a worker reads its shard with
the same checked readers (`pipeline.open_members`), calls the same `to_chw`, and writes the same
members through the same `TarShardWriter`, so the output bytes are identical to the Pipeline's.

What a worker hands back is small: the shard's figures (samples, size, sha256, failed samples
with their reasons) or the InputError/RefusedError that makes the shard bad (`ShardBad`: the
parent quarantines it; the partial output stays staged and is never published). Any other error
(disk full, permission denied, a bug) is raised by `run_shards`. A worker that dies (a crash in
the decoder, the OOM killer) loses the shards in flight: `run_shards` yields them as `None` once
every worker is gone, and the caller redoes them with the Pipeline, which isolates the image
that kills its worker (`WORKER_DIED`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

from seedance_tasks.errors import InputError, RefusedError
from seedance_tasks.preprocess.pipeline import StageTimes, exit_if_orphaned, new_executor, open_members
from seedance_tasks.shards.index import ShardRef

SHARDS_PER_WORKER = 2  # `auto` takes this path from this many shards per CPU worker up


@dataclass
class ShardWritten:
    """A shard done: its staged output is complete (closed and fsynced)."""

    samples_in: int  # samples read
    nsamples: int  # samples written
    filesize: int
    sha256: str
    failed: list[dict]  # {"shard", "key", "reason"} of each sample not written
    times: StageTimes = field(default_factory=StageTimes)
    cpu: float = 0.0  # the worker's CPU seconds for this shard


@dataclass
class ShardBad:
    """A shard that is hostile or unreadable: what the checked reader raised, as plain fields
    (a SeedanceError does not keep its hint through pickling)."""

    refused: bool
    message: str
    hint: str | None
    kind: str
    samples_in: int
    times: StageTimes = field(default_factory=StageTimes)
    cpu: float = 0.0
    member: str | None = None  # the member at fault, as the reader's error names it

    def error(self) -> InputError | RefusedError:
        """The error again, as the parent quarantines it."""
        if self.refused:
            error = RefusedError(self.message, hint=self.hint)
        else:
            error = InputError(self.message, hint=self.hint)
            error.kind = self.kind
        error.member = self.member
        return error


def applies(shards: list[ShardRef], out_fs, workers: int, *, forced: bool = False) -> str | None:
    """Why whole-shard mode cannot take these shards (None when it can): it needs local input
    shards and a local output, and (unless `forced`) at least `SHARDS_PER_WORKER` shards per
    worker, or the last shards would leave workers idle."""
    import pyarrow.fs as pafs

    if not isinstance(out_fs, pafs.LocalFileSystem):
        return "the output is not on local disk"
    if not all(isinstance(shard.location.fs, pafs.LocalFileSystem) for shard in shards):
        return "input shards are not on local disk"
    if not forced and len(shards) < SHARDS_PER_WORKER * workers:
        return f"{len(shards)} shard(s) for {workers} worker(s)"
    return None


def preprocess_shard(shard: ShardRef, staged: str, size: int, draft: bool) -> ShardWritten | ShardBad:
    """The worker's task: every sample of `shard` transformed and written to the local tar
    `staged` (`KEY.npy` with the sample's other members, as the Pipeline's consumer writes them).

    Returns ShardWritten, or ShardBad for a hostile or unreadable shard (the file at `staged` is
    then partial and closed). Raises any other error (the file is closed)."""
    import pyarrow.fs as pafs

    from seedance_tasks.preprocess.transform import (
        failure_reason,
        image_extension,
        no_image_reason,
        npy_header,
        output_clash,
        to_chw,
    )
    from seedance_tasks.shards.tario import TarShardWriter, iter_samples, open_sink

    exit_if_orphaned()  # a shard queued before a SIGKILL of the run: its attempt is being rolled back
    cpu_started = time.process_time()
    times = StageTimes()
    stages = [0.0, 0.0, 0.0]  # decode, resize, convert, as `to_chw` adds them
    header = npy_header(size)
    failed: list[dict] = []
    seen = 0
    bad: InputError | RefusedError | None = None
    sink = open_sink(pafs.LocalFileSystem(), staged)
    try:
        writer = TarShardWriter(sink)
        with open_members(shard) as members:
            samples = iter_samples(members, shard.uri)
            while True:
                t0 = time.perf_counter()
                sample = next(samples, None)
                times.read += time.perf_counter() - t0
                if sample is None:
                    break
                seen += 1
                ext = image_extension(sample.members)
                if ext is None:
                    failed.append({"shard": shard.uri, "key": sample.key, "reason": no_image_reason(sample.members)})
                    continue
                image = sample.members.pop(ext)
                if (clash := output_clash(sample.key, sample.members)) is not None:
                    failed.append({"shard": shard.uri, "key": sample.key, "reason": clash})
                    continue
                try:
                    array = to_chw(image, size, draft=draft, timings=stages)
                except Exception as exc:  # noqa: BLE001 - any undecodable image is reported, not fatal
                    failed.append({"shard": shard.uri, "key": sample.key,
                                   "reason": f"{sample.key}.{ext}: {failure_reason(exc, image)}"})
                    continue
                t0 = time.perf_counter()
                writer.add_sample(sample.key, {**sample.members, "npy": (header, array.reshape(-1))})
                times.write += time.perf_counter() - t0
        t0 = time.perf_counter()
        writer.close()
        sink.close()
        times.write += time.perf_counter() - t0
    except (InputError, RefusedError) as exc:
        bad = exc
    finally:
        sink.close()  # already closed unless something raised
        times.decode, times.resize, times.convert = stages
    cpu = time.process_time() - cpu_started
    if bad is not None:
        return ShardBad(isinstance(bad, RefusedError), bad.message, bad.hint, getattr(bad, "kind", "unreadable"),
                        seen, times, cpu, getattr(bad, "member", None))
    return ShardWritten(seen, writer.samples, writer.size, writer.sha256.hexdigest(), failed, times, cpu)


def run_shards(jobs: list[tuple[int, ShardRef, str]], *, size: int, draft: bool, workers: int
               ) -> Iterator[tuple[int, ShardWritten | ShardBad | None]]:
    """Run `preprocess_shard` over `jobs` ((number, shard, staged path)) in `workers` processes,
    largest shard first; yields (number, outcome) as each finishes.

    Outcome None: a worker died while the pool had that shard; every such shard comes last, once
    no worker is left (none is still writing its staged file). Any other error a worker raises
    is raised here, after the pool is stopped. Close the iterator (`contextlib.closing`) when
    leaving early: the workers are stopped then too.
    """
    executor = new_executor(workers)
    lost: list[int] = []
    finished = False
    try:
        order = sorted(jobs, key=lambda job: -(job[1].size or 0))
        pending: dict[Future, int] = {executor.submit(preprocess_shard, shard, staged, size, draft): number
                                      for number, shard, staged in order}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                number = pending.pop(future)
                try:
                    outcome = future.result()
                except BrokenProcessPool:
                    lost.append(number)
                    continue
                yield number, outcome
        finished = True
    finally:
        if not finished:
            _stop_workers(executor)
        executor.shutdown(wait=True, cancel_futures=True)
    for number in sorted(lost):
        yield number, None


def _stop_workers(executor) -> None:
    """Terminate the pool's processes now instead of letting each finish its whole shard."""
    processes = list((getattr(executor, "_processes", None) or {}).values())  # no public way before 3.14
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
