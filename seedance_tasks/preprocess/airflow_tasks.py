"""The task functions of `dags/seedance_preprocess.py`: params in, one library call, small summary out.

Kept here (not in the DAG file) so they are testable without Airflow and the DAG file stays cheap
to parse. Each returns JSON-able summaries for XCom: URIs and counts (lists capped at 100, with
their counts), never data. The source/shards/out params are checked before any work (`locations`:
absolute, no output inside its inputs), and the groups never outnumber `[core] max_map_length`.

Every task that writes holds the `dataset` lease of what it writes as the DAG run
(`dag_support.airflow_lease_holder()`): a retried task, and the mapped preprocess tasks of one
run, share it; another DAG run, a second deployment or the CLI writing the same output is
refused naming the holder (retryable: the task is retried once the holder is done). The
preprocess output's lease is kept between tasks and released by `finalize`, or by the
`release_leases` teardown however the run ended (a failed group must not keep the next run and
the CLI out until the lease's TTL).

A hostile or unreadable input shard does not stop the run: `verify` logs its problem and lets it
through (preprocessing reads it with the same checked reader), the `preprocess` task of its group
quarantines it (an `error:`/`hint:` line in the task log, a record under the output's
`_seedance/quarantine/preprocess/`) and publishes the group's other shards, and succeeds, with
`quarantined` in its summary: the same as a compaction task that quarantines a file. `finalize`
lists them in the index and the summary, and fails only if no shard at all is left.
"""

from __future__ import annotations

import logging
import os
import posixpath
from typing import Any

from seedance_tasks.dag_support import fail_fast, release_run_lease, run_settings, skip
from seedance_tasks.errors import UsageError

log = logging.getLogger("seedance_tasks.preprocess")

SHARD_PROBLEMS = frozenset({"refused", "unreadable", "truncated", "trailing-data", "too-large", "no-key"})
"""Kinds of verify problems of one shard's own tar that preprocessing quarantines by itself (the
rest of the run goes on); any other problem (a missing shard, a bad index, a key in two shards,
counts or checksums unlike the index's, an image that does not decode) still fails verify."""

LOGGED_PROBLEMS = 100  # verify problems logged one per line before the task fails

SHARD_PARAMS = {"shard_size": "shard_size", "check_decode": "check_decode"}
PREPROCESS_PARAMS = {"image_size": "size", "io_workers": "io_workers", "cpu_workers": "cpu_workers",
                     "parallel": "parallel", "shards_per_group": "shards_per_group"}
"""DAG param -> `shards:` / `preprocess:` key: a run's settings are config's sections, then these params."""


def _settings(params: dict[str, Any]):
    """The run's `shards:` and `preprocess:` settings: config, then the non-empty params."""
    return run_settings("shards", params, SHARD_PARAMS), run_settings("preprocess", params, PREPROCESS_PARAMS)


def locations(params: dict[str, Any]) -> dict[str, str]:
    """Source, shards and output URIs of a run; shards/output default to siblings of the source.

    Checked before any work (UsageError naming the params, with what to do in the form): each is
    an absolute local path, `file:///…` or `s3://…` (a relative path would depend on the worker's
    working directory; an S3 key with a `.` or `..` component names another place than it reads);
    the output is neither the source's or the shards' folder nor inside them (its tars would mix
    with the samples, or replace the shards), and the shards are not inside the samples' folder.
    """
    source = (params.get("source") or "").strip()
    if not source:
        raise UsageError("the 'source' param is empty", hint="give a samples directory, a Parquet dataset or shards")
    base = source.rstrip("/")
    kind = params.get("source_kind") or "samples"
    shards = source if kind == "shards" else ((params.get("shards") or "").strip() or f"{base}-shards")
    out = (params.get("out") or "").strip() or f"{shards.rstrip('/')}-preprocessed"
    where = {"source": source, "kind": kind, "shards": shards, "out": out}
    _check_locations(params, where)
    return where


def _label(name: str, where: dict[str, str]) -> str:
    """The param that sets location `name` (shards given as the source are the `source` param)."""
    return "source" if name == "shards" and where["kind"] == "shards" else name


