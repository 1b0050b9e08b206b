"""`seedance preprocess run`: shards in, preprocessed shards out (`KEY.npy` + the other members).

The work is spread over the CPU processes by whole shards (`shardwise`: each writes its shards'
staged outputs itself) where the input and the output are local and there are enough shards,
else by sample batches (`pipeline.Pipeline`: I/O threads, CPU processes, this process writes);
`parallel` in the settings picks, and the summary's `parallel` says which ran. Both write the
same bytes; shards lost with a dead worker are redone by sample batches.

One output shard per input shard, with the input's name. A sample becomes `KEY.npy` (its image
member: `transform.image_extension`) plus its other members; one that has an `npy` member of its
own fails (`transform.output_clash`) rather than lose it. Output shards and their done-records
(`OUT/_seedance/preprocess/done/<name>.json`: source, samples, sha256, failed keys) are written
hidden and published together, in one journal, when the run is complete (the journal records
them before they are started), so a rerun skips finished shards and the DAG's mapped tasks can
retry a group without redoing the others. Each attempt has its own journal id and staged names,
prefixed by its group (`pp-<hash of the group's shard names>-`): an attempt first rolls back or
forward what the earlier attempts of its own group left, never a live sibling's. The output is
leased (`dataset`) by the run (holder: the CLI run's id, or the DAG run's, shared by its mapped
tasks and retries); another writer is refused naming the holder. `finalize` writes `OUT/shardindex.json` (wids form)
from the done-records.

A hostile or unreadable input shard (a member refused by the checked reader: a link, a device,
an absolute or `..` name, a member larger than the limit or than the tar; a truncated or corrupt
tar; a member without a sample key) is quarantined and the run goes on with the other shards:
its problem is reported (`quarantined` in the summary; the CLI prints it, the DAG task logs it,
as an `error:` line naming the shard and the member, with a `hint:`) and recorded in `OUT/_seedance/quarantine/preprocess/<name>.json`. The input shard itself is left
where it is (it is the user's, not under Seedance's outputs): nothing of the input is moved or
deleted, and nothing of it is published. Local shards have their tar headers checked before
anything is written; an S3 shard (checked as it streams) or a local one whose problem shows only
once its data is read may fail half written: its staged output goes to the trash, and the other
shards' outputs move to a second journal that publishes only them (see `_without`). A problem
that is not the shard's (storage down, disk full, permission denied, a bug) still stops the run
and publishes nothing, as does an unsafe output (`--out` being the shards' directory or inside
the directory they are listed from, or leased by another writer). A rerun reports a quarantined shard again from its record while the file is
unchanged (same size and mtime) and checks it again once it changed (fixed, it is processed and
its record retired to the trash). `finalize` lists them in the index's `seedance` part and leaves
them out of its shard list.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import posixpath
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Any

import pyarrow.fs as pafs

from seedance_tasks import faults, journal, lease, storage
from seedance_tasks.errors import InputError, IntegrityError, RefusedError, UsageError
from seedance_tasks.preprocess import shardwise
from seedance_tasks.preprocess.pipeline import Pipeline, Processed, ShardDone, ShardFailed, StageTimes
from seedance_tasks.preprocess.settings import PreprocessSettings
from seedance_tasks.preprocess.sizing import choose_pools
from seedance_tasks.preprocess.transform import npy_header, output_clash
from seedance_tasks.shards import index as shard_index
from seedance_tasks.shards.buckets import refuse_missing_bucket
from seedance_tasks.shards.index import ShardRef, resolve_shards
from seedance_tasks.shards.tario import TarShardWriter, open_sink, scan_headers

log = logging.getLogger(__name__)

JOURNAL_KIND = "preprocess"
LEASE_NAME = "dataset"
DONE_DIR = f"{storage.SEEDANCE_DIR}/preprocess/done"
QUARANTINE_DIR = f"{storage.QUARANTINE_DIR}/preprocess"  # one record per quarantined input shard
WRITE_BUFFER = 8 * 1024 * 1024
QUARANTINE_HINT = ("the shard was left where it is and nothing of it was published; the other shards were "
                   "processed. Rebuild or re-fetch it, then run again (a changed shard is checked again)")


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


def prescan(shards: list[ShardRef]) -> dict[int, InputError | RefusedError]:
    """Check every member header of the local shards among `shards` (cheap: reads headers only).

    A plain ustar tar is checked by `localtar.is_plain`; any other goes through `scan_headers`.
    Returns {position in `shards`: its RefusedError/InputError} for each hostile or broken tar;
    never raises for one (any other error, e.g. permission denied, is raised). S3 shards are
    checked as they stream instead (reading them twice would double the transfer).
    """
    from seedance_tasks.preprocess.localtar import is_plain

    bad: dict[int, InputError | RefusedError] = {}
    for position, shard in enumerate(shards):
        if shard.location.is_s3 or is_plain(shard.location.path):  # a plain tar's headers are all fine
            continue
        try:
            scan_headers(shard.location.path, shard.uri)
        except (InputError, RefusedError) as exc:  # RefusedError is not an InputError
            bad[position] = exc
    return bad


def shard_problem(error: InputError | RefusedError) -> dict[str, Any]:
    """What a shard-level error says, as a quarantine record holds it: kind, error, hint and the
    member it names (None when the problem is the whole tar's)."""
    kind = "refused" if isinstance(error, RefusedError) else getattr(error, "kind", "unreadable")
    member = getattr(error, "member", None)  # the readers' errors carry it (`tario.TarProblem`, `HostileMember`)
    return {"kind": kind, "member": member if isinstance(member, str) else None, "error": error.message,
            "hint": error.hint or "this tar is not a plain WebDataset shard; rebuild or re-fetch it"}


def _quarantine(out, shard: ShardRef, name: str, error: InputError | RefusedError, run_id: str,
                earlier: Any = None) -> dict[str, Any]:
    """Record one bad input shard under `OUT/_seedance/quarantine/preprocess/`; returns the
    summary's entry (`report_lines` words it). The input shard is never touched.

    `earlier` is the shard's record as the run found it (`_read_record`; None if it had none):
    one of the same shard, size and problem is kept as it is (a rerun changes nothing there);
    any other is replaced."""
    problem = shard_problem(error)
    path = _record_path(out, name)
    record = {"name": name, "shard": shard.uri, **_stamp(shard), **problem, "run_id": run_id,
              "at": datetime.now(UTC).isoformat(), "input": "left in place: not under Seedance's outputs"}
    same = ("name", "shard", "source_bytes", "source_mtime_ns", "kind", "member", "error")
    if isinstance(earlier, dict) and all(earlier.get(key) == record[key] for key in same):
        record = earlier
    else:
        storage.write_json_atomic(out.fs, path, record)
    return _entry(out, path, record)


def _entry(out, path: str, record: dict) -> dict[str, Any]:
    """The summary's entry of a quarantine record."""
    return {key: record.get(key) for key in ("name", "shard", "kind", "member", "error", "hint", "run_id")} | {
        "record": out.uri_of(path)}


def _stamp(shard: ShardRef) -> dict[str, int | None]:
    """The input shard's size and modification time as its filesystem reports them now."""
    info = shard.location.fs.get_file_info(shard.location.path)
    return {"source_bytes": info.size, "source_mtime_ns": info.mtime_ns}


def _still_quarantined(out, shard: ShardRef, name: str, record: Any) -> dict[str, Any] | None:
    """The summary's entry of `name` if its quarantine record (`record`, as `_read_record` read
    it) is of this very input (same URI, size and modification time): a rerun reports it again
    without reading it. A shard rewritten or replaced since (or touched) is checked again."""
    path = _record_path(out, name)
    if not isinstance(record, dict) or record.get("shard") != shard.uri or record.get("name") != name:
        return None
    stamp = _stamp(shard)
    if stamp["source_mtime_ns"] is None or any(record.get(key) != value for key, value in stamp.items()):
        return None
    return _entry(out, path, record)


def report_lines(item: dict[str, Any]) -> tuple[str, str]:
    """The `error:` and `hint:` texts of one `quarantined` entry: the shard and member, what is
    wrong, that the others went on, where the record is (the CLI prints them, the DAG logs them)."""
    error = f"{item['error']} (shard {item['name']} quarantined; the other shards go on)"
    hint = f"{(item.get('hint') or '').rstrip('.')}. {QUARANTINE_HINT}; record: {item['record']}".lstrip(". ")
    return error, hint


def _record_path(out, name: str) -> str:
    """Where the quarantine record of output shard `name` is."""
    return out.join(QUARANTINE_DIR, f"{name}.json")


def _read_record(out, path: str) -> Any:
    """The JSON record at `path` (which exists), or None if it is not JSON (it is rewritten then)."""
    try:
        return storage.read_json(out.fs, path)
    except ValueError:
        return None


def nothing_left_error(shards_uri: str, quarantined: list[dict]) -> InputError | RefusedError:
    """The error of a run whose every shard is quarantined: RefusedError if one was hostile."""
    first = quarantined[0]
    message = (f"every shard of {shards_uri} is quarantined ({len(quarantined)}), nothing to preprocess; "
               f"first: {first['error']}")
    hint = f"records in {posixpath.dirname(first['record'])}; rebuild or re-fetch the shards, then run again"
    if any(item["kind"] == "refused" for item in quarantined):
        return RefusedError(message, hint=hint)
    return InputError(message, hint=hint)


def all_failed_error(shards_uri: str, samples_in: int, failed: list[dict]) -> InputError:
    """The error of a run that read `samples_in` (> 0) samples and wrote none: every one is in
    `failed` (the first names its key and reason). The CLI and the DAG's last task raise it alike,
    after the run's outputs and index are written (they record the failures)."""
    first = failed[0] if failed else {}
    return InputError(f"none of the {samples_in:,} samples of {shards_uri} could be preprocessed: every one failed "
                      f"(the first, {first.get('key')!r} in {first.get('shard')}: {first.get('reason')})",
                      hint="see the failed list (the summary's `failed`, and each shard's record under "
                      f"{DONE_DIR}/): JPEG and PNG images are taken; fix or convert the images, then run again "
                      "on a new output")


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
    (3, size, size)) with its other members, or in `failed` with its shard, key and reason, or
    with its whole shard in `quarantined` (a hostile or unreadable input shard: see the module
    doc; the other shards are processed and published all the same, and nothing of a quarantined
    shard is). Raises RefusedError/InputError, after recording them, only when every shard of
    a whole run (`only` None) is quarantined: then there is nothing to go on with.
    `only` restricts the run to those shards, named by output name (`output_names`: what the
    DAG's groups use), URI or basename (UsageError if a basename is two shards'); `recover` finishes
    every interrupted run on the output first (off: only the earlier attempts of this group, as
    mapped sibling tasks must). `holder` owns the output's lease (default: this run's id; kept
    after the run with `release_lease=False`, for the next task of the same DAG run); another
    holder raises LeaseHeldError after waiting up to `wait_s`. Safe to run again after a crash
    or an error anywhere. `on_progress(shards_done, shards_total)` follows the input shards finished.
    """
    if settings is None or isinstance(settings, dict):
        settings = PreprocessSettings.model_validate(settings or {})
    shard_set = resolve_shards(shards_uri)
    names = output_names(shard_set.shards)
    pairs = list(zip(shard_set.shards, names, strict=True))
    if only is not None:
        wanted = set(only)
        for item in wanted - set(names):  # a basename two shards share names neither alone
            if len(same := [shard.uri for shard, _name in pairs if shard.name == item]) > 1:
                raise UsageError(f"{item!r} names {len(same)} shards of {shards_uri}: {', '.join(same[:3])}"
                                 + (", ..." if len(same) > 3 else ""),
                                 hint="name each shard by its URI or its output name "
                                 f"({', '.join(name for shard, name in pairs if shard.name == item)})")
        pairs = [(shard, name) for shard, name in pairs if shard.name in wanted or shard.uri in wanted
                 or name in wanted]
        missing = wanted - {p[0].name for p in pairs} - {p[0].uri for p in pairs} - {p[1] for p in pairs}
        if missing:
            raise UsageError(f"shards not found in {shards_uri}: {sorted(missing)[:5]}")
    out = storage.resolve(out_uri)
    _refuse_out_among_shards(out, shard_set, [shard for shard, _name in pairs])
    refuse_missing_bucket(out, f"the preprocessed shards' output {out.uri}")
    run_id = storage.new_run_id()
    with lease.holding(out, LEASE_NAME, holder=holder or run_id, purpose=f"seedance preprocess run of {shards_uri}",
                       wait_s=wait_s, release=release_lease) as held:
        summary = _run(shards_uri, out_uri, out, pairs, settings, run_id, held, recover=recover,
                       finalize_index=finalize_index, advance=advance, on_progress=on_progress)
    if only is None and summary["quarantined"] and len(summary["quarantined"]) == len(pairs):
        raise nothing_left_error(shards_uri, summary["quarantined"])
    return summary


def _refuse_out_among_shards(out, shard_set, shards: list[ShardRef]) -> None:
    """UsageError if the output is the folder of an input shard (its outputs, named as the inputs,
    would replace them), or lies inside the folder the shards were listed from (no index: a rerun
    would list the outputs as shards)."""
    def real(location) -> str:
        path = location.path.rstrip("/")
        return posixpath.normpath(os.path.realpath(path)) if location.scheme == "file" else path

    target = real(out)
    for shard in shards:
        if shard.location.scheme == out.scheme and posixpath.dirname(real(shard.location)) == target:
            raise UsageError(f"--out {out.uri} is the folder of the input shard {shard.uri}: the outputs would "
                             "replace the shards", hint="write the outputs to a new folder (e.g. SHARDS-preprocessed)")
    if shard_set.index_uri is not None:
        return
    root = storage.resolve(shard_set.source)
    if root.scheme != out.scheme or root.fs.get_file_info(root.path).type != pafs.FileType.Directory:
        return  # a brace pattern or a single tar: nothing is listed
    if target.startswith(real(root) + "/"):
        raise UsageError(f"--out {out.uri} lies inside {shard_set.source}, whose tars are the shards: a rerun "
                         "would read the outputs as shards",
                         hint="write the outputs to a folder outside the shards' (e.g. next to it, SHARDS-preprocessed)")


def group_prefix(names: list[str]) -> str:
    """The journal id prefix of a group of output shards: the same for every attempt of that group."""
    digest = hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]
    return f"pp-{digest}-"


def _stale_records(names: list[str], recorded: Collection[str]) -> list[str]:
    """The quarantine records of `names` (relative paths; `recorded`: the names the run found a
    record of): retired to the trash when those shards publish."""
    return [f"{QUARANTINE_DIR}/{name}.json" for name in names if name in recorded]


def _staging(out, names: list[str], tag: str) -> tuple[list[dict], list[dict]]:
    """The journal publish entries of `names`: output shards, then their done-records (after them)."""
    shards = [_publish(out, f".{name}.{tag}", name) for name in names]
    records = [_publish(out, f"{DONE_DIR}/.{name}.json.{tag}", f"{DONE_DIR}/{name}.json") for name in names]
    return shards, records


def _without(out, job: journal.Journal, prefix: str, run_id: str, names: list[str], publishes: list[dict],
             good: list[int], recorded: Collection[str]) -> tuple[journal.Journal, list[dict], list[dict]]:
    """Swap `job` for a journal that publishes only the output shards numbered `good`.

    A journal's publishes are fixed when it begins, and a shard quarantined half written must not
    be published. So: a second journal begins (state `writing`) with new staged names for the
    good shards; their staged files move to those names; then `job` rolls back, sending what it
    still stages (the quarantined shards' partial outputs) to the trash. Killed anywhere in
    between, both journals are `writing`, and the next attempt rolls both back: nothing visible
    changes, the good work is redone. Returns the new journal and its publish entries.
    """
    kept = [names[number] for number in good]
    shards, records = _staging(out, kept, f"{run_id}-q")
    second = journal.Journal.begin(out, f"{prefix}{run_id}-q", JOURNAL_KIND, shards + records,
                                   _stale_records(kept, recorded), dict(job.meta))
    try:
        for number, entry in zip(good, shards, strict=True):
            storage.move(out.fs, out.join(publishes[number]["staged"]), out.join(entry["staged"]))
        job.rollback()
    except BaseException:
        second.rollback()  # the moved files to the trash too; the caller rolls `job` back
        raise
    return second, shards, records


def _samples_why(todo: list, out, settings: PreprocessSettings, pools: dict) -> str | None:
    """Why this run goes sample by sample through the `Pipeline` (None: each worker does whole
    shards, `shardwise`): `parallel` says so, or whole shards cannot take these (`shardwise.applies`)."""
    if settings.parallel == "samples":
        return "parallel: samples"
    return shardwise.applies([shard for shard, _name in todo], out.fs, pools["cpu_workers"],
                             forced=settings.parallel == "shards")


def _run(shards_uri: str, out_uri: str, out, pairs: list, settings: PreprocessSettings, run_id: str,
         held: lease.Lease, *, recover: bool, finalize_index: bool, advance, on_progress) -> dict[str, Any]:
    """The run itself, under the output's lease."""
    prefix = group_prefix([name for _shard, name in pairs])
    recovered = journal.recover(out, JOURNAL_KIND, prefix=None if recover else prefix)
    todo, skipped, quarantined = [], [], []
    recorded: dict[str, Any] = {}  # the quarantine record (`_read_record`) of each shard to do that has one
    for shard, name in pairs:
        if _is_done(out, name, shard, settings.size):
            skipped.append(name)
            continue
        if storage.is_file(out.fs, record_path := _record_path(out, name)):
            record = _read_record(out, record_path)
            if (earlier := _still_quarantined(out, shard, name, record)) is not None:
                quarantined.append(earlier)
                continue
            recorded[name] = record
        todo.append((shard, name))
    bad = prescan([shard for shard, _name in todo])
    for position in sorted(bad):
        shard, name = todo[position]
        quarantined.append(_quarantine(out, shard, name, bad[position], run_id, recorded.get(name)))
    todo = [pair for position, pair in enumerate(todo) if position not in bad]

    summary: dict[str, Any] = {
        "shards_uri": shards_uri, "out": out.uri, "size": settings.size, "recovered": recovered,
        "shards": len(todo), "skipped": skipped, "samples_in": 0, "samples_out": 0, "failed": [],
        "quarantined": quarantined,
    }
    if not todo:
        if finalize_index and not (quarantined and not skipped):  # nothing left: the index stays as it was
            summary["index"] = _finalize(out)["index"]
        return {**summary, "samples_per_s": None, "stage_shares": None, "seconds": 0.0}

    pools = choose_pools([shard for shard, _ in todo], settings.size, io_workers=settings.io_workers,
                         cpu_workers=settings.cpu_workers, draft=settings.draft)
    samples_why = _samples_why(todo, out, settings, pools)
    names = [name for _shard, name in todo]
    publishes, records_staged = _staging(out, names, run_id)  # done-records published with the shards, after them
    job = journal.Journal.begin(out, f"{prefix}{run_id}", JOURNAL_KIND, publishes + records_staged,
                                _stale_records(names, recorded), {"shards": shards_uri})
    header = npy_header(settings.size)
    writers: dict[int, tuple[Any, TarShardWriter]] = {}
    counts: dict[int, dict[str, Any]] = {number: {"seen": 0, "expected": None, "failed": []} for number in range(len(todo))}
    records: dict[int, dict] = {}
    bad_shards: set[int] = set()
    times = StageTimes()
    worker_cpu = 0.0

    def record(number: int, nsamples: int, filesize: int, sha256: str, failed: list[dict]) -> None:
        shard, name = todo[number]
        records[number] = {
            "name": name, "source": shard.uri, "source_size": shard.size, "size": settings.size,
            "nsamples": nsamples, "filesize": filesize, "sha256": sha256, "failed": failed, "run_id": run_id,
        }

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
        record(number, writer.samples, writer.size, writer.sha256.hexdigest(), state["failed"])

    def quarantine(number: int, error: InputError | RefusedError) -> None:
        """Shard `number` is bad: stop writing it (its partial output stays staged, never published)."""
        bad_shards.add(number)
        if number in writers and not writers[number][0].closed:
            writers[number][0].close()
        shard, name = todo[number]
        quarantined.append(_quarantine(out, shard, name, error, run_id, recorded.get(name)))

    def progress() -> None:
        if on_progress:
            on_progress(len(records) + len(bad_shards), len(todo))

    def by_whole_shards() -> list[int]:
        """`shardwise`: each worker writes whole shards; returns the shards lost with a dead worker."""
        nonlocal worker_cpu
        lost = []
        jobs = [(number, shard, out.join(publishes[number]["staged"])) for number, (shard, _name) in enumerate(todo)]
        with contextlib.closing(shardwise.run_shards(jobs, size=settings.size, draft=settings.draft,
                                                     workers=pools["cpu_workers"])) as outcomes:
            for number, outcome in outcomes:
                if outcome is None:
                    lost.append(number)
                    continue
                counts[number]["seen"] = outcome.samples_in
                times.merge(outcome.times)
                worker_cpu += outcome.cpu
                if isinstance(outcome, shardwise.ShardBad):
                    quarantine(number, outcome.error())
                else:
                    record(number, outcome.nsamples, outcome.filesize, outcome.sha256, outcome.failed)
                    if advance:
                        advance(outcome.samples_in)
                progress()
        return lost

    def by_samples(numbers: list[int]) -> None:
        """`Pipeline`: I/O threads feed batches of images to the CPU workers; this process writes."""
        nonlocal worker_cpu
        pipeline = Pipeline([todo[number][0] for number in numbers], size=settings.size,
                            io_workers=pools["io_workers"], cpu_workers=pools["cpu_workers"],
                            batch_size=settings.batch_size, draft=settings.draft, on_bad_shard="report")
        with contextlib.closing(pipeline):  # the pools stop before the caller rolls back, on any error
            for item in pipeline:
                consume(numbers[item.shard], item)
        times.merge(pipeline.times)
        worker_cpu += pipeline.worker_cpu

    def consume(number: int, item: Processed | ShardDone | ShardFailed) -> None:
        """One item of the sample pipeline: a sample written or failed, a shard finished or bad."""
        if isinstance(item, ShardFailed):
            quarantine(number, item.error)
        elif number in bad_shards:  # cannot happen (nothing of it follows its marker); never written
            return
        elif isinstance(item, ShardDone):
            counts[number]["expected"] = item.samples
            maybe_close(number)
            return
        else:
            state = counts[number]
            state["seen"] += 1
            if item.error is None and (clash := output_clash(item.key, item.members)) is not None:
                item.error = clash
            if item.error is not None:
                state["failed"].append({"shard": todo[number][0].uri, "key": item.key, "reason": item.error})
            else:
                t0 = time.perf_counter()
                writer_for(number).add_sample(item.key, {**item.members, "npy": (header, item.array)})
                times.write += time.perf_counter() - t0
            maybe_close(number)
            if advance:
                advance(1)
        progress()

    started = time.perf_counter()
    main_cpu = time.process_time()
    try:
        rest = by_whole_shards() if samples_why is None else list(range(len(todo)))
        if rest:
            by_samples(rest)
        if len(records) + len(bad_shards) != len(todo):
            raise RuntimeError(f"pipeline ended with {len(todo) - len(records) - len(bad_shards)} shard(s) unfinished")
        good = sorted(records)
        if bad_shards and good:
            job, _shards, kept_records = _without(out, job, prefix, run_id, names, publishes, good, recorded)
            records_staged = dict(zip(good, kept_records, strict=True))
        elif not good:  # every shard of this run quarantined half written: nothing to publish
            job.rollback()
        faults.point("preprocess.records.before")
        for number, done_record in records.items():
            storage.write_json_atomic(out.fs, out.join(records_staged[number]["staged"]), done_record)
        faults.point("preprocess.records.after")
        held.check()  # the point of no return is ours only while the lease is
    except BaseException:
        for stream, _writer in writers.values():
            if not stream.closed:
                stream.close()
        if job.state == journal.WRITING:
            try:
                job.rollback()  # staged outputs to the trash; nothing was published
            except Exception:  # noqa: BLE001 - the next attempt of this group rolls it back instead
                log.warning("could not roll back preprocess run %s; the next attempt will", run_id, exc_info=True)
        raise
    if good:
        job.commit()
    faults.point("preprocess.committed")
    elapsed = time.perf_counter() - started
    main_cpu = time.process_time() - main_cpu
    samples_in = sum(state["seen"] for number, state in counts.items() if number not in bad_shards)
    summary.update(
        run_id=run_id,
        shards=len(records),
        samples_in=samples_in,
        samples_out=sum(record["nsamples"] for record in records.values()),
        failed=[failure for number in sorted(records) for failure in records[number]["failed"]],
        seconds=round(elapsed, 3),
        samples_per_s=round(samples_in / elapsed, 1) if elapsed > 0 else None,
        stage_seconds={"read": round(times.read, 3), "decode": round(times.decode, 3),
                       "resize": round(times.resize, 3), "convert": round(times.convert, 3),
                       "write": round(times.write, 3)},
        stage_shares=times.shares(),
        cpu_seconds={"parent": round(main_cpu, 3), "workers": round(worker_cpu, 3)},
        parallel="shards" if samples_why is None else "samples",
        io_workers=0 if samples_why is None else pools["io_workers"],
        cpu_workers=pools["cpu_workers"],
        pools_basis=f"{pools['basis']}; " + ("each worker does whole shards" if samples_why is None
                                              else f"sample batches ({samples_why})"),
        outputs=[out.uri_of(out.join(records[number]["name"])) for number in sorted(records)],
    )
    if finalize_index and (records or skipped):  # nothing left: the index stays as it was
        summary["index"] = _finalize(out)["index"]
    return summary


def finalize(out_uri: str, *, holder: str | None = None, wait_s: float = 0.0) -> dict[str, Any]:
    """Write `OUT/shardindex.json` (wids form) from every done-record; returns its figures.

    A shard with a quarantine record is left out of the shard list (its input is bad now, even if
    an older output of it is there) and listed under the index's `seedance.quarantined`, as in
    the returned figures. Holds the output's lease for `holder` (default: a run id of its own) and
    releases it after: the DAG's last task ends the DAG run's hold on the output.
    """
    out = storage.resolve(out_uri)
    with lease.holding(out, LEASE_NAME, holder=holder or storage.new_run_id(), purpose="seedance preprocess finalize",
                       wait_s=wait_s):
        return _finalize(out)


def _records_in(out, folder: str, what: str) -> list[dict]:
    """The visible JSON records of `folder` (sorted by file name), each with a plain shard `name`.

    Records are untrusted: one whose name is not a plain file name raises IntegrityError naming it."""
    selector = pafs.FileSelector(out.join(folder), recursive=False, allow_not_found=True)
    found = []
    for info in sorted(out.fs.get_file_info(selector), key=lambda item: item.path):
        if info.path.endswith(".json") and not posixpath.basename(info.path).startswith("."):
            record = storage.read_json(out.fs, info.path)
            name = record.get("name") if isinstance(record, dict) else None
            if storage.confine(name, what=f"{what} {out.uri_of(info.path)} name") != name or "/" in name:
                raise IntegrityError(f"{what} {out.uri_of(info.path)}: shard name {name!r} is not a plain file name",
                                     hint="the record was edited by someone else; move it away and run again")
            found.append(record)
    return found


def _finalize(out) -> dict[str, Any]:
    """`finalize` under the lease the caller holds."""
    quarantined = [{key: record.get(key) for key in ("name", "shard", "kind", "member", "error")}
                   for record in _records_in(out, QUARANTINE_DIR, "quarantine record")]
    bad = {item["name"] for item in quarantined}
    records = [record for record in _records_in(out, DONE_DIR, "done-record")
               if record["name"] not in bad and storage.is_file(out.fs, out.join(record["name"]))]
    entries = [{"url": r["name"], "nsamples": r["nsamples"], "filesize": r["filesize"], "sha256": r["sha256"]}
               for r in records]
    failed = sum(len(r["failed"]) for r in records)
    meta = {"kind": "preprocessed", "sizes": sorted({r["size"] for r in records}), "failed": failed,
            "failed_records": out.uri_of(out.join(DONE_DIR))}
    if quarantined:
        meta |= {"quarantined": quarantined, "quarantine_records": out.uri_of(out.join(QUARANTINE_DIR))}
    index_path = out.join(shard_index.INDEX_NAME)
    storage.write_json_atomic(out.fs, index_path, shard_index.index_document(entries, meta))
    return {"index": out.uri_of(index_path), "shards": len(entries), "samples": sum(e["nsamples"] for e in entries),
            "failed": failed, "quarantined": quarantined}
