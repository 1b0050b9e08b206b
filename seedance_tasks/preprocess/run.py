"""`seedance preprocess run`: shards in, preprocessed shards out (`KEY.npy` + the other members).

One output shard per input shard, with the input's name. Output shards and their done-records
(`OUT/_seedance/preprocess/done/<name>.json`: source, samples, sha256, failed keys) are written
hidden and published together, in one journal, when the run is complete (the journal records
them before they are started), so a rerun skips finished shards and the DAG's mapped tasks can
retry a group without redoing the others. Each attempt has its own journal id and staged names,
prefixed by its group (`pp-<hash of the group's shard names>-`): an attempt first rolls back or
forward what the earlier attempts of its own group left, never a live sibling's. The output is
leased (`dataset`) by the run (holder: the CLI run's id, or the DAG run's, shared by its mapped
tasks and retries); another writer is refused naming the holder. `finalize` writes `OUT/shardindex.json` (wids form)
from the done-records. Local input shards have all their tar headers checked before anything is
written; any hostile tar stops the run and nothing becomes visible.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import time
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from seedance_tasks import faults, journal, lease, storage
from seedance_tasks.errors import IntegrityError, UsageError
from seedance_tasks.preprocess.pipeline import Pipeline, Processed, ShardDone
from seedance_tasks.preprocess.settings import PreprocessSettings
from seedance_tasks.preprocess.sizing import choose_pools
from seedance_tasks.preprocess.transform import npy_header
from seedance_tasks.shards import index as shard_index
from seedance_tasks.shards.index import ShardRef, resolve_shards
from seedance_tasks.shards.tario import TarShardWriter, open_sink, scan_headers

log = logging.getLogger(__name__)

JOURNAL_KIND = "preprocess"
LEASE_NAME = "dataset"
DONE_DIR = f"{storage.SEEDANCE_DIR}/preprocess/done"
WRITE_BUFFER = 8 * 1024 * 1024


def output_names(shards: list[ShardRef]) -> list[str]:
    """The output shard name of each input shard: its basename, numbered if basenames collide."""
    names = [shard.name for shard in shards]
    if len(set(names)) == len(names):
        return names
    return [f"{number:06d}-{name}" for number, name in enumerate(names)]


def _publish(out, staged: str, final: str) -> dict[str, Any]:
    """A journal publish entry; `replace` when a visible file of that name exists (a shard redone)."""
    entry: dict[str, Any] = {"staged": staged, "final": final}
    if storage.is_file(out.fs, out.join(final)):
        entry["replace"] = True
    return entry


def _done_record(out, name: str) -> dict | None:
    path = out.join(DONE_DIR, f"{name}.json")
    return storage.read_json(out.fs, path) if storage.is_file(out.fs, path) else None


def _is_done(out, name: str, shard: ShardRef, size: int) -> bool:
    record = _done_record(out, name)
    return (
        record is not None
        and record.get("source") == shard.uri
        and record.get("source_size") == shard.size
        and record.get("size") == size
        and storage.is_file(out.fs, out.join(name))
    )


def prescan(shards: list[ShardRef]) -> int:
    """Check every member header of the local shards among `shards` (cheap: reads headers only).

    A plain ustar tar is checked by `localtar.is_plain`; any other goes through `scan_headers`.

    Raises RefusedError/InputError on the first hostile or broken tar. S3 shards are checked as
    they stream instead (reading them twice would double the transfer).
    """
    from seedance_tasks.preprocess.localtar import is_plain

    checked = 0
    for shard in shards:
        if not shard.location.is_s3:
            if not is_plain(shard.location.path):  # a plain tar's headers are all fine: no second pass
                scan_headers(shard.location.path, shard.uri)
            checked += 1
    return checked


def run(
    shards_uri: str,
    out_uri: str,
    *,
    settings: PreprocessSettings | dict | None = None,
    only: list[str] | None = None,
    recover: bool = True,
    finalize_index: bool = True,
    holder: str | None = None,
    wait_s: float = 0.0,
    release_lease: bool = True,
    advance: Callable[[float], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Preprocess the shards of `shards_uri` into `out_uri`; returns a summary with samples/s and stage shares.

    Every input sample comes out exactly once: in its output shard as `KEY.npy` (uint8, shape
    (3, size, size)) with its other members, or in `failed` with its shard, key and reason.
    `only` restricts the run to those shard names or URIs (the DAG's groups); `recover` finishes
    every interrupted run on the output first (off: only the earlier attempts of this group, as
    mapped sibling tasks must). `holder` owns the output's lease (default: this run's id; kept
    after the run with `release_lease=False`, for the next task of the same DAG run); another
    holder raises LeaseHeldError after waiting up to `wait_s`. Safe to run again after a crash
    or an error anywhere. `on_progress(shards_done, shards_total)` follows the output shards written.
    """
    if settings is None or isinstance(settings, dict):
        settings = PreprocessSettings.model_validate(settings or {})
    shard_set = resolve_shards(shards_uri)
    names = output_names(shard_set.shards)
    pairs = list(zip(shard_set.shards, names, strict=True))
    if only is not None:
        wanted = set(only)
        pairs = [(shard, name) for shard, name in pairs if shard.name in wanted or shard.uri in wanted
                 or name in wanted]
        missing = wanted - {p[0].name for p in pairs} - {p[0].uri for p in pairs} - {p[1] for p in pairs}
        if missing:
            raise UsageError(f"shards not found in {shards_uri}: {sorted(missing)[:5]}")
    out = storage.resolve(out_uri)
    if out.path in {posixpath.dirname(shard.location.path) for shard, _name in pairs}:
        raise UsageError("--out must differ from the shards' directory", hint="write outputs to a new directory")
    run_id = storage.new_run_id()
    with lease.holding(out, LEASE_NAME, holder=holder or run_id, purpose=f"seedance preprocess run of {shards_uri}",
                       wait_s=wait_s, release=release_lease) as held:
        return _run(shards_uri, out_uri, out, pairs, settings, run_id, held, recover=recover,
                    finalize_index=finalize_index, advance=advance, on_progress=on_progress)


