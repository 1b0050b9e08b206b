"""A whole compaction run: recover, plan, compact partitions in parallel, report.

`compact_dataset` is what `seedance compact` calls; the DAG calls the same steps one task each
(`plan_for_dag`, `compact_group_attempt`, `summarize`, `purge_for_dag`) so that partitions fan
out over workers. Every run holds the lake's lease (`dataset`): the CLI for the whole run, a DAG
run from its plan task to its purge task (every task and retry of one DAG run is one holder).
"""

from __future__ import annotations

import os
import posixpath
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from datetime import UTC, datetime
from decimal import Decimal

import pyarrow.fs as pafs

from seedance_tasks import journal, lease, storage
from seedance_tasks.arrow_memory import reusing_memory
from seedance_tasks.boundary import first_line
from seedance_tasks.compaction.plan import (
    PLAN_HINT,
    CompactionPlan,
    plan_compaction,
    refuse_enclosing_table,
    validated,
)
from seedance_tasks.compaction.settings import CompactionSettings
from seedance_tasks.compaction.writer import JOURNAL_KIND, compact_partition, journal_prefix
from seedance_tasks.errors import InputError, MetadataError, UsageError
from seedance_tasks.storage import Location

PLANS_DIR = f"{storage.SEEDANCE_DIR}/plans"
LEASE_NAME = "dataset"
MAX_GROUPS = 64  # mapped task instances per DAG run; well under Airflow's max_map_length


def open_dataset(uri: str) -> Location:
    """The Location of an existing dataset root; InputError if the path or bucket does not exist,
    RefusedError if it is a table-format table or inside one (checked before anything is written
    into it: a refused dataset is left untouched, without even a lease)."""
    root = storage.resolve(uri)
    info = root.fs.get_file_info(root.path)
    if info.type == pafs.FileType.File:
        raise UsageError(f"{root.uri} is a file, not a dataset directory",
                         hint="give the dataset's root directory (or prefix), which holds its partitions")
    if info.type != pafs.FileType.NotFound:
        refuse_enclosing_table(root)
        return root
    if root.is_s3:
        bucket = root.path.split("/", 1)[0]
        if root.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise InputError(f"no such bucket: {bucket} (in {root.uri})",
                             hint="check the bucket name, the endpoint (AWS_ENDPOINT_URL) and the credentials")
        raise InputError(f"nothing at {root.uri}: no object has that prefix",
                         hint="check the prefix; nothing was compacted")
    raise InputError(f"no such dataset: {root.uri} does not exist",
                     hint="check the path; nothing was compacted")


def prepare(uri: str, settings: CompactionSettings, *, now: datetime | None = None,
            recover: bool = True, run_id: str | None = None) -> tuple[CompactionPlan, list[dict]]:
    """Finish interrupted runs under `uri` (from their journals), then plan a new run.

    With recover=False (dry runs) interrupted runs are only reported. Callers that change the
    lake hold its lease. Returns the plan and what recovery did. Raises RefusedError for
    table-format datasets, InputError for a dataset that does not exist.
    """
    root = open_dataset(uri)
    if recover:
        recovered = journal.recover(root, JOURNAL_KIND)
    else:
        recovered = [{"run_id": item.run_id, "action": f"pending ({item.state})"}
                     for item in journal.pending(root, JOURNAL_KIND)]
    plan = plan_compaction(
        root, run_id or storage.new_run_id(now), small_file_size=settings.effective_small_file_size,
        min_age_s=settings.min_age, now=now, target_file_size=settings.target_file_size,
    )
    return plan, recovered


def save_plan(plan: CompactionPlan) -> str:
    """Store the plan under `<root>/_seedance/plans/<run_id>.json`; returns its URI."""
    root = storage.resolve(plan.uri)
    path = root.join(PLANS_DIR, f"{plan.run_id}.json")
    storage.write_json_atomic(root.fs, path, plan.to_json())
    return root.uri_of(path)


