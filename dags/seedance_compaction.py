"""Compaction: a data lake's small Parquet files rewritten into files of about a target size.

Wiring only; the work is in `seedance_tasks.compaction`. Nightly on `compaction.default_uri`
(skipped, with the reason, when none is set), on each `small-files` signal (an event on
`seedance_signal_small_files` names the lakes to fix: each is compacted, a dry run unless the
event says to apply), and on demand from the UI with the same parameters as `seedance compact`.
Every empty field is taken from config/seedance.yaml. The report task emits
`seedance_compacted_lake` with the run's figures (URI, files and bytes before/after, saving).
A teardown releases the run's lease of its lakes however the run ended (a `plan` or `compact` task
cleared and run again on its own after the run ended releases it at its end).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable, Param, dag, task, teardown

from seedance_tasks.dag_support import (
    DEFAULT_ARGS,
    duration_param,
    from_config,
    mapped_results,
    optional_param,
    size_param,
    tags,
)
from seedance_tasks.signals.assets import SMALL_FILES

COMPACTED_LAKE = Asset(name="seedance_compacted_lake", uri="seedance://compaction/lake")


@dag(
    dag_id="seedance_compaction",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 2 * * *", timezone="UTC"), assets=[SMALL_FILES]
    ),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=tags("compaction", "storage"),
    doc_md=__doc__,
    params={
        "uri": optional_param(
            "Dataset URI", "Root of the Parquet dataset: a local path, `file:///…` or `s3://bucket/prefix`.",
            empty=from_config("compaction.default_uri") + " (none set: the run is skipped)", section="Dataset",
        ),
        "target_file_size": size_param("Target file size", "Size of the files written.",
                                       empty=from_config("compaction.target_file_size"), section="Sizes"),
        "small_file_size": size_param(
            "Small-file threshold", "Compact files smaller than this.",
            empty=from_config("compaction.small_file_size") + ", whose default is 75% of the target", section="Sizes",
        ),
        "min_age": duration_param("Minimum file age", "Leave files younger than this alone.",
                                  empty=from_config("compaction.min_age"), section="Sizes"),
        "dry_run": Param(False, type="boolean", title="Dry run", description="Plan and report only.", section="Run"),
        "purge_older_than": duration_param(
            "Purge trash older than", "Trash runs older than this are purged after compaction.",
            empty=from_config("storage.trash_retention"), section="Run",
        ),
    },
)
def seedance_compaction():
    @task(multiple_outputs=False)
    def plan(params: dict | None = None, triggering_asset_events=None) -> dict:
        """Decide the lakes (params, config, or the small-files events), finish interrupted runs,
        list each lake once, save the plans; return their groups."""
        from seedance_tasks.compaction import airflow_tasks

        return airflow_tasks.plan_task(params or {}, triggering_asset_events)

    @task
    def groups(planned: dict) -> list[dict]:
        """The plan's partition groups, one mapped `compact` task each."""
        return planned["groups"]

    @task(multiple_outputs=False, max_active_tis_per_dagrun=8)
    def compact(group: dict) -> dict:
        """Rewrite one group of partitions: write hidden, verify, publish, retire to trash."""
        from seedance_tasks.compaction import airflow_tasks

        return airflow_tasks.compact_group_task(group)

    @task(multiple_outputs=False, outlets=[COMPACTED_LAKE], trigger_rule="none_failed_min_one_success")
    def report(planned: dict, results: list[dict]) -> dict:
        """One summary for the run (files, bytes, rows, skipped, quarantined, estimated saving)."""
        from seedance_tasks.compaction import airflow_tasks

        return airflow_tasks.report_task(planned, mapped_results(results), COMPACTED_LAKE)

    @task(multiple_outputs=False, trigger_rule="none_failed_min_one_success")
    def purge_trash(summary: dict, params: dict | None = None) -> dict:
        """Free the bytes of trash runs older than `purge_older_than`."""
        from seedance_tasks.compaction import airflow_tasks

        return airflow_tasks.purge_task(params, summary)

    @teardown
    def release_leases(params: dict | None = None, triggering_asset_events=None) -> dict:
        """Release the run's lease of its lakes however the run ended (a no-op after `purge_trash`)."""
        from airflow.sdk import get_current_context

        from seedance_tasks.compaction import airflow_tasks

        planned = get_current_context()["ti"].xcom_pull(task_ids="plan")  # None when the plan failed
        return airflow_tasks.release_task(params or {}, triggering_asset_events, planned)

    planned = plan()
    mapped = groups(planned)
    results = compact.expand(group=mapped)
    summary = report(planned, results)
    # downstream of every task (its trigger rule sees only direct upstreams): runs once all are done
    [planned, mapped, results, summary, purge_trash(summary=summary)] >> release_leases()


seedance_compaction()
