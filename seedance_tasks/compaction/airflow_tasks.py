"""The compaction DAG's task bodies: read params, call the library, return a small summary.

Every task of one DAG run holds the lake's lease as one holder (`airflow_lease_holder()`): the
plan task takes it, each mapped `compact` task (and its retries) takes it back, the purge task
releases it; a failed DAG run's lease expires by its TTL.
"""

from __future__ import annotations

from seedance_tasks.dag_support import airflow_lease_holder, fail_fast
from seedance_tasks.errors import UsageError


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
    """Take the lake's lease, recover, plan and save the plan; returns {"run_id", "plan_uri", "groups", ...}.

    A scheduled run with no URI configured is skipped, not failed.
    """
    from airflow.sdk.exceptions import AirflowSkipException

    from seedance_tasks.compaction.run import plan_for_dag

    settings = _settings(params)
    uri = params.get("uri") or settings.default_uri
    if not uri:
        raise AirflowSkipException(
            "no dataset to compact: set the `uri` param, or compaction.default_uri in config/seedance.yaml"
        )
    return plan_for_dag(uri, settings, holder=airflow_lease_holder(), dry_run=bool(params.get("dry_run")))


@fail_fast
def compact_group_task(group: dict) -> dict:
    """Compact one group of partitions of a saved plan; safe to retry with the same group."""
    from seedance_tasks.compaction.run import compact_group_attempt

    return compact_group_attempt(group, holder=airflow_lease_holder())


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
    recovered = list(planned["recovered"]) + [item for group in results for item in group.get("recovered", [])]
    return summarize(plan, flat, settings, recovered=recovered, dry_run=planned["dry_run"])


@fail_fast
def purge_task(params: dict, summary: dict | None) -> dict:
    """Purge the lake's trash runs older than the `purge_older_than` param and release the
    DAG run's lease (nothing is purged on dry runs)."""
    from seedance_tasks.compaction.run import purge_for_dag
    from seedance_tasks.units import parse_duration

    if not summary:
        return {"purged": [], "reason": "nothing compacted"}
    try:
        older_than = parse_duration(params.get("purge_older_than") or "7d")
    except UsageError as exc:
        raise UsageError(f"param purge_older_than: {exc.message}") from None
    return purge_for_dag(summary["uri"], older_than, holder=airflow_lease_holder(), apply=not summary["dry_run"])