def load_plan(plan_uri: str) -> CompactionPlan:
    """The plan stored at `plan_uri` (`<root>/_seedance/plans/<run_id>.json`), validated as untrusted
    input (`plan.validated`): MetadataError (not retried) naming the plan file and the key if it is
    not sound, so that a tampered plan never makes compaction read or retire a file outside its lake."""
    location = storage.resolve(plan_uri)
    name = posixpath.basename(location.path)
    folder = posixpath.dirname(location.path)
    suffix = "/" + PLANS_DIR
    if not folder.endswith(suffix) or not name.endswith(".json") or not folder[: -len(suffix)]:
        raise MetadataError(f"plan {plan_uri}: not a plan file (expected <dataset>/{PLANS_DIR}/<run id>.json)",
                            hint=PLAN_HINT)
    root = Location(location.fs, folder[: -len(suffix)], location.scheme)
    try:
        data = storage.read_json(location.fs, location.path)
    except FileNotFoundError:
        raise MetadataError(f"plan {plan_uri} does not exist", hint=PLAN_HINT) from None
    except (ValueError, RecursionError) as exc:
        raise MetadataError(f"plan {plan_uri} is not valid JSON ({first_line(str(exc), 200)})",
                            hint=PLAN_HINT) from None
    plan = validated(data, root, plan_uri)
    if name != f"{plan.run_id}.json":
        raise MetadataError(f"plan {plan_uri}: its run_id {plan.run_id!r} does not match its file name",
                            hint=PLAN_HINT)
    return plan


def group_partitions(plan: CompactionPlan, max_groups: int) -> list[list[int]]:
    """Partition indices in at most `max_groups` groups of about equal bytes (largest first)."""
    count = min(max_groups, len(plan.partitions))
    if count == 0:
        return []
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    order = sorted(range(len(plan.partitions)), key=lambda i: plan.partitions[i].bytes, reverse=True)
    for index in order:
        lightest = loads.index(min(loads))
        groups[lightest].append(index)
        loads[lightest] += plan.partitions[index].bytes
    return [sorted(group) for group in groups]


def compact_group(plan: CompactionPlan, indices: list[int], settings: CompactionSettings,
                  *, workers: int | None = None, on_done: Callable[[dict], None] | None = None,
                  held: lease.Lease | None = None, resume: bool = False) -> list[dict]:
    """Compact the partitions `indices` of `plan`, up to `workers` at once; results in order.

    Partitions run in threads: pyarrow decodes, encodes and compresses without the GIL, and
    threads spare the start-up of worker processes (measured faster in bench/compaction.py).
    `held` (the lake's lease) is checked before every commit; `resume` is for a retried attempt
    with the same inputs (see `compact_partition`).
    """
    workers = workers or settings.workers or os.cpu_count() or 1
    workers = max(1, min(workers, len(indices)))
    results: dict[int, dict] = {}
    root = storage.resolve(plan.uri)

    def compact_one(index: int) -> dict:
        return asdict(compact_partition(root, plan.partitions[index], plan.run_id, index, settings,
                                        held=held, resume=resume))

    with reusing_memory():
        if workers == 1:
            for index in indices:
                results[index] = compact_one(index)
                if on_done:
                    on_done(results[index])
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="compaction") as pool:
                futures = {
                    pool.submit(compact_one, index): index
                    for index in sorted(indices, key=lambda i: plan.partitions[i].bytes, reverse=True)
                }
                for future in as_completed(futures):
                    results[futures[future]] = future.result()
                    if on_done:
                        on_done(results[futures[future]])
    return [results[index] for index in indices]


