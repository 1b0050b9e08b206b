"""The compaction DAG's task bodies: read params, call the library, return a small summary.

Every task of one DAG run holds the lake's lease as one holder (`airflow_lease_holder()`): the
plan task takes it, each mapped `compact` task (and its retries) takes it back, the purge task
releases it, and the `release_leases` teardown releases it however the run ended (a failed plan,
a mapped task failed for good), so that the next run and the CLI are not kept out until its TTL.
"""

from __future__ import annotations

import logging
from typing import Any

from seedance_tasks.dag_support import (
    airflow_lease_holder,
    fail_fast,
    release_if_last,
    release_run_lease,
    run_settings,
    skip,
    triggering_extras,
)
from seedance_tasks.errors import SeedanceError, UsageError

SETTINGS_PARAMS = {"target_file_size": "target_file_size", "small_file_size": "small_file_size",
                   "min_age": "min_age"}
"""DAG param -> `compaction:` key: the run's settings are config's section, then these params."""
SIGNAL_ASSETS = ("seedance_signal_small_files",)

log = logging.getLogger("seedance_tasks.compaction")


def _settings(params: dict):
    return run_settings("compaction", params, SETTINGS_PARAMS)


def lakes_to_compact(params: dict, settings, events=None) -> list[dict[str, Any]]:
    """The lakes of a run, `[{"uri", "dry_run"}]`: the targets named by the small-files events
    that triggered it (each a dry run unless the event applies), else the `uri` param, else
    `compaction.default_uri`; [] when none is set. The `dry_run` param makes every lake a dry run."""
    forced_dry = bool(params.get("dry_run"))
    extras = triggering_extras(events, SIGNAL_ASSETS)
    if extras:
        from seedance_tasks.compaction.plan import normal_uri

        lakes: dict[str, tuple[str, bool]] = {}  # one entry per lake, however its URI is spelled
        for extra in extras:
            for target in extra.get("targets") or []:
                conf = target.get("conf") or {}
                if target.get("dag_id", "seedance_compaction") == "seedance_compaction" and conf.get("uri"):
                    lakes[normal_uri(str(conf["uri"]))] = (conf["uri"], forced_dry or bool(conf.get("dry_run", True)))
        return _outermost([{"uri": uri, "dry_run": dry} for uri, dry in lakes.values()])
    uri = params.get("uri") or settings.default_uri
    return [{"uri": uri, "dry_run": forced_dry}] if uri else []


def _outermost(lakes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`lakes` without those inside another lake of the list that is compacted for real: the
    outer lake's plan covers their partitions, and two plans of one run over the same files would
    have two tasks of one lease holder rewrite them at once (rows doubled)."""
    from seedance_tasks.compaction.plan import normal_uri

    applied = [normal_uri(str(lake["uri"])) for lake in lakes if not lake["dry_run"]]
    kept = []
    for lake in lakes:
        mine = normal_uri(str(lake["uri"]))
        outer = next((other for other in applied if mine.startswith(other.rstrip("/") + "/")), None)
        if outer is None:
            kept.append(lake)
        else:
            log.warning("lake %s lies inside lake %s of this run: compacted as part of it", lake["uri"], outer)
    return kept


@fail_fast
def plan_task(params: dict, events=None) -> dict:
    """Take each lake's lease, recover, plan and save the plan; returns {"lakes": [plan...], "groups",
    "failed_lakes"}.

    A run with no lake (no `uri` param, no `compaction.default_uri`, no event target) is skipped
    with the reason, not failed. Of a run of several lakes (the targets of small-files events),
    a lake that cannot be compacted (missing, a table format, a bad plan: an error a retry cannot
    fix) is logged as an `error:`/`hint:` line and listed in `failed_lakes`, and the other lakes
    go on; the task fails only when every lake does. A retryable error (a lease held, storage
    down) still fails the task for Airflow to retry.
    """
    from seedance_tasks.boundary import classify
    from seedance_tasks.compaction.run import capped, plan_for_dag

    settings = _settings(params)
    lakes = lakes_to_compact(params, settings, events)
    if not lakes:
        skip("no dataset to compact: set the `uri` param, or compaction.default_uri in config/seedance.yaml")
    planned, failed, first_error = [], [], None
    for lake in lakes:
        try:
            one = plan_for_dag(lake["uri"], settings, holder=airflow_lease_holder(), dry_run=lake["dry_run"])
        except Exception as exc:
            error = classify(exc)
            if len(lakes) == 1 or error.retryable:
                raise
            log.error("error: lake %s: %s", lake["uri"], error)
            failed.append({"uri": lake["uri"], "dry_run": lake["dry_run"], "error": error.message[:500]})
            first_error = first_error or exc
            continue
        if "dry_run_report" in one:
            _log_entries(one["dry_run_report"])
            one["dry_run_report"] = capped(one["dry_run_report"])
        planned.append({"uri": lake["uri"], **capped(one), "dry_run": lake["dry_run"]})
    if not planned:
        raise first_error
    from seedance_tasks.compaction.run import LEASE_NAME

    for lake in planned:  # cleared alone after its run ended, no later task releases the leases
        if not lake["dry_run"]:
            release_if_last(lake["uri"], LEASE_NAME)
    groups = [{**group, "lake": index} for index, one in enumerate(planned) for group in one.pop("groups")]
    return {"lakes": planned, "groups": groups, "settings": settings.model_dump(mode="json"),
            "failed_lakes": failed}


@fail_fast
def compact_group_task(group: dict) -> dict:
    """Compact one group of partitions of a saved plan; safe to retry with the same group. Run
    again on its own (cleared after its run ended), it releases the lake's lease at its end."""
    from seedance_tasks.compaction.run import LEASE_NAME, compact_group_attempt, load_plan

    result = compact_group_attempt(group, holder=airflow_lease_holder())
    release_if_last(load_plan(group["plan_uri"]).uri, LEASE_NAME)
    return result


