"""`seedance shards build`: pack samples into WebDataset tar shards of about a target size.

One writer per output: the build holds the output's `dataset` lease (holder: the CLI run's id,
or the DAG run's `airflow:<dag>:<run>`, so an Airflow retry takes its own lease back) and a
second build into the same output is refused naming the holder (or waits, `wait_s`).

Each attempt is one journaled transaction with its own id and staged names: shards are written
under hidden names, each recorded in the journal before it is started; the index
(`shardindex.json`, wids form) is staged too and published last, in the same journal, so a
reader that sees the index sees every shard it lists, and an attempt killed anywhere (even in
the middle of its publish) is rolled back or forward by the next attempt, which then finds the
build complete. Building the same source with the same settings again is a no-op (the index
records a fingerprint of both); building something else into a directory that already holds
shards is refused, so nothing is overwritten. Builds are deterministic (fixed mtime, sorted
members), so shards rebuilt after a crash are byte-identical to a clean build.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from seedance_tasks import faults, journal, lease, storage
from seedance_tasks.errors import IntegrityError, RefusedError, UsageError
from seedance_tasks.shards import index as shard_index
from seedance_tasks.shards.buckets import refuse_missing_bucket
from seedance_tasks.shards.checks import sample_checker
from seedance_tasks.shards.settings import MIN_SHARD_SIZE, ShardSettings
from seedance_tasks.shards.sources import iter_source_samples, open_source, special_kind
from seedance_tasks.shards.tario import END_OF_ARCHIVE, TarShardWriter, open_sink, sample_bytes

log = logging.getLogger(__name__)

JOURNAL_KIND = "shards"
LEASE_NAME = "dataset"
WRITE_BUFFER = 8 * 1024 * 1024


def coerce_settings(settings: ShardSettings | dict | None) -> ShardSettings:
    """`settings` as ShardSettings: a dict (JSON callers, tasks) is validated; None gives the defaults."""
    if settings is None:
        return ShardSettings()
    return settings if isinstance(settings, ShardSettings) else ShardSettings.model_validate(settings)


def _fingerprint(source, settings: ShardSettings, shuffle: bool, seed: int) -> str:
    doc = {
        "source": source.fingerprint_items(),
        "kind": source.kind,
        "settings": settings.model_dump(mode="json"),
        "shuffle": shuffle,
        "seed": seed if shuffle else None,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _refuse_out_in_source(src: str, out: str, source_loc, out_loc) -> None:
    """UsageError if OUT is SRC or below it: a rebuild would then read the first build's shards."""
    if source_loc.scheme != out_loc.scheme:
        return
    real = os.path.realpath if source_loc.scheme == "file" else (lambda path: path)
    source_path, out_path = real(source_loc.path).rstrip("/"), real(out_loc.path).rstrip("/")
    if out_path == source_path or out_path.startswith(source_path + "/"):
        raise UsageError(f"--out {out} is inside the source {src}",
                         hint="write the shards outside SRC (e.g. next to it, SRC-shards)")


def _refuse_out_not_directory(out: str, out_loc) -> None:
    """UsageError if OUT, or the nearest of its parents that exists, is on local disk and is not a
    directory (a file, a FIFO, a device): no shard could be written below it."""
    if out_loc.scheme != "file":
        return
    path = out_loc.path
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        what = "it" if path == out_loc.path else f"its parent {path}"
        raise UsageError(f"--out {out}: {what} is a {special_kind(path)}, not a directory",
                         hint="write the shards into a directory (a new one, or an empty one)")


def _existing(out) -> dict | None:
    index = out.child(shard_index.INDEX_NAME)
    if storage.is_file(out.fs, index.path):
        return storage.read_json(out.fs, index.path)
    return None


