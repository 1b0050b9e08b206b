"""`seedance shards build`: pack samples into WebDataset tar shards of about a target size.

Shards are written under hidden names, recorded in a journal before each is started, published
together when all are complete, and the index (`shardindex.json`, wids form) is written last: a
reader that sees the index sees every shard it lists. Building the same source with the same
settings again is a no-op (the index records a fingerprint of both); building something else
into a directory that already holds shards is refused, so nothing is overwritten.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from seedance_tasks import journal, storage
from seedance_tasks.errors import IntegrityError, RefusedError, UsageError
from seedance_tasks.shards import index as shard_index
from seedance_tasks.shards.settings import ShardSettings
from seedance_tasks.shards.sources import iter_source_samples, open_source
from seedance_tasks.shards.tario import END_OF_ARCHIVE, TarShardWriter, open_sink, sample_bytes

JOURNAL_KIND = "shards"
WRITE_BUFFER = 8 * 1024 * 1024


def _fingerprint(source, settings: ShardSettings, shuffle: bool, seed: int) -> str:
    doc = {
        "source": source.fingerprint_items(),
        "kind": source.kind,
        "settings": settings.model_dump(mode="json"),
        "shuffle": shuffle,
        "seed": seed if shuffle else None,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _existing(out) -> dict | None:
    index = out.child(shard_index.INDEX_NAME)
    if storage.is_file(out.fs, index.path):
        return storage.read_json(out.fs, index.path)
    return None


def build(
    src: str,
    out: str,
    *,
    settings: ShardSettings | None = None,
    shuffle: bool = False,
    seed: int = 0,
    read_workers: int | None = None,
    advance: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Pack the samples of `src` into shards under `out`; returns a summary (shards, samples, rejected).

    Guarantees: every good sample is in exactly one shard; every shard is at most
    `settings.shard_size` bytes (tar headers included) unless one sample alone is larger; samples
    that are incomplete or unreadable are listed in `rejected` and in a report under
    `out/_seedance/reports/`; nothing becomes visible before every shard is written.
    """
    settings = settings or ShardSettings()
    started = time.perf_counter()
    source = open_source(src, required=settings.required_members, key_column=settings.key_column)
    if read_workers is None:  # local reads are memory copies: 2 threads; S3 GETs wait on the network: 8
        read_workers = 8 if source.location.is_s3 else 2
    fingerprint = _fingerprint(source, settings, shuffle, seed)
    out_loc = storage.resolve(out)
    journal.recover(out_loc, JOURNAL_KIND)
    existing = _existing(out_loc)
    if existing is not None and existing.get("seedance", {}).get("fingerprint") == fingerprint:
        meta = existing["seedance"]
        return {**meta["summary"], "up_to_date": True, "index": out_loc.child(shard_index.INDEX_NAME).uri}
    if storage.list_files(out_loc):
        raise RefusedError(
            f"{out} already holds files from another build; refusing to overwrite them",
            hint="build into an empty directory or prefix (or move the old shards away first)",
        )
    if settings.shard_size < 4 * 1024:
        raise UsageError(f"shard size {settings.shard_size} bytes is too small", hint="use at least a few MiB")

    run_id = storage.new_run_id()
    publishes: list[dict[str, str]] = []
    entries: list[dict[str, Any]] = []
    state: dict[str, Any] = {"writer": None, "stream": None, "journal": None}

    def open_shard() -> None:
        name = f"{settings.prefix}-{len(entries):06d}.tar"
        staged = f".{name}.{run_id}"
        publishes.append({"staged": staged, "final": name})
        state["journal"] = journal.Journal.begin(out_loc, run_id, JOURNAL_KIND, publishes, [], {"source": src})
        stream = open_sink(out_loc.fs, out_loc.join(staged), WRITE_BUFFER)
        state["stream"], state["writer"] = stream, TarShardWriter(stream, mtime=settings.mtime)
        entries.append({"url": name, "nsamples": 0, "filesize": 0, "sha256": None})

    closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seedance-fsync")
    closing: list[tuple[Future, str, int, str]] = []

    def close_shard() -> None:
        # The close (an fsync on local disk, the multipart upload's completion on S3) runs on
        # a helper thread while the next shard is written; `finish_closing` waits for all.
        writer = state["writer"]
        writer.close()
        closing.append((closer.submit(state["stream"].close), publishes[-1]["staged"], writer.size, entries[-1]["url"]))
        entries[-1].update(nsamples=writer.samples, filesize=writer.size, sha256=writer.sha256.hexdigest())
        state["writer"] = None

    def finish_closing() -> None:
        closer.shutdown(wait=True)
        for future, staged, expected, name in closing:
            future.result()
            size = out_loc.fs.get_file_info(out_loc.join(staged)).size
            if size != expected:
                raise IntegrityError(f"shard {name}: wrote {expected} bytes, found {size}")

    input_bytes = 0
    try:
        for key, members in iter_source_samples(source, shuffle=shuffle, seed=seed, read_workers=read_workers):
            needed = sample_bytes(key, members)
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
        if state["writer"] is not None:
            close_shard()
        finish_closing()
    except BaseException:
        closer.shutdown(wait=True)
        if state["stream"] is not None and not state["stream"].closed:
            state["stream"].close()
        if state["journal"] is not None:
            journal.recover(out_loc, JOURNAL_KIND)  # staged shards to the trash; nothing visible
        raise
    if state["journal"] is not None:  # the last begin lists every shard
        state["journal"].commit()

    elapsed = time.perf_counter() - started
    rejected = [item.to_dict() for item in source.rejected]
    summary = {
        "source": src,
        "source_kind": source.kind,
        "out": out_loc.uri,
        "run_id": run_id,
        "shards": len(entries),
        "samples": sum(entry["nsamples"] for entry in entries),
        "bytes": sum(entry["filesize"] for entry in entries),
        "input_bytes": input_bytes,
        "rejected": rejected,
        "required_members": source.required,
        "seconds": round(elapsed, 3),
        "mb_per_s": round(input_bytes / 1e6 / elapsed, 1) if elapsed > 0 else None,
    }
    if rejected:
        report = out_loc.join(storage.SEEDANCE_DIR, "reports", f"build-{run_id}.json")
        storage.write_json_atomic(out_loc.fs, report, {"run_id": run_id, "source": src, "rejected": rejected})
        summary["report"] = out_loc.uri_of(report)
    meta = {"fingerprint": fingerprint, "run_id": run_id, "source": src, "summary": summary}
    storage.write_json_atomic(
        out_loc.fs,
        out_loc.join(shard_index.INDEX_NAME),
        shard_index.index_document(entries, meta, name=settings.prefix),
    )
    return {**summary, "up_to_date": False, "index": out_loc.child(shard_index.INDEX_NAME).uri}
