"""Task bodies of DAG `seedance_checkpoint_lifecycle`: read params, call the library, small summaries."""

from __future__ import annotations

import logging
from typing import Any

from seedance_tasks.dag_support import fail_fast, skip

log = logging.getLogger(__name__)
POLICY_PARAMS = ("keep_last", "keep_every", "keep_best", "metric")


def _settings():
    from seedance_tasks.config import load_settings

    return load_settings()


def _apply(params: dict, run_type: str | None, settings) -> bool:
    """A scheduled or asset-triggered run applies only if config says so
    (`lifecycle.apply_on_schedule`); a manual run only if its `apply` param is true."""
    if run_type in ("scheduled", "asset_triggered"):
        return bool(settings.lifecycle.apply_on_schedule)
    return bool(params.get("apply"))


def _overrides(params: dict) -> dict[str, Any]:
    return {key: params.get(key) for key in POLICY_PARAMS if params.get(key) not in (None, "")}


@fail_fast
def plan_task(params: dict | None, run_type: str | None = None, events=None) -> dict:
    """Resolve the stores and runs (params, config, or the events that triggered the run), check
    the policy, list the runs. Skipped, with the reason, when no store is configured."""
    from seedance_tasks.checkpoint.catalog import check_run_name, check_store_uri, existing_store
    from seedance_tasks.checkpoint.store import runs
    from seedance_tasks.lifecycle import policy
    from seedance_tasks.lifecycle.events import event_targets
    from seedance_tasks.lifecycle.journaled import run_names

    params = params or {}
    settings = _settings()
    apply = _apply(params, run_type, settings)
    targets, ignored = event_targets(events, apply)
    from_events = bool(targets)
    if not targets:
        if params.get("store"):
            store = check_store_uri(params["store"], "the `store` param")
        else:
            store = settings.lifecycle.store or settings.checkpoint.store
        if not store:
            skip("no checkpoint store: set the `store` param, or lifecycle.store or checkpoint.store in "
                 "config/seedance.yaml")
        run = check_run_name(params["run"]) if params.get("run") else None
        targets = [{"store": store, "run": run, "apply": apply}]
    overrides = _overrides(params)
    items, stores = [], []
    for target in targets:
        location = existing_store(target["store"])  # a missing folder or bucket fails here, not as "nothing to do"
        stores += [] if location.uri in stores else [location.uri]
        known = runs(location)
        names = [target["run"]] if target["run"] else known
        if target["run"] and target["run"] not in known:
            if not from_events:
                run_names(location, names)  # UsageError naming the run and the runs there
            ignored.append({"store": location.uri, "run": target["run"], "reason": "no such run in the store: left out"})
            log.warning("warning: an event names run %r, which checkpoint store %s does not hold: left out",
                        target["run"], location.uri)
            names = []
        items += [{"store": location.uri, "run": name, "apply": target["apply"]} for name in names]
    for item in items:  # a bad policy fails here, before any run is touched
        policy.policy_with(settings.lifecycle, item["run"], **overrides)
    # interrupted GC/tiering of a run is recovered by that run's own gc/tier task, under its lease
    return {"store": stores[0], "stores": stores, "apply": any(item["apply"] for item in items) if items else apply,
            "runs": [item["run"] for item in items], "items": items, "overrides": overrides,
            "purge_older_than": params.get("purge_older_than") or None, "ignored_events": ignored}


@fail_fast
def runs_task(planned: dict) -> list[dict]:
    """One item per run to map GC and tiering over."""
    return [{**item, "overrides": planned["overrides"]} for item in planned["items"]]


@fail_fast
def gc_task(item: dict) -> dict:
    """GC one run under its lease (held by this DAG run); returns counts, bytes freed, the cost
    before/after (no per-step lists) and what it recovered of an earlier attempt."""
    from seedance_tasks.checkpoint.catalog import damaged_error
    from seedance_tasks.dag_support import airflow_lease_holder
    from seedance_tasks.lifecycle.gc import collect

    result = collect(item["store"], [item["run"]], apply=item["apply"], holder=airflow_lease_holder(),
                     **item["overrides"])
    if result["damaged"]:  # the run was left alone: this run's task fails, the other runs' go on
        raise damaged_error(result["damaged"], "nothing of the run was collected")
    return {**item, "deleted": result["checkpoints_deleted"], "kept": result["checkpoints_kept"],
            "bytes_freed": result["bytes_freed"], "stray_files": result["stray_files"],
            "stray_bytes": result["stray_bytes"], "cost": result["cost"], "recovered": result["recovered"],
            "left_alone": [p["left_alone"] for p in result["runs"] if p["left_alone"]]}


