"""Task bodies of DAG `seedance_checkpoint_lifecycle`: read params, call the library, small summaries."""

from __future__ import annotations

from typing import Any

from seedance_tasks.dag_support import fail_fast, skip, triggering_extras

POLICY_PARAMS = ("keep_last", "keep_every", "keep_best", "metric")
STORE_ASSETS = ("seedance_checkpoint_store",)
BLOAT_ASSETS = ("seedance_signal_checkpoint_bloat",)


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


def event_targets(events, apply: bool) -> list[dict[str, Any]]:
    """The (store, run, apply) items named by the events that triggered a run, in order:
    a stored checkpoint (`seedance_checkpoint_store`: the checkpoint and training DAGs) names its
    store and runs; a `checkpoint-bloat` signal names a store, a run and whether to apply."""
    items: dict[tuple[str, str | None], bool] = {}
    for extra in triggering_extras(events, STORE_ASSETS):
        store = extra.get("store") or extra.get("checkpoint_store")
        runs = extra.get("runs") or ([extra["run"]] if extra.get("run") else [None])
        for run in runs if store else []:
            items[(store, run)] = apply
    for extra in triggering_extras(events, BLOAT_ASSETS):
        for target in extra.get("targets") or []:
            conf = target.get("conf") or {}
            if target.get("dag_id", "seedance_checkpoint_lifecycle") == "seedance_checkpoint_lifecycle" and conf.get(
                    "store"):
                items[(conf["store"], conf.get("run") or None)] = bool(conf.get("apply", extra.get("apply", False)))
    return [{"store": store, "run": run, "apply": value} for (store, run), value in items.items()]


@fail_fast
def plan_task(params: dict | None, run_type: str | None = None, events=None) -> dict:
    """Resolve the stores and runs (params, config, or the events that triggered the run), check
    the policy, list the runs. Skipped, with the reason, when no store is configured."""
    from seedance_tasks import storage
    from seedance_tasks.checkpoint.store import runs
    from seedance_tasks.lifecycle import policy

    params = params or {}
    settings = _settings()
    apply = _apply(params, run_type, settings)
    targets = event_targets(events, apply)
    if not targets:
        store = params.get("store") or settings.lifecycle.store or settings.checkpoint.store
        if not store:
            skip("no checkpoint store: set the `store` param, or lifecycle.store or checkpoint.store in "
                 "config/seedance.yaml")
        targets = [{"store": store, "run": params.get("run") or None, "apply": apply}]
    overrides = _overrides(params)
    items, stores = [], []
    for target in targets:
        location = storage.resolve(target["store"])
        stores += [] if location.uri in stores else [location.uri]
        names = [target["run"]] if target["run"] else runs(location)
        items += [{"store": location.uri, "run": name, "apply": target["apply"]} for name in names]
    for item in items:  # a bad policy fails here, before any run is touched
        policy.policy_with(settings.lifecycle, item["run"], **overrides)
    # interrupted GC/tiering of a run is recovered by that run's own gc/tier task, under its lease
    return {"store": stores[0], "stores": stores, "apply": any(item["apply"] for item in items) if items else apply,
            "runs": [item["run"] for item in items], "items": items, "overrides": overrides,
            "purge_older_than": params.get("purge_older_than") or None}


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


@fail_fast
def report_task(planned: dict, results: list[dict], purged: dict, asset=None) -> dict:
    """The run's summary: per run GC/tiering, totals, the cost before the pass and the stores'
    now. The event on `asset` carries the stores, what was deleted and moved, and the saving."""
    from decimal import Decimal

    from seedance_tasks.lifecycle.report import store_report

    results = list(results)
    before = sum((Decimal(r["gc_cost"]["before"]["monthly_usd"]) for r in results), Decimal(0))
    after = sum((Decimal(r["cost"]["after"]["monthly_usd"]) for r in results), Decimal(0))
    stores = planned.get("stores") or [planned["store"]]
    now = {store: store_report(store) for store in stores}
    summary = {
        "store": planned["store"], "stores": stores, "applied": planned["apply"], "runs": results,
        "deleted": sum(r["gc"]["deleted"] for r in results),
        "bytes_freed": sum(r["gc"]["bytes_freed"] for r in results),
        "moved": sum(sum(r["moved"].values()) for r in results),
        "bytes_moved": sum(r.get("bytes_moved", 0) for r in results),
        "monthly_usd_before": str(before), "monthly_usd_after": str(after),
        "monthly_usd_saved": str(before - after), "purged_bytes": purged.get("bytes", 0),
        "store_now": now[planned["store"]], "recovered": [item for r in results for item in r.get("recovered", [])],
    }
    if len(stores) > 1:
        summary["stores_now"] = now
    if asset is not None:
        from seedance_tasks.dag_support import announce

        announce(asset, {key: summary[key] for key in (
            "stores", "applied", "deleted", "bytes_freed", "moved", "bytes_moved", "monthly_usd_before",
            "monthly_usd_after", "monthly_usd_saved", "purged_bytes")} | {"runs": [r["run"] for r in results]})
    return summary