def build(
    src: str,
    out: str,
    *,
    settings: ShardSettings | dict | None = None,
    shuffle: bool = False,
    seed: int = 0,
    read_workers: int | None = None,
    check_decode: bool | None = None,
    holder: str | None = None,
    wait_s: float = 0.0,
    advance: Callable[[float], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Pack the samples of `src` into shards under `out`; returns a summary (shards, samples, rejected).

    Guarantees: every good sample is in exactly one shard; every shard is at most
    `settings.shard_size` bytes (tar headers included) unless one sample alone is larger; samples
    that are incomplete, unreadable, symlinked or (with `check_decode`, default
    `settings.check_decode`) hold an image that does not decode are listed in `rejected` and in a
    report under `out/_seedance/reports/`; nothing becomes visible before every shard and the
    index are written. `holder` owns the output's lease (default: this run's id); another
    holder's build into `out` raises LeaseHeldError naming it, after waiting up to `wait_s`.
    Safe to run again after a crash or an error anywhere: the rerun finishes or undoes it.
    `advance(bytes)` follows the input bytes packed; `on_progress(done, total)` too, in bytes
    of the source's files.
    """
    settings = coerce_settings(settings)
    if check_decode is not None:
        settings = settings.model_copy(update={"check_decode": bool(check_decode)})
    if settings.shard_size < MIN_SHARD_SIZE:  # settings made by model_copy skip the model's own check
        raise UsageError(f"shard size {settings.shard_size} bytes is too small", hint="use at least a few MiB")
    started = time.perf_counter()
    out_loc = storage.resolve(out)
    _refuse_out_in_source(src, out, storage.resolve(src), out_loc)
    _refuse_out_not_directory(out, out_loc)
    refuse_missing_bucket(out_loc, f"the shards' output {out}")
    source = open_source(src, required=settings.required_members, key_column=settings.key_column,
                         max_member_size=int(settings.max_member_size))
    if read_workers is None:  # local reads are memory copies: 2 threads; S3 GETs wait on the network: 8
        read_workers = 8 if source.location.is_s3 else 2
    fingerprint = _fingerprint(source, settings, shuffle, seed)
    run_id = storage.new_run_id()
    with lease.holding(out_loc, LEASE_NAME, holder=holder or run_id, purpose=f"seedance shards build from {src}",
                       wait_s=wait_s) as held:
        recovered = journal.recover(out_loc, JOURNAL_KIND)
        existing = _existing(out_loc)
        if existing is not None and existing.get("seedance", {}).get("fingerprint") == fingerprint:
            meta = existing["seedance"]
            # the first build's rejections, and what this listing skips now (e.g. a hidden file added since)
            rejected = list(meta["summary"].get("rejected") or [])
            known = {(item.get("key"), item.get("source"), item.get("reason")) for item in rejected}
            rejected += [entry.to_dict() for entry in source.rejected
                         if (entry.key, entry.source, entry.reason) not in known]
            return {**meta["summary"], "rejected": rejected, "up_to_date": True, "recovered": recovered,
                    "index": out_loc.child(shard_index.INDEX_NAME).uri}
        if storage.list_files(out_loc):
            raise RefusedError(
                f"{out} already holds files from another build; refusing to overwrite them",
                hint="build into an empty directory or prefix (or move the old shards away first)",
            )
        summary = _write(source, out_loc, settings, run_id, fingerprint, held, shuffle=shuffle, seed=seed,
                         read_workers=read_workers, advance=advance, on_progress=on_progress,
                         started=started)
    return {**summary, "up_to_date": False, "recovered": recovered,
            "index": out_loc.child(shard_index.INDEX_NAME).uri}


def _write(source, out_loc, settings: ShardSettings, run_id: str, fingerprint: str, held: lease.Lease, *,
           shuffle: bool, seed: int, read_workers: int, advance, on_progress, started: float) -> dict[str, Any]:
    """Write this attempt's shards and index under hidden names, then publish them in one journal."""
    job = journal.Journal.begin(out_loc, run_id, JOURNAL_KIND, [], [], {"source": source.uri})
    entries: list[dict[str, Any]] = []
    state: dict[str, Any] = {"writer": None, "stream": None, "staged": None}

    def open_shard() -> None:
        name = f"{settings.prefix}-{len(entries):06d}.tar"
        staged = f".{name}.{run_id}"
        job.add_publish(staged, name)  # recorded before a byte is written, so a rollback finds it
        stream = open_sink(out_loc.fs, out_loc.join(staged), WRITE_BUFFER)
        state.update(stream=stream, writer=TarShardWriter(stream, mtime=settings.mtime), staged=staged)
        entries.append({"url": name, "nsamples": 0, "filesize": 0, "sha256": None})

    closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seedance-fsync")
    closing: list[tuple[Future, str, int, str]] = []

    def close_shard() -> None:
        # The close (an fsync on local disk, the multipart upload's completion on S3) runs on
        # a helper thread while the next shard is written; `finish_closing` waits for all.
        writer = state["writer"]
        writer.close()
        closing.append((closer.submit(state["stream"].close), state["staged"], writer.size, entries[-1]["url"]))
        entries[-1].update(nsamples=writer.samples, filesize=writer.size, sha256=writer.sha256.hexdigest())
        state["writer"] = None

    def finish_closing() -> None:
        closer.shutdown(wait=True)
        for future, staged, expected, name in closing:
            future.result()
            size = out_loc.fs.get_file_info(out_loc.join(staged)).size
            if size != expected:
                raise IntegrityError(f"shard {name}: wrote {expected} bytes, found {size}")

    check = sample_checker(check_decode=settings.check_decode, max_member_size=int(settings.max_member_size))
    input_bytes = 0
    total_bytes = sum(item.size or 0 for item in source.files)
    try:
        for key, members in iter_source_samples(source, shuffle=shuffle, seed=seed, read_workers=read_workers,
                                                check=check):
            needed = sample_bytes(key, members, settings.mtime)
            writer = state["writer"]
            if writer is not None and writer.samples and (
                writer.size + needed + len(END_OF_ARCHIVE) > settings.shard_size
                or (settings.max_samples and writer.samples >= settings.max_samples)
            ):
                close_shard()
                writer = None
            if writer is None:
                open_shard()
            state["writer"].add_sample(key, members)
            payload = sum(len(data) for data in members.values())
            input_bytes += payload
            if advance:
                advance(payload)
            if on_progress:
                on_progress(input_bytes, total_bytes)
        if state["writer"] is not None:
            close_shard()
        finish_closing()

        elapsed = time.perf_counter() - started
        rejected = [item.to_dict() for item in source.rejected]
        summary = {
            "source": source.uri,
            "source_kind": source.kind,
            "out": out_loc.uri,
            "run_id": run_id,
            "shards": len(entries),
            "samples": sum(entry["nsamples"] for entry in entries),
            "bytes": sum(entry["filesize"] for entry in entries),
            "input_bytes": input_bytes,
            "rejected": rejected,
            "required_members": source.required,
            "check_decode": settings.check_decode,
            "seconds": round(elapsed, 3),
            "mb_per_s": round(input_bytes / 1e6 / elapsed, 1) if elapsed > 0 else None,
        }
        if rejected:  # hidden, and named by this attempt: written before the commit, never overwritten
            report = out_loc.join(storage.SEEDANCE_DIR, "reports", f"build-{run_id}.json")
            storage.write_json_atomic(out_loc.fs, report, {"run_id": run_id, "source": source.uri,
                                                           "rejected": rejected})
            summary["report"] = out_loc.uri_of(report)
        staged_index = f".{shard_index.INDEX_NAME}.{run_id}"
        job.add_publish(staged_index, shard_index.INDEX_NAME)  # published last: it lists the shards
        meta = {"fingerprint": fingerprint, "run_id": run_id, "source": source.uri, "summary": summary}
        faults.point("shards.index.before")
        storage.write_json_atomic(out_loc.fs, out_loc.join(staged_index),
                                  shard_index.index_document(entries, meta, name=settings.prefix))
        faults.point("shards.index.after")
        held.check()  # the point of no return is ours only while the lease is
    except BaseException:
        closer.shutdown(wait=True)
        if state["stream"] is not None and not state["stream"].closed:
            state["stream"].close()
        try:
            job.rollback()  # staged shards to the trash; nothing was visible
        except Exception:  # noqa: BLE001 - the next attempt's recover() rolls it back instead
            log.warning("could not roll back build %s; the next build of %s will", run_id, out_loc.uri,
                        exc_info=True)
        raise
    job.commit()
    faults.point("shards.build.committed")
    return summary