@fail_fast
def tier_task(gc_result: dict) -> dict:
    """Tier one run (after its GC); returns what moved where and the cost before/after."""
    from seedance_tasks.checkpoint.catalog import damaged_error
    from seedance_tasks.dag_support import airflow_lease_holder
    from seedance_tasks.lifecycle.tiering import tier

    result = tier(gc_result["store"], [gc_result["run"]], apply=gc_result["apply"], holder=airflow_lease_holder())
    if result["damaged"]:
        raise damaged_error(result["damaged"], "nothing of the run was moved")
    moved: dict[str, int] = {}
    for move in result["moves"]:
        moved[move["to"]] = moved.get(move["to"], 0) + 1
    return {"store": gc_result["store"], "run": gc_result["run"], "apply": gc_result["apply"],
            "gc": {k: gc_result.get(k, 0) for k in ("deleted", "kept", "bytes_freed", "stray_files", "stray_bytes")},
            "gc_cost": gc_result["cost"],
            "moved": moved, "bytes_moved": result["bytes_moved"], "skipped": len(result["skipped"]),
            "cost": result["cost"], "recovered": gc_result.get("recovered", []) + result["recovered"]}


@fail_fast
def purge_task(planned: dict) -> dict:
    """Purge the trash of each store applied to and of its tier locations (older than the
    `purge_older_than` param, else `storage.trash_retention`)."""
    from seedance_tasks.lifecycle.report import purge
    from seedance_tasks.units import parse_duration

    settings = _settings()
    older = planned.get("purge_older_than")
    older_s = parse_duration(older) if older else settings.storage.trash_retention
    applied = sorted({item["store"] for item in planned.get("items", []) if item["apply"]})
    if not applied:
        return {"skipped": "dry run", "older_than_s": older_s}
    results = [purge(store, older_s) for store in applied]
    total = {"bytes": sum(r.get("bytes", 0) for r in results)}
    return {**(results[0] if len(results) == 1 else {"stores": results}), **total, "older_than_s": older_s}


def _figures(results: list[dict]) -> dict:
    """Deleted, moved, bytes and the monthly cost before and after over `results` (runs' tier results)."""
    from decimal import Decimal

    before = sum((Decimal(r["gc_cost"]["before"]["monthly_usd"]) for r in results), Decimal(0))
    after = sum((Decimal(r["cost"]["after"]["monthly_usd"]) for r in results), Decimal(0))
    return {"deleted": sum(r["gc"]["deleted"] for r in results),
            "bytes_freed": sum(r["gc"]["bytes_freed"] for r in results),
            "moved": sum(sum(r["moved"].values()) for r in results),
            "bytes_moved": sum(r.get("bytes_moved", 0) for r in results),
            "monthly_usd_before": str(before), "monthly_usd_after": str(after),
            "monthly_usd_saved": str(before - after)}


@fail_fast
def report_task(planned: dict, results: list[dict], purged: dict, asset=None) -> dict:
    """The run's summary: per run GC/tiering, totals, the cost before the pass and the stores'
    now. The event on `asset` carries the stores, what was deleted and moved, and the saving.

    The totals of a run that applied count only the runs it applied to (a dry one's figures, what
    an apply would do, are under `would`, never in the saving); a dry run's totals are what an
    apply would do, with `applied` false and a `note` saying so. Lists (runs, recovered attempts,
    damaged manifests) are cut to their first `SHOWN`, with counts; all of them are logged."""
    from seedance_tasks.checkpoint.airflow_tasks import shown
    from seedance_tasks.lifecycle.report import store_report

    results = list(results)
    applied = bool(planned["apply"])
    dry = [r for r in results if not r.get("apply")]
    stores = planned.get("stores") or [planned["store"]]
    now = {store: store_report(store) for store in stores}
    for report in now.values():
        report["damaged_count"] = len(report["damaged"])
        report["damaged"] = shown(report["damaged"], f"damaged manifests in {report['store']}")
    recovered = [item for r in results for item in r.get("recovered", [])]
    summary = {
        "store": planned["store"], "stores": stores, "applied": applied,
        "runs": shown(results, "runs collected and tiered"), "runs_count": len(results),
        **_figures([r for r in results if r.get("apply")] if applied else results),
        "purged_bytes": purged.get("bytes", 0), "store_now": now[planned["store"]],
        "recovered": shown(recovered, "interrupted attempts recovered"), "recovered_count": len(recovered),
    }
    if dry:
        summary["would"] = _figures(dry)
        summary["note"] = ("dry run: nothing was deleted, moved or re-tiered; the figures are what `apply` would do"
                           if not applied else f"{len(dry)} run(s) were a dry run: what an apply would do to them is "
                           "under `would`, not in the totals")
        log.info("%s: would delete %d checkpoint(s) (%d bytes) and move %d; nothing changed", summary["note"],
                 summary["would"]["deleted"], summary["would"]["bytes_freed"], summary["would"]["moved"])
    if planned.get("ignored_events"):
        summary["ignored_events"] = planned["ignored_events"]
    if len(stores) > 1:
        summary["stores_now"] = now
    if asset is not None:
        from seedance_tasks.dag_support import announce

        announce(asset, {key: summary[key] for key in (
            "stores", "applied", "deleted", "bytes_freed", "moved", "bytes_moved", "monthly_usd_before",
            "monthly_usd_after", "monthly_usd_saved", "purged_bytes")} | {"runs": [r["run"] for r in summary["runs"]],
                                                                           "runs_count": len(results)})
    return summary