def summarize(plan: CompactionPlan, results: list[dict], settings: CompactionSettings, *,
              recovered: list[dict] | None = None, dry_run: bool = False, seconds: float | None = None) -> dict:
    """The run's report: partitions, files/bytes before and after, rows, quarantine, saving."""
    compacted = [result for result in results if result["status"] == "compacted"]
    skipped = list(plan.skipped) + [
        {"partition": result["partition"], "reason": result["reason"]}
        for result in results if result["status"] == "skipped"
    ] + [{"partition": item["file"], "reason": item["reason"]} for result in results for item in result.get("left", [])]
    if dry_run:
        files_before = sum(len(partition.files) for partition in plan.partitions)
        bytes_before = sum(partition.bytes for partition in plan.partitions)
        files_after = sum(max(1, -(-partition.bytes // settings.target_file_size)) for partition in plan.partitions)
        bytes_after, rows = None, None
    else:
        files_before = sum(result["files_before"] for result in compacted)
        bytes_before = sum(result["bytes_before"] for result in compacted)
        files_after = sum(result["files_after"] for result in compacted)
        bytes_after = sum(result["bytes_after"] for result in compacted)
        rows = sum(result["rows"] for result in compacted)
    files_removed = max(files_before - files_after, 0)
    requests = files_removed * settings.s3_requests_per_file_per_month
    usd = (Decimal(requests) / 1000 * Decimal(settings.s3_get_price_per_1000)).quantize(Decimal("0.01"))
    report = {
        "run_id": plan.run_id,
        "uri": plan.uri,
        "dry_run": dry_run,
        "target_file_size": settings.target_file_size,
        "small_file_size": settings.effective_small_file_size,
        "data_files_listed": plan.files_listed,
        "partitions_compacted": len(plan.partitions) if dry_run else len(compacted),
        "partitions": [
            {"partition": partition.partition or ".", "files": len(partition.files), "bytes": partition.bytes}
            for partition in plan.partitions
        ] if dry_run else [
            {key: result[key] for key in ("partition", "files_before", "bytes_before", "files_after", "bytes_after", "rows", "outputs")}
            for result in compacted
        ],
        "skipped": skipped,
        "files_before": files_before,
        "files_after": files_after,
        "bytes_before": bytes_before,
        "bytes_after": bytes_after,
        "rows": rows,
        "quarantined": [item for result in results for item in result["quarantined"]],
        "recovered": recovered or [],
        "estimated_monthly_saving": {
            "s3_requests": requests,
            "usd": str(usd),
            "basis": f"{settings.s3_requests_per_file_per_month} GET/LIST per file per month at "
                     f"${settings.s3_get_price_per_1000} per 1,000",
        },
        "trash": storage.resolve(plan.uri).child(storage.TRASH_DIR, plan.run_id).uri if compacted else None,
    }
    if seconds is not None:
        report["seconds"] = round(seconds, 3)
        if bytes_before and not dry_run:
            report["mb_per_s"] = round(bytes_before / 1e6 / max(seconds, 1e-9), 1)
    return report


def compact_dataset(uri: str, settings: CompactionSettings, *, dry_run: bool = False,
                    now: datetime | None = None, on_progress: Callable[[int, int], None] | None = None,
                    wait_s: float = 0.0) -> dict:
    """Compact the dataset at `uri` (see the module doc); returns the report.

    Holds the lake's lease for the whole run (holder: the run id): raises LeaseHeldError naming
    the holder when another run has it, after waiting up to `wait_s`. A dry run changes nothing
    and takes no lease. `on_progress(bytes_done, bytes_total)` is called as partitions finish.
    """
    started = time.monotonic()
    now = now or datetime.now(UTC)
    if dry_run:
        plan, recovered = prepare(uri, settings, now=now, recover=False)
        return summarize(plan, [], settings, recovered=recovered, dry_run=True, seconds=time.monotonic() - started)
    root = open_dataset(uri)
    run_id = storage.new_run_id(now)
    with lease.holding(root, LEASE_NAME, holder=run_id, purpose=f"seedance compact {root.uri}",
                       wait_s=wait_s) as held:
        plan, recovered = prepare(uri, settings, now=now, run_id=run_id)
        if plan.partitions:
            save_plan(plan)
        total = sum(partition.bytes for partition in plan.partitions)
        done = 0

        def progress(result: dict) -> None:
            nonlocal done
            done += result["bytes_before"] or 0
            if on_progress:
                on_progress(done, total)

        results = compact_group(plan, list(range(len(plan.partitions))), settings, on_done=progress, held=held)
        purge_plans(root, _trash_retention(), keep={plan.run_id})
    return summarize(plan, results, settings, recovered=recovered, seconds=time.monotonic() - started)


def _trash_retention() -> float:
    from seedance_tasks.config import load_section

    return float(load_section("storage").trash_retention)


REPORT_LIST_LIMIT = 100
"""Entries of each list of a report (partitions, skipped, quarantined, recovered) kept in an XCom."""


def capped(report: dict, limit: int | None = None) -> dict:
    """`report` small enough for an Airflow XCom whatever the lake: each of its lists cut to its
    first `limit` (default REPORT_LIST_LIMIT) entries, how many were left out under `omitted`
    ({list: count}, only when some were); the figures (files, bytes, rows, saving) stay whole."""
    limit = REPORT_LIST_LIMIT if limit is None else limit
    out, omitted = dict(report), {}
    for key in ("partitions", "skipped", "quarantined", "recovered"):
        items = report.get(key)
        if isinstance(items, list) and len(items) > limit:
            out[key], omitted[key] = items[:limit], len(items) - limit
    if omitted:
        out["omitted"] = omitted
    return out


# --------------------------------------------------------------------------- the DAG's steps


def plan_for_dag(uri: str, settings: CompactionSettings, *, holder: str, dry_run: bool = False,
                 max_groups: int = MAX_GROUPS) -> dict:
    """The DAG's plan step: take the lake's lease for the DAG run (kept for the next tasks),
    recover, plan, save the plan; returns the groups to map (`compact_group_attempt` inputs).

    A dry run takes no lease and changes nothing.
    """
    if dry_run:
        plan, recovered = prepare(uri, settings, recover=False)
        return {"dry_run_report": summarize(plan, [], settings, recovered=recovered, dry_run=True), "groups": []}
    root = open_dataset(uri)
    with lease.holding(root, LEASE_NAME, holder=holder, purpose="seedance_compaction DAG run", release=False):
        plan, recovered = prepare(uri, settings)
        plan_uri = save_plan(plan) if plan.partitions else None
    settings_json = settings.model_dump(mode="json")
    return {
        "run_id": plan.run_id,
        "uri": plan.uri,
        "plan_uri": plan_uri,
        "dry_run": False,
        "settings": settings_json,
        "recovered": recovered,
        "groups": [{"plan_uri": plan_uri, "indices": group, "settings": settings_json}
                   for group in group_partitions(plan, max_groups)],
    }


def compact_group_attempt(group: dict, *, holder: str) -> dict:
    """One attempt of the DAG's mapped `compact` task; safe to run again with the same `group`.

    Under the lake's lease (re-entrant for the DAG run's `holder`, heartbeating while it works):
    first recovers the journals of its own partitions' earlier attempts (never a sibling's),
    then reports the partitions an earlier attempt finished and compacts the rest.
    """
    from seedance_tasks.compaction.settings import CompactionSettings

    plan = load_plan(group["plan_uri"])
    settings = CompactionSettings.model_validate(group["settings"])
    root = storage.resolve(plan.uri)
    indices = group.get("indices")
    if (not isinstance(indices, list) or len(set(map(repr, indices))) != len(indices)
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(plan.partitions)
                       for i in indices)):
        raise MetadataError(
            f"compact task input: indices {indices!r:.200} are not distinct partition numbers of plan "
            f"{group['plan_uri']} (it has {len(plan.partitions)} partitions)",
            hint="the mapped task's input does not belong to this plan; start a new DAG run")
    with lease.holding(root, LEASE_NAME, holder=holder, purpose="seedance_compaction DAG run",
                       release=False) as held:
        recovered = []
        for index in indices:
            recovered += journal.recover(root, JOURNAL_KIND, prefix=journal_prefix(plan.run_id, index))
        results = compact_group(plan, indices, settings, workers=1, held=held, resume=True)
    return {"results": results, "recovered": recovered}


def purge_for_dag(uri: str, older_than_s: float, *, holder: str, apply: bool = True,
                  keep_plans: frozenset[str] | set[str] = frozenset()) -> dict:
    """The DAG's last step: purge old trash and old plans (`purge_plans`, but never those of
    `keep_plans`, this run's) under the lease, then release the DAG run's lease."""
    root = storage.resolve(uri)
    if not apply:
        return journal.purge_trash(root, older_than_s, apply=False)
    with lease.holding(root, LEASE_NAME, holder=holder, purpose="seedance_compaction DAG run"):
        result = journal.purge_trash(root, older_than_s)
        result["plans_purged"] = purge_plans(root, older_than_s, keep=keep_plans)
        return result


def purge_plans(root: Location, older_than_s: float, *, now: datetime | None = None,
                keep: frozenset[str] | set[str] = frozenset()) -> int:
    """Delete the stored plans (`_seedance/plans/<run id>.json`) of runs that started more than
    `older_than_s` ago (the time their run id carries), except those of `keep`; returns how many.

    A plan is read only by its own run's tasks (and their retries): past the trash retention its
    run is long over. A file there that is not named after a run id is left alone. The caller
    holds the lake's lease (no run is reading a plan it deletes).
    """
    now = now or datetime.now(UTC)
    storage.refuse_linked_state(root, PLANS_DIR)
    selector = pafs.FileSelector(root.join(PLANS_DIR), recursive=False, allow_not_found=True)
    purged = 0
    for info in root.fs.get_file_info(selector):
        name = posixpath.basename(info.path)
        run_id = name.removesuffix(".json")
        started = storage.run_id_time(run_id)
        if (info.type != pafs.FileType.File or not name.endswith(".json") or started is None or run_id in keep
                or (now - started).total_seconds() < older_than_s):
            continue
        root.fs.delete_file(info.path)
        purged += 1
    return purged