def _named(params: dict[str, Any], name: str, where: dict[str, str]) -> str:
    """How an error names location `name`: its param, or what its empty param defaulted to."""
    label = _label(name, where)
    if (params.get(label) or "").strip():
        return f"the `{label}` param ({where[name]})"
    return f"the default `{name}` ({where[name]}, `{label}` left empty)"


def _check_locations(params: dict[str, Any], where: dict[str, str]) -> None:
    """`locations`' checks; UsageError naming the param and what to set in the trigger form."""
    from seedance_tasks import storage

    for name in ("source", "shards", "out"):
        text, label = where[name], _label(name, where)
        if text.startswith("s3://"):
            if any(part in (".", "..") for part in text[len("s3://"):].split("/")):
                raise UsageError(f"the `{label}` param ({text!r}) has a `.` or `..` component: on S3 that is a key "
                                 "of its own, which Seedance's listings refuse to read",
                                 hint=f"give `{label}` as a plain s3://bucket/prefix")
        elif "://" not in text and not os.path.isabs(os.path.expanduser(text)):
            raise UsageError(f"the `{label}` param ({text!r}) is a relative path: a task would resolve it against "
                             "its worker's working directory", hint=f"give `{label}` as an absolute path, "
                             "file:///… or s3://…")

    def place(name: str) -> tuple[str, str, bool]:  # (scheme, normalised path, names a file or a pattern)
        location = storage.resolve(where[name])
        path = location.path.rstrip("/")
        path = os.path.realpath(path) if location.scheme == "file" else path
        if file_like := ("{" in path or path.endswith((".tar", ".json", ".parquet"))):
            path = posixpath.dirname(path)  # the shards' (or samples') folder
        return location.scheme, path, file_like

    pairs = [("out", "shards", "the outputs, named as the input shards, would replace them or be read as shards next time")]
    if where["kind"] == "samples":  # the shards' place first: the output's default follows from it
        pairs = [("shards", "source", "the shards would mix with your samples (and be read as samples next time)"),
                 ("out", "source", "its shards would mix with your samples (and be read as samples next time)"),
                 *pairs]
    for inner, outer, why in pairs:
        (scheme, path, _), (outer_scheme, outer_path, file_like) = place(inner), place(outer)
        if scheme == outer_scheme and (path == outer_path or (not file_like and path.startswith(outer_path + "/"))):
            default = "`<shards>-preprocessed`" if inner == "out" else "`<source>-shards`"
            empty = f" (or leave it empty: {default})" if (params.get(inner) or "").strip() else ""
            raise UsageError(f"{_named(params, inner, where)} is, or lies inside, the folder of "
                             f"{_named(params, outer, where)}: {why}",
                             hint=f"set `{inner}` to a new folder outside it{empty}, "
                             "then trigger the DAG again")


@fail_fast
def build_task(params: dict[str, Any]) -> dict[str, Any]:
    """Build shards from the source (a no-op if they are up to date, or if the source is shards)."""
    from seedance_tasks.dag_support import airflow_lease_holder
    from seedance_tasks.shards.build import build

    if not (params.get("source") or "").strip():
        skip("nothing to preprocess: set the `source` param (samples, a Parquet dataset or shards)")
    where = locations(params)
    if where["kind"] == "shards":
        return {**where, "built": False, "rejected": 0}
    shard_settings, _ = _settings(params)
    result = build(where["source"], where["shards"], settings=shard_settings,
                   shuffle=bool(params.get("shuffle")), seed=int(params.get("seed") or 0),
                   holder=airflow_lease_holder())
    from seedance_tasks.dag_support import log_reports

    log_reports({"build": result.get("report")})
    return {**where, "built": not result["up_to_date"], "shard_count": result["shards"],
            "samples": result["samples"], "rejected": len(result["rejected"]), "report": result.get("report"),
            "mb_per_s": None if result["up_to_date"] else result.get("mb_per_s")}


