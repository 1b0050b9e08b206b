"""The compaction DAG's task bodies: read params, call the library, return a small summary."""

from __future__ import annotations

from seedance_tasks.dag_support import fail_fast
from seedance_tasks.errors import UsageError

MAX_GROUPS = 64  # mapped task instances per run; well under Airflow's max_map_length


def _settings(params: dict):
    from seedance_tasks.config import load_settings, settings_with

    return settings_with(
        load_settings(), "compaction",
        target_file_size=params.get("target_file_size"),
        small_file_size=params.get("small_file_size") or None,
        min_age=params.get("min_age"),
    )


@fail_fast
def plan_task(params: dict) -> dict:
    """Recover, plan and save the plan; returns {"run_id", "plan_uri", "groups", ...} for mapping.

    A scheduled run with no URI configured is skipped, not failed.
    """
    from airflow.sdk.exceptions import AirflowSkipException

    from seedance_tasks.compaction.run import group_partitions, prepare, save_plan, summarize

    settings = _settings(params)
    uri = params.get("uri") or settings.default_uri
    if not uri:
        raise AirflowSkipException(
            "no dataset to compact: set the `uri` param, or compaction.default_uri in config/seedance.yaml"
        )
    plan, recovered = prepare(uri, settings, recover=not params.get("dry_run"))
    if params.get("dry_run"):
        return {"dry_run_report": summarize(plan, [], settings, recovered=recovered, dry_run=True), "groups": []}
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
                   for group in group_partitions(plan, MAX_GROUPS)],
    }


@fail_fast
def compact_group_task(group: dict) -> dict:
    """Compact one group of partitions of a saved plan; returns their results."""
    from seedance_tasks.compaction.run import compact_group, load_plan
    from seedance_tasks.compaction.settings import CompactionSettings

    plan = load_plan(group["plan_uri"])
    settings = CompactionSettings.model_validate(group["settings"])
    return {"results": compact_group(plan, group["indices"], settings, workers=1)}


@fail_fast
def report_task(planned: dict, results: list[dict]) -> dict:
    """The run's report, as `seedance compact --json` prints it."""
    from seedance_tasks.compaction.plan import CompactionPlan
    from seedance_tasks.compaction.run import load_plan, summarize
    from seedance_tasks.compaction.settings import CompactionSettings

    if "dry_run_report" in planned:
        return planned["dry_run_report"]
    settings = CompactionSettings.model_validate(planned["settings"])
    if planned["plan_uri"]:
        plan = load_plan(planned["plan_uri"])
    else:
        plan = CompactionPlan(planned["run_id"], planned["uri"])
    flat = [result for group in results for result in group["results"]]
    return summarize(plan, flat, settings, recovered=planned["recovered"], dry_run=planned["dry_run"])


@fail_fast
def purge_task(params: dict, summary: dict | None) -> dict:
    """Purge the lake's trash runs older than the `purge_older_than` param (skipped on dry runs)."""
    from seedance_tasks import storage
    from seedance_tasks.units import parse_duration

    if not summary:
        return {"purged": [], "reason": "nothing compacted"}
    try:
        older_than = parse_duration(params.get("purge_older_than") or "7d")
    except UsageError as exc:
        raise UsageError(f"param purge_older_than: {exc.message}") from None
    return storage.purge_trash(storage.resolve(summary["uri"]), older_than, apply=not summary["dry_run"])