def group_prefix(names: list[str]) -> str:
    """The journal id prefix of a group of output shards: the same for every attempt of that group."""
    digest = hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]
    return f"pp-{digest}-"


def _run(shards_uri: str, out_uri: str, out, pairs: list, settings: PreprocessSettings, run_id: str,
         held: lease.Lease, *, recover: bool, finalize_index: bool, advance, on_progress) -> dict[str, Any]:
    """The run itself, under the output's lease."""
    prefix = group_prefix([name for _shard, name in pairs])
    recovered = journal.recover(out, JOURNAL_KIND, prefix=None if recover else prefix)
    todo, skipped = [], []
    for shard, name in pairs:
        if _is_done(out, name, shard, settings.size):
            skipped.append(name)
        else:
            todo.append((shard, name))
    prescan([shard for shard, _name in todo])

    summary: dict[str, Any] = {
        "shards_uri": shards_uri, "out": out.uri, "size": settings.size, "recovered": recovered,
        "shards": len(todo), "skipped": skipped, "samples_in": 0, "samples_out": 0, "failed": [],
    }
    if not todo:
        if finalize_index:
            summary["index"] = _finalize(out)["index"]
        return {**summary, "samples_per_s": None, "stage_shares": None, "seconds": 0.0}

    pools = choose_pools([shard for shard, _ in todo], settings.size, io_workers=settings.io_workers,
                         cpu_workers=settings.cpu_workers, draft=settings.draft)
    publishes = [_publish(out, f".{name}.{run_id}", name) for _shard, name in todo]
    records_staged = [_publish(out, f"{DONE_DIR}/.{name}.json.{run_id}", f"{DONE_DIR}/{name}.json")
                      for _shard, name in todo]  # published with the shards, after them
    job = journal.Journal.begin(out, f"{prefix}{run_id}", JOURNAL_KIND, publishes + records_staged, [],
                                {"shards": shards_uri})
    header = npy_header(settings.size)
    writers: dict[int, tuple[Any, TarShardWriter]] = {}
    counts: dict[int, dict[str, Any]] = {number: {"seen": 0, "expected": None, "failed": []} for number in range(len(todo))}
    records: dict[int, dict] = {}
    write_time = 0.0
    pipeline = Pipeline([shard for shard, _ in todo], size=settings.size, io_workers=pools["io_workers"],
                        cpu_workers=pools["cpu_workers"], batch_size=settings.batch_size, draft=settings.draft)

    def writer_for(number: int) -> TarShardWriter:
        if number not in writers:
            stream = open_sink(out.fs, out.join(publishes[number]["staged"]), WRITE_BUFFER)
            writers[number] = (stream, TarShardWriter(stream))
        return writers[number][1]

    def maybe_close(number: int) -> None:
        state = counts[number]
        if state["expected"] is None or state["seen"] < state["expected"]:
            return
        writer = writer_for(number)
        writer.close()
        writers[number][0].close()
        shard, name = todo[number]
        records[number] = {
            "name": name, "source": shard.uri, "source_size": shard.size, "size": settings.size,
            "nsamples": writer.samples, "filesize": writer.size, "sha256": writer.sha256.hexdigest(),
            "failed": state["failed"], "run_id": run_id,
        }

    started = time.perf_counter()
    main_cpu = time.process_time()
    try:
        for item in pipeline:
            if isinstance(item, ShardDone):
                counts[item.shard]["expected"] = item.samples
                maybe_close(item.shard)
                continue
            assert isinstance(item, Processed)
            state = counts[item.shard]
            state["seen"] += 1
            if item.error is not None:
                state["failed"].append({"shard": todo[item.shard][0].uri, "key": item.key, "reason": item.error})
            else:
                t0 = time.perf_counter()
                writer_for(item.shard).add_sample(item.key, {**item.members, "npy": (header, item.array)})
                write_time += time.perf_counter() - t0
            maybe_close(item.shard)
            if advance:
                advance(1)
            if on_progress:
                on_progress(len(records), len(todo))
        if len(records) != len(todo):
            raise RuntimeError(f"pipeline ended with {len(todo) - len(records)} shard(s) unfinished")
        faults.point("preprocess.records.before")
        for number, record in records.items():
            storage.write_json_atomic(out.fs, out.join(records_staged[number]["staged"]), record)
        faults.point("preprocess.records.after")
        held.check()  # the point of no return is ours only while the lease is
    except BaseException:
        for stream, _writer in writers.values():
            if not stream.closed:
                stream.close()
        try:
            job.rollback()  # staged outputs to the trash; nothing was published
        except Exception:  # noqa: BLE001 - the next attempt of this group rolls it back instead
            log.warning("could not roll back preprocess run %s; the next attempt will", run_id, exc_info=True)
        raise
    job.commit()
    faults.point("preprocess.committed")
    elapsed = time.perf_counter() - started
    main_cpu = time.process_time() - main_cpu
    pipeline.times.write = write_time
    samples_in = sum(state["seen"] for state in counts.values())
    summary.update(
        run_id=run_id,
        samples_in=samples_in,
        samples_out=sum(record["nsamples"] for record in records.values()),
        failed=[failure for record in records.values() for failure in record["failed"]],
        seconds=round(elapsed, 3),
        samples_per_s=round(samples_in / elapsed, 1) if elapsed > 0 else None,
        stage_seconds={"read": round(pipeline.times.read, 3), "decode": round(pipeline.times.decode, 3),
                       "resize": round(pipeline.times.resize, 3), "convert": round(pipeline.times.convert, 3),
                       "write": round(write_time, 3)},
        stage_shares=pipeline.times.shares(),
        cpu_seconds={"parent": round(main_cpu, 3), "workers": round(pipeline.worker_cpu, 3)},
        io_workers=pools["io_workers"],
        cpu_workers=pools["cpu_workers"],
        pools_basis=pools["basis"],
        outputs=[out.uri_of(out.join(records[number]["name"])) for number in sorted(records)],
    )
    if finalize_index:
        summary["index"] = _finalize(out)["index"]
    return summary