@fail_fast
def verify_task(built: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Verify the shards. A problem of one shard's own tar (`SHARD_PROBLEMS`: hostile, truncated,
    corrupt) is logged as an `error:` line and left to preprocessing, which quarantines that shard;
    any other problem is logged (one `error:` line each, up to `LOGGED_PROBLEMS`) and fails the
    task (`raise_for_problems`: at once, without retries, when no re-read can change it, e.g.
    an image that does not decode with `check_decode` on)."""
    from seedance_tasks.shards.verify import raise_for_problems, verify

    shard_settings, _ = _settings(params or {})
    report = verify(built["shards"], check_decode=shard_settings.check_decode,
                    max_member_size=int(shard_settings.max_member_size))
    listed = {item["shard"] for item in report["per_shard"]}
    own = [item for item in report["problems"] if item["kind"] in SHARD_PROBLEMS and item["shard"] in listed]
    rest = [item for item in report["problems"] if item not in own]
    for item in rest[:LOGGED_PROBLEMS]:  # the task log lists what the error's hint speaks of
        log.error("error: %s%s: %s (%s)", item["shard"], f", key {item['key']!r}" if item.get("key") else "",
                  item["problem"], item["kind"])
    if len(rest) > LOGGED_PROBLEMS:
        log.error("... and %d more problem(s): `seedance shards verify --json %s` lists them all",
                  len(rest) - LOGGED_PROBLEMS, built["shards"])
    raise_for_problems({**report, "problems": rest})
    for item in own:
        log.error("error: %s: %s\n  hint: left to the preprocess task, which quarantines this shard "
                  "(the other shards go on)", item["shard"], item["problem"])
    bad = sorted({item["shard"] for item in own})
    return {"shards": report["shards"], "samples": report["samples"], "bytes": report["bytes"], "ok": report["ok"],
            "shards_to_quarantine": bad[:100], "shards_to_quarantine_count": len(bad)}


@fail_fast
def plan_task(built: dict[str, Any], params: dict[str, Any]) -> list[dict[str, Any]]:
    """Finish interrupted preprocess runs on the output, then split the shards into groups to map over."""
    from seedance_tasks import journal, lease, storage
    from seedance_tasks.dag_support import airflow_lease_holder
    from seedance_tasks.preprocess.run import JOURNAL_KIND, LEASE_NAME, output_names
    from seedance_tasks.shards.index import resolve_shards

    _, settings = _settings(params)
    out = storage.resolve(built["out"])
    with lease.holding(out, LEASE_NAME, holder=airflow_lease_holder(), purpose="seedance_preprocess", release=False):
        journal.recover(out, JOURNAL_KIND)  # no sibling runs yet: every earlier run's journals
    names = output_names(resolve_shards(built["shards"]).shards)  # unique, unlike basenames in subfolders
    step = group_size(len(names), settings.shards_per_group)
    return [{"shards": built["shards"], "out": built["out"], "names": names[i : i + step]}
            for i in range(0, len(names), step)]


def group_size(shards: int, wanted: int) -> int:
    """Shards per mapped group: `wanted`, or more where `shards / wanted` groups would exceed Airflow's
    `[core] max_map_length` (a longer list fails the task that pushes it), with a warning saying so."""
    try:
        from airflow.configuration import conf

        limit = max(conf.getint("core", "max_map_length", fallback=1024), 1)
    except ImportError:  # a worker without Airflow's core: its default
        limit = 1024
    if -(-shards // wanted) <= limit:
        return wanted
    step = -(-shards // limit)
    log.warning("%d shards in groups of %d would map %d tasks, more than Airflow's [core] max_map_length (%d): "
                "groups of %d instead\n  hint: raise max_map_length, or the `shards_per_group` param, to choose",
                shards, wanted, -(-shards // wanted), limit, step)
    return step


@fail_fast
def preprocess_group_task(group: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """Preprocess one group of shards (finished shards are skipped, so a retry redoes only the rest)."""
    from seedance_tasks.dag_support import airflow_lease_holder
    from seedance_tasks.preprocess.run import report_lines, run

    _, settings = _settings(params)
    result = run(group["shards"], group["out"], settings=settings, only=group["names"], recover=False,
                 finalize_index=False, holder=airflow_lease_holder(), release_lease=False)
    for item in result["quarantined"]:
        log.error("error: %s\n  hint: %s", *report_lines(item))
    return {key: result.get(key) for key in ("shards", "samples_in", "samples_out", "samples_per_s",
                                             "stage_shares", "parallel", "io_workers", "cpu_workers")} | {
        "skipped": result["skipped"][:100], "skipped_count": len(result["skipped"]),
        "failed": result["failed"][:100], "failed_count": len(result["failed"]),
        "quarantined": result["quarantined"][:100], "quarantined_count": len(result["quarantined"])}


@fail_fast
def finalize_task(built: dict[str, Any], results: list[dict[str, Any]], asset=None) -> dict[str, Any]:
    """Write the output index and one summary of the run (quarantined shards included); releases
    the output's lease. The event on `asset` carries the output URI, its index and its counts.
    Fails (RefusedError/InputError, the index left as it was) when every shard is quarantined,
    and (InputError, as `seedance preprocess run` exits 1, after the index is written) when the
    run read samples and every one of them failed."""
    from seedance_tasks.dag_support import airflow_lease_holder
    from seedance_tasks.preprocess.run import all_failed_error, finalize, nothing_left_error

    quarantined = [item for r in results for item in r.get("quarantined") or []]
    if quarantined and not any(r["shards"] or r["skipped"] for r in results):
        from seedance_tasks import lease, storage
        from seedance_tasks.preprocess.run import LEASE_NAME

        with lease.holding(storage.resolve(built["out"]), LEASE_NAME, holder=airflow_lease_holder(),
                           purpose="seedance_preprocess finalize"):  # released: a fixed rerun need not wait
            raise nothing_left_error(built["shards"], quarantined)
    index = finalize(built["out"], holder=airflow_lease_holder())
    samples_in = sum(r.get("samples_in") or 0 for r in results)
    if samples_in and not sum(r.get("samples_out") or 0 for r in results):
        raise all_failed_error(built["shards"], samples_in, [item for r in results for item in r.get("failed") or []])
    rates = [r["samples_per_s"] for r in results if r.get("samples_per_s")]
    summary = {
        "shards_uri": built["shards"], "out": built["out"], "index": index["index"],
        "output_shards": index["shards"], "samples_out": index["samples"], "failed": index["failed"],
        "quarantined": index["quarantined"][:100], "quarantined_count": len(index["quarantined"]),
        "rejected_at_build": built.get("rejected", 0),
        "samples_in_this_run": sum(r["samples_in"] for r in results),
        "mean_group_samples_per_s": round(sum(rates) / len(rates), 1) if rates else None,
    }
    if asset is not None:
        from seedance_tasks.dag_support import announce

        failed = summary["failed"]
        announce(asset, {**{key: summary[key] for key in ("shards_uri", "out", "index", "output_shards", "samples_out")},
                         "failed": len(failed) if isinstance(failed, list) else failed,
                         "quarantined": summary["quarantined_count"]},
                 reports={"index": summary["index"]})
    return summary


@fail_fast
def release_task(params: dict[str, Any]) -> dict[str, Any]:
    """The DAG's teardown: release the DAG run's lease of its output and its shards (as
    `locations(params)` names them) where it still holds it; {"released": [uri...]}. Runs after
    every other task of the run, whatever their outcome; changes no data. Skipped, as the build
    was, when there is no source."""
    from seedance_tasks.preprocess.run import LEASE_NAME

    if not (params.get("source") or "").strip():
        skip("no source, no lease to release")
    try:
        where = locations(params)
    except UsageError as exc:  # refused before any task could take a lease: nothing to release
        skip(f"no lease to release: {exc.message}")
    return {"released": [uri for uri in dict.fromkeys((where["out"], where["shards"]))
                         if release_run_lease(uri, LEASE_NAME)]}
