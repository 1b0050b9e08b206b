"""`seedance preprocess run`: shards in, preprocessed shards out (`KEY.npy` + the other members).

One output shard per input shard, with the input's name. Output shards are written hidden and
published together when the run is complete (a journal records them before they are started);
each published shard gets a done-record (`OUT/_seedance/preprocess/done/<name>.json`: source,
samples, sha256, failed keys), so a rerun skips finished shards and the DAG's mapped tasks can
retry a group without redoing the others. `finalize` writes `OUT/shardindex.json` (wids form)
from the done-records. Local input shards have all their tar headers checked before anything is
written; any hostile tar stops the run and nothing becomes visible.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from seedance_tasks import journal, storage
from seedance_tasks.errors import UsageError
from seedance_tasks.preprocess.pipeline import Pipeline, Processed, ShardDone
from seedance_tasks.preprocess.settings import PreprocessSettings
from seedance_tasks.preprocess.sizing import choose_pools
from seedance_tasks.preprocess.transform import npy_header
from seedance_tasks.shards import index as shard_index
from seedance_tasks.shards.index import ShardRef, resolve_shards
from seedance_tasks.shards.tario import TarShardWriter, open_sink, scan_headers

JOURNAL_KIND = "preprocess"
DONE_DIR = f"{storage.SEEDANCE_DIR}/preprocess/done"
WRITE_BUFFER = 8 * 1024 * 1024


def output_names(shards: list[ShardRef]) -> list[str]:
    """The output shard name of each input shard: its basename, numbered if basenames collide."""
    names = [shard.name for shard in shards]
    if len(set(names)) == len(names):
        return names
    return [f"{number:06d}-{name}" for number, name in enumerate(names)]


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
    """Check every member header of the local shards among `shards` (cheap: seeks past the data).

    Raises RefusedError/InputError on the first hostile or broken tar. S3 shards are checked as
    they stream instead (reading them twice would double the transfer).
    """
    checked = 0
    for shard in shards:
        if not shard.location.is_s3:
            scan_headers(shard.location.path, shard.uri)
            checked += 1
    return checked


def run(
    shards_uri: str,
    out_uri: str,
    *,
    settings: PreprocessSettings | None = None,
    only: list[str] | None = None,
    recover: bool = True,
    finalize_index: bool = True,
    advance: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Preprocess the shards of `shards_uri` into `out_uri`; returns a summary with samples/s and stage shares.

    Every input sample comes out exactly once: in its output shard as `KEY.npy` (uint8, shape
    (3, size, size)) with its other members, or in `failed` with its shard, key and reason.
    `only` restricts the run to those shard names or URIs (the DAG's groups); `recover` finishes
    interrupted runs first (leave it off where other runs may be writing the same output).
    """
    settings = settings or PreprocessSettings()
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
    recovered = journal.recover(out, JOURNAL_KIND) if recover else []
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
            summary["index"] = finalize(out_uri)["index"]
        return {**summary, "samples_per_s": None, "stage_shares": None, "seconds": 0.0}

    pools = choose_pools([shard for shard, _ in todo], settings.size, io_workers=settings.io_workers,
                         cpu_workers=settings.cpu_workers, draft=settings.draft)
    run_id = storage.new_run_id()
    publishes = [{"staged": f".{name}.{run_id}", "final": name} for _shard, name in todo]
    job = journal.Journal.begin(out, run_id, JOURNAL_KIND, publishes, [], {"shards": shards_uri})
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
    except BaseException:
        for stream, _writer in writers.values():
            if not stream.closed:
                stream.close()
        job.rollback()  # staged outputs to the trash; nothing was published
        raise
    if len(records) != len(todo):
        job.rollback()
        raise RuntimeError(f"pipeline ended with {len(todo) - len(records)} shard(s) unfinished")
    job.commit()
    for record in records.values():
        storage.write_json_atomic(out.fs, out.join(DONE_DIR, f"{record['name']}.json"), record)
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
        summary["index"] = finalize(out_uri)["index"]
    return summary


def finalize(out_uri: str) -> dict[str, Any]:
    """Write `OUT/shardindex.json` (wids form) from every done-record; returns its figures."""
    out = storage.resolve(out_uri)
    selector = pafs.FileSelector(out.join(DONE_DIR), recursive=False, allow_not_found=True)
    records = []
    for info in sorted(out.fs.get_file_info(selector), key=lambda item: item.path):
        if info.path.endswith(".json") and not posixpath.basename(info.path).startswith("."):
            record = storage.read_json(out.fs, info.path)
            if storage.is_file(out.fs, out.join(record["name"])):
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