def finalize(out_uri: str, *, holder: str | None = None, wait_s: float = 0.0) -> dict[str, Any]:
    """Write `OUT/shardindex.json` (wids form) from every done-record; returns its figures.

    Holds the output's lease for `holder` (default: a run id of its own) and releases it after:
    the DAG's last task ends the DAG run's hold on the output.
    """
    out = storage.resolve(out_uri)
    with lease.holding(out, LEASE_NAME, holder=holder or storage.new_run_id(), purpose="seedance preprocess finalize",
                       wait_s=wait_s):
        return _finalize(out)


def _finalize(out) -> dict[str, Any]:
    """`finalize` under the lease the caller holds."""
    selector = pafs.FileSelector(out.join(DONE_DIR), recursive=False, allow_not_found=True)
    records = []
    for info in sorted(out.fs.get_file_info(selector), key=lambda item: item.path):
        if info.path.endswith(".json") and not posixpath.basename(info.path).startswith("."):
            record = storage.read_json(out.fs, info.path)
            name = record.get("name") if isinstance(record, dict) else None
            if storage.confine(name, what=f"done-record {out.uri_of(info.path)} name") != name or "/" in name:
                raise IntegrityError(f"done-record {out.uri_of(info.path)}: shard name {name!r} is not a plain file name",
                                     hint="the record was edited by someone else; move it away and run again")
            if storage.is_file(out.fs, out.join(name)):
                records.append(record)
    entries = [{"url": r["name"], "nsamples": r["nsamples"], "filesize": r["filesize"], "sha256": r["sha256"]}
               for r in records]
    failed = sum(len(r["failed"]) for r in records)
    meta = {"kind": "preprocessed", "sizes": sorted({r["size"] for r in records}), "failed": failed,
            "failed_records": out.uri_of(out.join(DONE_DIR))}
    index_path = out.join(shard_index.INDEX_NAME)
    storage.write_json_atomic(out.fs, index_path, shard_index.index_document(entries, meta))
    return {"index": out.uri_of(index_path), "shards": len(entries), "samples": sum(e["nsamples"] for e in entries),
            "failed": failed}