def _log_entries(report: dict) -> None:
    """Every skipped partition and quarantined file of `report` in the task log (its XCom keeps
    the first ones: `run.capped`)."""
    for item in report.get("skipped") or []:
        log.info("skipped %s: %s", item.get("partition"), item.get("reason"))
    for item in report.get("quarantined") or []:
        log.warning("quarantined %s: %s -> %s", item.get("file"), item.get("reason"), item.get("moved_to"))


@fail_fast
def report_task(planned: dict, results: list[dict], asset=None) -> dict:
    """The run's report, as `seedance compact --json` prints it (one per lake under "lakes" when
    the run compacted several), each list cut to its first entries (`run.capped`: an XCom stays
    small for a lake of any size; the task log lists them all); the event on `asset` carries its
    URIs and figures."""
    from seedance_tasks.compaction.plan import CompactionPlan
    from seedance_tasks.compaction.run import capped, load_plan, summarize
    from seedance_tasks.compaction.settings import CompactionSettings

    if "lakes" not in planned:  # one lake's `plan_for_dag` output
        planned = {"lakes": [planned], "groups": [{**g, "lake": 0} for g in planned["groups"]],
                   "settings": planned["settings"]}
    settings = CompactionSettings.model_validate(planned["settings"])
    summaries = []
    for index, lake in enumerate(planned["lakes"]):
        if "dry_run_report" in lake:
            summaries.append(lake["dry_run_report"])
            continue
        plan = load_plan(lake["plan_uri"]) if lake["plan_uri"] else CompactionPlan(lake["run_id"], lake["uri"])
        mine = [result for group, result in zip(planned["groups"], results, strict=True) if group["lake"] == index]
        flat = [item for result in mine for item in result["results"]]
        recovered = list(lake["recovered"]) + [item for result in mine for item in result.get("recovered", [])]
        summaries.append(summarize(plan, flat, settings, recovered=recovered, dry_run=lake["dry_run"]))
    for one in summaries:
        _log_entries(one)
    summaries = [capped(one) for one in summaries]
    failed = planned.get("failed_lakes") or []
    summary = summaries[0] if len(summaries) == 1 and not failed else {
        "lakes": summaries, "dry_run": all(s["dry_run"] for s in summaries), "failed_lakes": failed}
    if asset is not None:
        from decimal import Decimal

        from seedance_tasks.dag_support import announce

        totals = {key: sum(s.get(key) or 0 for s in summaries) for key in
                  ("partitions_compacted", "files_before", "files_after", "bytes_before", "bytes_after", "rows")}
        announce(asset, {
            "uris": [s["uri"] for s in summaries], "run_ids": [s["run_id"] for s in summaries],
            "failed_uris": [lake["uri"] for lake in failed], "dry_run": summary["dry_run"], **totals,
            "estimated_monthly_saving_usd": str(sum(
                (Decimal(s["estimated_monthly_saving"]["usd"]) for s in summaries), Decimal(0))),
        })
    return summary


def lake_summaries(summary: dict) -> list[dict]:
    """The per-lake reports of a run's summary (one, or several under "lakes")."""
    return summary["lakes"] if "lakes" in summary else [summary]


@fail_fast
def purge_task(params: dict, summary: dict | None) -> dict:
    """Purge each lake's trash runs and stored plans older than the `purge_older_than` param
    (empty: `storage.trash_retention`; this run's plan is kept) and release the DAG run's lease
    (nothing is purged on dry runs)."""
    from seedance_tasks.compaction.run import purge_for_dag
    from seedance_tasks.config import load_section
    from seedance_tasks.units import parse_duration

    if not summary:
        return {"purged": [], "reason": "nothing compacted"}
    try:
        older = (params or {}).get("purge_older_than")
        older_than = parse_duration(older) if older else load_section("storage").trash_retention
    except UsageError as exc:
        raise UsageError(f"param purge_older_than: {exc.message}") from None
    results = [purge_for_dag(lake["uri"], older_than, holder=airflow_lease_holder(), apply=not lake["dry_run"],
                             keep_plans={lake["run_id"]})
               for lake in lake_summaries(summary)]
    if len(results) == 1:
        return results[0]
    return {"purged": [run for result in results for run in result.get("purged", [])], "lakes": results}


@fail_fast
def release_task(params: dict, events=None, planned: dict | None = None) -> dict:
    """The DAG's teardown: release the DAG run's lease of each lake it still holds, among the lakes
    of `planned` (the plan task's XCom, None if it failed) and those `plan_task` would pick now
    (from params, config or events: the plan may have failed before its XCom, or config changed
    since); {"released": [uri...]}. Runs after every other task of the run, whatever their
    outcome; changes no data. Skipped, as the plan was, when there is no lake."""
    from seedance_tasks.compaction.run import LEASE_NAME

    lakes = [lake for lake in (planned or {}).get("lakes") or [] if isinstance(lake, dict)]
    try:
        lakes += lakes_to_compact(params, _settings(params), events)
    except SeedanceError:  # bad params: the plan task failed on them before it took any lease
        pass
    if not lakes:
        skip("no dataset, no lease to release")
    uris = dict.fromkeys(str(lake["uri"]) for lake in lakes if lake.get("uri") and not lake.get("dry_run"))
    return {"released": [uri for uri in uris if release_run_lease(uri, LEASE_NAME)]}
