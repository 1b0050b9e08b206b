"""Checkpoint lifecycle: retention GC, hot -> warm -> cold tiering, trash purge, cost report.

Wiring only; the work is in `seedance_tasks.lifecycle`. Nightly, and on demand from the UI.
Per run of the store (mapped): GC drops the checkpoints the retention policy does not keep
(last N, every M-th step, best K by a metric, tagged, plus every base a kept delta needs), then
tiering moves the rest by age (copy, verify sha256, switch the manifest, retire the source).
Then the trash of the store and tier locations is purged by age, and a report gives bytes and
monthly cost per tier before and after. Each run is collected and tiered under its lease
(`run-<run>`, held by this DAG run: a retried task takes it back and finishes what its first
attempt's journal left; another DAG run or the CLI is refused). **Dry run unless `apply`**: a run from the UI applies
only when its `apply` box is ticked; a scheduled or asset-triggered run only if
`lifecycle.apply_on_schedule`, a `checkpoint-bloat` fix if the signal's event says so (its
`apply` is the JSON `true`). An event's fields are untrusted: a malformed store, run or target is
left out and named in the report's `ignored_events`; a dry run's report says what apply `would` do.

Runs nightly, on every stored checkpoint (an event on `seedance_checkpoint_store` from the
checkpoint or training DAG: its store and runs) and on each `checkpoint-bloat` signal (its store
and run). Skipped, with the reason, when no store is configured. Every empty field is taken from
config/seedance.yaml. The report emits `seedance_checkpoint_lifecycle_report` (stores, deleted,
moved, bytes, monthly cost before and after).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import (
    Asset,
    AssetOrTimeSchedule,
    CronTriggerTimetable,
    Param,
    dag,
    get_current_context,
    task,
)

from seedance_tasks.checkpoint.assets import CHECKPOINT_STORE
from seedance_tasks.dag_support import (
    DEFAULT_ARGS,
    duration_param,
    from_config,
    mapped_results,
    optional_param,
    run_type_of,
    tags,
)
from seedance_tasks.signals.assets import CHECKPOINT_BLOAT

LIFECYCLE_REPORT = Asset(name="seedance_checkpoint_lifecycle_report", uri="seedance://checkpoints/lifecycle")


@dag(
    dag_id="seedance_checkpoint_lifecycle",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("30 3 * * *", timezone="UTC"), assets=(CHECKPOINT_STORE | CHECKPOINT_BLOAT)
    ),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=tags("checkpoint", "storage", "cost"),
    doc_md=__doc__,
    params={
        "store": optional_param(
            "Checkpoint store", "Local path, `file:///…` or `s3://bucket/prefix`.",
            empty=from_config("lifecycle.store") + ", else `checkpoint.store` (neither set: the run is skipped)",
            section="Store",
        ),
        "run": optional_param("Run", "Only this run of the store.", empty="every run", section="Store"),
        "apply": Param(
            False, type="boolean", title="Apply",
            description_md="Delete (to the trash) and move checkpoints. Off: a dry run that only reports.",
            section="Run",
        ),
        "keep_last": optional_param("Keep last N", "The N latest steps of each run.", type="integer", minimum=1,
                                    empty=from_config("lifecycle.retention.keep_last"), section="Policy"),
        "keep_every": optional_param("Keep every M-th step", "Every step that is a multiple of M.", type="integer",
                                     minimum=1, empty=from_config("lifecycle.retention.keep_every"), section="Policy"),
        "keep_best": optional_param("Keep best K", "The K best steps by the metric below.", type="integer",
                                    minimum=0, empty=from_config("lifecycle.retention.keep_best"), section="Policy"),
        "metric": optional_param("Metric", "Metric recorded at save time, e.g. val_loss.",
                                 empty=from_config("lifecycle.retention.metric"), section="Policy"),
        "purge_older_than": duration_param("Purge trash older than", "0 empties the trash.",
                                           empty=from_config("storage.trash_retention"), section="Run"),
    },
)
def seedance_checkpoint_lifecycle():
    @task(multiple_outputs=False)
    def plan(params: dict | None = None, triggering_asset_events=None) -> dict:
        """Check the policy and list the runs (each run's gc/tier task recovers its own interrupted attempts)."""
        from seedance_tasks.lifecycle import airflow_tasks

        return airflow_tasks.plan_task(params, run_type_of(get_current_context()["dag_run"]), triggering_asset_events)

    @task
    def runs(planned: dict) -> list[dict]:
        """One item per run of the store."""
        from seedance_tasks.lifecycle import airflow_tasks

        return airflow_tasks.runs_task(planned)

    @task(multiple_outputs=False, max_active_tis_per_dagrun=1)
    def gc(item: dict) -> dict:
        """Retention GC of one run: manifests leave first, data goes to the trash."""
        from seedance_tasks.lifecycle import airflow_tasks

        return airflow_tasks.gc_task(item)

    @task(multiple_outputs=False, max_active_tis_per_dagrun=1)
    def tier(gc_result: dict) -> dict:
        """Tier one run: copy, verify sha256, switch the manifest, retire the source."""
        from seedance_tasks.lifecycle import airflow_tasks

        return airflow_tasks.tier_task(gc_result)

    @task(multiple_outputs=False, trigger_rule="none_failed_min_one_success")
    def purge(planned: dict, results: list[dict]) -> dict:
        """Free the trash of the store and tier locations older than `purge_older_than`."""
        from seedance_tasks.lifecycle import airflow_tasks

        return airflow_tasks.purge_task(planned)

    @task(multiple_outputs=False, outlets=[LIFECYCLE_REPORT], trigger_rule="none_failed_min_one_success")
    def report(planned: dict, results: list[dict], purged: dict) -> dict:
        """Bytes and monthly cost by tier, before and after; what was deleted and moved."""
        from seedance_tasks.lifecycle import airflow_tasks

        return airflow_tasks.report_task(planned, mapped_results(results), purged, LIFECYCLE_REPORT)

    planned = plan()
    gc_results = gc.expand(item=runs(planned))
    tier_results = tier.expand(gc_result=gc_results)
    purged = purge(planned, tier_results)
    report(planned, tier_results, purged)


seedance_checkpoint_lifecycle()
