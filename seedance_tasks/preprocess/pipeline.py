"""The pipeline: an I/O pool (threads) feeding a CPU pool (processes) through bounded queues.

    shards --I/O threads: fetch + split into samples--> [sample queue, bounded]
           --dispatcher: batches of image bytes--> CPU processes: decode, resize, to uint8 CHW
           --[at most `inflight` batches]--> consumer (writer or training loop), in submission order

Each I/O thread streams one shard at a time (local or `s3://`, one sequential read per shard) and
checks every tar header as it goes (`shards.tario`). Only the image bytes travel to the worker
processes; the sample's other members wait in the parent. Queues are bounded, so a slow consumer
slows the readers down instead of filling memory. Every sample read comes out exactly once, as a
`Processed` with either its array or the reason it failed; a worker process that dies on an image
(a crash in the decoder, the OOM killer) fails only that image: its batch is decoded again, image
by image, in a new pool (`WORKER_DIED`), and the run goes on. A shard that turns out hostile or
unreadable (a RefusedError/InputError of the checked reader) either stops the pipeline with that
error (`on_bad_shard="raise"`, the default) or comes out as one `ShardFailed` after the samples
read from it before the problem, and the readers go on with the other shards
(`on_bad_shard="report"`, what `seedance preprocess run` uses).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

from seedance_tasks.errors import InputError, RefusedError
from seedance_tasks.preprocess.localtar import iter_local_members
from seedance_tasks.shards.index import ShardRef
from seedance_tasks.shards.tario import iter_members, iter_samples

_STOP = object()
WORKER_DIED = ("error: the worker process decoding it died (killed, e.g. out of memory, or a crash in the "
               "decoder); the other images of its batch were decoded again")


@dataclass
class Processed:
    """One sample out of the pipeline: `array` (raw uint8 bytes, shape (3, size, size)) or `error`."""

    shard: int  # index into the pipeline's shard list
    key: str
    array: bytes | None
    error: str | None
    members: dict[str, bytes]  # the sample's other (non-image) members


@dataclass
class ShardDone:
    """Marker: the I/O pool has read all `samples` samples of shard number `shard`."""

    shard: int
    samples: int


@dataclass
class ShardFailed:
    """Marker: shard number `shard` is hostile or unreadable (`error`); no more of its samples follow.

    The samples read from it before the problem came out before this marker; a consumer that
    writes the shard discards them. Only with `on_bad_shard="report"`."""

    shard: int
    error: InputError | RefusedError


@dataclass
class StageTimes:
    """Busy seconds per stage, summed over the pool's threads/processes."""

    read: float = 0.0  # I/O threads: fetching and splitting tars
    decode: float = 0.0
    resize: float = 0.0
    convert: float = 0.0
    write: float = 0.0  # the consumer's own time, if it reports it
    extra: dict[str, float] = field(default_factory=dict)

    def merge(self, other: StageTimes) -> None:
        """Add `other`'s stage seconds to these."""
        self.read += other.read
        self.decode += other.decode
        self.resize += other.resize
        self.convert += other.convert
        self.write += other.write

    def shares(self) -> dict[str, float]:
        stages = {"read": self.read, "decode": self.decode, "resize": self.resize, "convert": self.convert,
                  "write": self.write}
        total = sum(stages.values()) or 1.0
        return {name: round(value / total, 3) for name, value in stages.items()}


