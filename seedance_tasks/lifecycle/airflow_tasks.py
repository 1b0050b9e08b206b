"""Task bodies of DAG `seedance_checkpoint_lifecycle`: read params, call the library, small summaries."""

from __future__ import annotations

from typing import Any

from seedance_tasks.dag_support import fail_fast
from seedance_tasks.errors import UsageError

POLICY_PARAMS = ("keep_last", "keep_every", "keep_best", "metric")


def _settings():
    from seedance_tasks.config import load_settings

    return load_settings()


def _apply(params: dict, run_type: str | None, settings) -> bool:
    """A scheduled run applies only if config says so; a manual run only if its `apply` param is true."""
    if run_type == "scheduled":
        return bool(settings.lifecycle.apply_on_schedule)
    return bool(params.get("apply"))


def _overrides(params: dict) -> dict[str, Any]:
    return {key: params.get(key) for key in POLICY_PARAMS if params.get(key) not in (None, "")}


@fail_fast
def plan_task(params: dict | None, run_type: str | None = None) -> dict:
    """Resolve the store, check the policy, finish interrupted runs (when applying), list the runs."""
    from seedance_tasks import storage
    from seedance_tasks.checkpoint.store import runs
    from seedance_tasks.lifecycle import policy

    params = params or {}
    settings = _settings()
    store = params.get("store") or settings.lifecycle.store or settings.checkpoint.store
    if not store:
        raise UsageError("no checkpoint store", hint="set the `store` param, lifecycle.store or checkpoint.store")
    location = storage.resolve(store)
    apply = _apply(params, run_type, settings)
    overrides = _overrides(params)
    names = [params["run"]] if params.get("run") else runs(location)
    for name in names:  # a bad policy fails here, before any run is touched
        policy.policy_with(settings.lifecycle, name, **overrides)
    # interrupted GC/tiering of a run is recovered by that run's own gc/tier task, under its lease
    return {"store": location.uri, "apply": apply, "runs": names, "overrides": overrides,
            "purge_older_than": params.get("purge_older_than") or None}


@fail_fast
def runs_task(planned: dict) -> list[dict]:
    """One item per run to map GC and tiering over."""
    return [{"store": planned["store"], "run": run, "apply": planned["apply"], "overrides": planned["overrides"]}
            for run in planned["runs"]]


@fail_fast
def gc_task(item: dict) -> dict:
    """GC one run under its lease (held by this DAG run); returns counts, bytes freed, the cost
    before/after (no per-step lists) and what it recovered of an earlier attempt."""
    from seedance_tasks.dag_support import airflow_lease_holder
    from seedance_tasks.lifecycle.gc import collect

    result = collect(item["store"], [item["run"]], apply=item["apply"], holder=airflow_lease_holder(),
                     **item["overrides"])
    return {**item, "deleted": result["checkpoints_deleted"], "kept": result["checkpoints_kept"],
            "bytes_freed": result["bytes_freed"], "cost": result["cost"], "recovered": result["recovered"]}


@fail_fast
def tier_task(gc_result: dict) -> dict:
    """Tier one run (after its GC); returns what moved where and the cost before/after."""
    from seedance_tasks.dag_support import airflow_lease_holder
    from seedance_tasks.lifecycle.tiering import tier

    result = tier(gc_result["store"], [gc_result["run"]], apply=gc_result["apply"], holder=airflow_lease_holder())
    moved: dict[str, int] = {}
    for move in result["moves"]:
        moved[move["to"]] = moved.get(move["to"], 0) + 1
    return {"store": gc_result["store"], "run": gc_result["run"], "apply": gc_result["apply"],
            "gc": {k: gc_result[k] for k in ("deleted", "kept", "bytes_freed")}, "gc_cost": gc_result["cost"],
            "moved": moved, "bytes_moved": result["bytes_moved"], "skipped": len(result["skipped"]),
            "cost": result["cost"], "recovered": gc_result.get("recovered", []) + result["recovered"]}


@fail_fast
def purge_task(planned: dict) -> dict:
    """Purge the trash of the store and of every tier location (older than the param or config)."""
    from seedance_tasks.lifecycle.report import purge
    from seedance_tasks.units import parse_duration

    settings = _settings()
    older = planned.get("purge_older_than")
    older_s = parse_duration(older) if older else settings.storage.trash_retention
    if not planned["apply"]:
        return {"skipped": "dry run", "older_than_s": older_s}
    return {**purge(planned["store"], older_s), "older_than_s": older_s}


@fail_fast
def report_task(planned: dict, results: list[dict], purged: dict) -> dict:
    """The run's summary: per run GC/tiering, totals, the cost before the pass and the store's now."""
    from decimal import Decimal

    from seedance_tasks.lifecycle.report import store_report

    results = list(results)
    before = sum((Decimal(r["gc_cost"]["before"]["monthly_usd"]) for r in results), Decimal(0))
    after = sum((Decimal(r["cost"]["after"]["monthly_usd"]) for r in results), Decimal(0))
    now = store_report(planned["store"])
    return {
        "store": planned["store"], "applied": planned["apply"], "runs": results,
        "deleted": sum(r["gc"]["deleted"] for r in results),
        "bytes_freed": sum(r["gc"]["bytes_freed"] for r in results),
        "moved": sum(sum(r["moved"].values()) for r in results),
        "monthly_usd_before": str(before), "monthly_usd_after": str(after),
        "monthly_usd_saved": str(before - after), "purged_bytes": purged.get("bytes", 0),
        "store_now": now, "recovered": [item for r in results for item in r.get("recovered", [])],
    }