def available_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parent_gone(parent_pid: int) -> bool:
    """Whether the process `parent_pid` has died: no such process, or (Linux) a zombie that its
    own parent has not reaped yet. A dead parent stays a zombie while whoever started it waits
    for its output to end (`subprocess.run(capture_output=True)` of a killed run): counted alive,
    its workers would keep that output open, and both would wait for ever."""
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # a process with that id exists (owned by someone else)
        return False
    try:
        with open(f"/proc/{parent_pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]  # the field after "(command)"
    except (OSError, IndexError):  # not Linux, or gone in between (the next look says so)
        return False
    return state in (b"Z", b"X")


_pool_parent: int | None = None  # in a pool's worker: the pid of the process that started the pool


def exit_if_orphaned() -> None:
    """In a pool's worker, exit now if the process that started the pool has died: a task queued
    before it died must not start writing (its output would outlive the attempt's rollback)."""
    if _pool_parent is not None and parent_gone(_pool_parent):
        os._exit(1)


def _pool_initializer(parent_pid: int) -> None:
    """Worker setup: leave Ctrl-C to the parent, and exit within a second or so once the parent
    dies (even by SIGKILL, even while it is an unreaped zombie), so no orphaned worker outlives an
    interrupted run or a killed Airflow task."""
    import signal

    global _pool_parent
    _pool_parent = parent_pid
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if parent_gone(parent_pid):
                os._exit(1)

    threading.Thread(target=watch, name="seedance-parent-watch", daemon=True).start()


def new_executor(workers: int) -> ProcessPoolExecutor:
    """A pool of `workers` CPU processes (forkserver), each leaving Ctrl-C to this process and
    exiting once it dies (`_pool_initializer`)."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    # The fork server imports numpy and PIL once; each worker forked from it shares them instead
    # of importing them again (about 0.1 s of CPU per worker). No effect once the process's fork
    # server runs.
    context.set_forkserver_preload(["__main__", "seedance_tasks.preprocess.transform",
                                    "seedance_tasks.preprocess.shardwise"])
    return ProcessPoolExecutor(workers, mp_context=context, initializer=_pool_initializer, initargs=(os.getpid(),))


@contextlib.contextmanager
def open_members(shard: ShardRef) -> Iterator[Iterator[tuple[str, bytes]]]:
    """The shard's (name, data) members: memory-mapped if it is a plain local tar
    (`localtar`), else streamed through the checked reader `tario.iter_members`."""
    import pyarrow.fs as pafs

    members = None
    if isinstance(shard.location.fs, pafs.LocalFileSystem):
        members = iter_local_members(shard.location.path)
    if members is not None:
        try:
            yield members
        finally:
            members.close()
        return
    with shard.location.fs.open_input_stream(shard.location.path) as stream:
        yield iter_members(stream, shard.uri)


class Pipeline:
    """Iterate over `shards` through the two pools; yields `Processed` and `ShardDone` items.

    `io_workers` threads read shards; `cpu_workers` processes transform images in batches of
    `batch_size`. `max_samples` stops reading after that many samples (for tuning). A shard that
    is hostile or unreadable stops the pipeline with its RefusedError/InputError, or with
    `on_bad_shard="report"` yields one `ShardFailed` for it (after the samples already read from
    it) and the pipeline goes on with the other shards. Any other error (storage down, a bug)
    stops the pipeline either way. Use as an iterator (once) or call `close()` to stop early; the
    pools are shut down either way.
    """

    def __init__(
        self,
        shards: list[ShardRef],
        *,
        size: int = 224,
        io_workers: int = 2,
        cpu_workers: int = 2,
        batch_size: int = 32,
        draft: bool = True,
        max_samples: int | None = None,
        image_ext: str | None = None,
        on_bad_shard: str = "raise",
    ):
        if io_workers < 1 or cpu_workers < 1:
            raise ValueError("io_workers and cpu_workers must be at least 1")
        if on_bad_shard not in ("raise", "report"):
            raise ValueError(f"on_bad_shard must be 'raise' or 'report', not {on_bad_shard!r}")
        self.on_bad_shard = on_bad_shard
        self.shards = shards
        self.size = size
        self.io_workers = io_workers
        self.cpu_workers = cpu_workers
        self.batch_size = batch_size
        self.draft = draft
        self.max_samples = max_samples
        self.image_ext = image_ext
        self.times = StageTimes()
        self.samples_read = 0
        self.wall = 0.0
        self.worker_cpu = 0.0  # CPU seconds the worker processes spent on batches
        self._stop = threading.Event()
        self._samples: queue.Queue = queue.Queue(maxsize=2 * batch_size * cpu_workers)
        self._results: queue.Queue = queue.Queue()
        # Results come back through shared memory: one slot per batch in flight, each holding
        # `batch_size` arrays; the free-slot queue bounds the batches in flight.
        self._slots: list = []
        self._free_slots: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._executor: ProcessPoolExecutor | None = None
        self._executor_lock = threading.Lock()  # the consumer replaces a broken pool while the dispatcher submits

    # ------------------------------------------------------------------ I/O pool
    def _put(self, target: queue.Queue, item) -> bool:
        while not self._stop.is_set():
            try:
                target.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _reader(self, work: queue.Queue) -> None:
        while not self._stop.is_set():
            if self.max_samples is not None and self.samples_read >= self.max_samples:
                break
            try:
                number = work.get_nowait()
            except queue.Empty:
                break
            shard = self.shards[number]
            count, busy, started = 0, 0.0, time.perf_counter()
            try:
                with open_members(shard) as members:
                    for sample in iter_samples(members, shard.uri):
                        with self._lock:
                            if self.max_samples is not None and self.samples_read >= self.max_samples:
                                break
                            self.samples_read += 1
                        count += 1
                        blocked = time.perf_counter()
                        busy += blocked - started
                        if not self._put(self._samples, (number, sample)):
                            return
                        started = time.perf_counter()
                busy += time.perf_counter() - started
            except (InputError, RefusedError) as exc:  # this shard is bad; with "report", the others go on
                if self.on_bad_shard == "raise":
                    self._put(self._samples, exc)
                    return
                if not self._put(self._samples, ShardFailed(number, exc)):
                    return
                continue
            except BaseException as exc:  # handed to the consumer, which raises it
                self._put(self._samples, exc)
                return
            finally:
                with self._lock:
                    self.times.read += busy
            self._put(self._samples, ShardDone(number, count))
        self._put(self._samples, _STOP)

    # ------------------------------------------------------------------ dispatcher
    def _submit(self, batch: list) -> bool:
        from seedance_tasks.preprocess.transform import process_batch

        while True:
            try:
                slot = self._free_slots.get(timeout=0.1)
                break
            except queue.Empty:
                if self._stop.is_set():
                    return False
        images = [image for _number, _key, _ext, image, _members in batch]
        with self._executor_lock:
            executor = self._executor
        try:
            future = executor.submit(process_batch, images, self.size, self.draft, self._slots[slot].name)
        except BrokenProcessPool as exc:  # a worker died; the consumer renews the pool when it gets this
            future = Future()
            future.set_exception(exc)
        return self._put(self._results, (future, batch, slot, executor))

    def _dispatcher(self, readers: int) -> None:
        from seedance_tasks.preprocess.transform import image_extension, no_image_reason

        batch: list = []
        finished = 0
        try:
            while finished < readers and not self._stop.is_set():
                try:
                    item = self._samples.get(timeout=0.02 if batch else 0.1)
                except queue.Empty:
                    if batch and not self._submit(batch):
                        return
                    batch = []
                    continue
                if item is _STOP:
                    finished += 1
                    continue
                if isinstance(item, ShardDone | ShardFailed | BaseException):
                    if batch and not self._submit(batch):
                        return
                    batch = []
                    self._put(self._results, item)
                    continue
                number, sample = item
                ext = self.image_ext if self.image_ext in sample.members else image_extension(sample.members)
                if ext is None:
                    self._put(self._results, Processed(number, sample.key, None, no_image_reason(sample.members),
                                                       sample.members))
                    continue
                others = {name: data for name, data in sample.members.items() if name != ext}
                batch.append((number, sample.key, ext, sample.members[ext], others))
                if len(batch) >= self.batch_size:
                    if not self._submit(batch):
                        return
                    batch = []
            if batch:
                self._submit(batch)
        except BaseException as exc:
            self._put(self._results, exc)
        self._put(self._results, _STOP)

    # ------------------------------------------------------------------ consumer side
    def __iter__(self) -> Iterator[Processed | ShardDone | ShardFailed]:
        from multiprocessing import shared_memory

        started = time.perf_counter()
        slot_bytes = self.batch_size * 3 * self.size * self.size
        self._slots = [shared_memory.SharedMemory(create=True, size=slot_bytes) for _ in range(self.cpu_workers + 2)]
        for slot in range(len(self._slots)):
            self._free_slots.put(slot)
        self._executor = self._new_executor()
        work: queue.Queue = queue.Queue()
        for number in range(len(self.shards)):
            work.put(number)
        readers = max(1, min(self.io_workers, len(self.shards)))
        self._threads = [
            threading.Thread(target=self._reader, args=(work,), name=f"seedance-io-{i}", daemon=True)
            for i in range(readers)
        ]
        self._threads.append(
            threading.Thread(target=self._dispatcher, args=(readers,), name="seedance-dispatch", daemon=True)
        )
        for thread in self._threads:
            thread.start()
        try:
            while True:
                item = self._results.get()
                if item is _STOP:
                    break
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, ShardDone | ShardFailed | Processed):
                    yield item
                    continue
                future, batch, slot, executor = item
                yield from self._unpack(future, batch, slot, executor)
        finally:
            self.close()
            self.wall = time.perf_counter() - started

    def _new_executor(self, workers: int | None = None) -> ProcessPoolExecutor:
        return new_executor(workers or self.cpu_workers)

    def _renew(self, broken: ProcessPoolExecutor) -> ProcessPoolExecutor:
        """The pool to use now that `broken` lost a worker: a new one, unless already replaced."""
        with self._executor_lock:
            if self._stop.is_set():
                raise RuntimeError("the pipeline was closed")
            if self._executor is broken:
                broken.shutdown(wait=False, cancel_futures=True)
                self._executor = self._new_executor()
            return self._executor

    def _isolate(self, batch: list, broken: ProcessPoolExecutor) -> tuple[list, list[float]]:
        """The entries of a batch whose worker died: each image decoded again alone, in a worker
        of its own, so the one that kills its worker again is the only one reported
        (`WORKER_DIED`), not its batch nor an image of another batch."""
        from seedance_tasks.preprocess.transform import process_batch

        self._renew(broken)  # for the dispatcher's next batches
        alone = self._new_executor(1)
        outputs, timings = [], [0.0, 0.0, 0.0, 0.0]
        try:
            for _number, _key, _ext, image, _members in batch:
                try:
                    (output,), times = alone.submit(process_batch, [image], self.size, self.draft).result()
                except BrokenProcessPool:
                    alone.shutdown(wait=False, cancel_futures=True)
                    alone, output, times = self._new_executor(1), WORKER_DIED, [0.0, 0.0, 0.0, 0.0]
                outputs.append(output)
                timings = [total + more for total, more in zip(timings, times, strict=True)]
        finally:
            alone.shutdown(wait=True, cancel_futures=True)
        return outputs, timings

    def _unpack(self, future: Future, batch: list, slot: int, executor: ProcessPoolExecutor) -> Iterator[Processed]:
        nbytes = 3 * self.size * self.size
        try:
            try:
                outputs, timings = future.result()
            except BrokenProcessPool:
                outputs, timings = self._isolate(batch, executor)  # bytes or error strings: no slot used
            else:
                buffer = self._slots[slot].buf
                outputs = [output if isinstance(output, str) else bytes(buffer[index * nbytes : (index + 1) * nbytes])
                           for index, output in enumerate(outputs)]
                del buffer  # no view may outlive the slot (close() unmaps it)
        finally:
            self._free_slots.put(slot)
        self.times.decode += timings[0]
        self.times.resize += timings[1]
        self.times.convert += timings[2]
        self.worker_cpu += timings[3]
        for (number, key, ext, _image, others), output in zip(batch, outputs, strict=True):
            if isinstance(output, str):  # the reason names the member: `KEY.EXT: why`
                yield Processed(number, key, None, f"{key}.{ext}: {output.removeprefix('error: ')}", others)
            else:
                yield Processed(number, key, output, None, others)

    def close(self) -> None:
        """Stop the pools (also on early exit); safe to call twice."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        with self._executor_lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        for slot in self._slots:
            slot.close()
            slot.unlink()
        self._slots = []

