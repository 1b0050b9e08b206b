"""Compaction: a data lake's small Parquet files rewritten into files of about a target size.

Wiring only; the work is in `seedance_tasks.compaction`. Nightly on the configured lake, and
on demand from the UI with the same parameters as `seedance compact`.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Asset, Param, dag, task

from seedance_tasks.dag_support import DEFAULT_ARGS, mapped_results, tags

COMPACTED_LAKE = Asset(name="seedance_compacted_lake", uri="seedance://compaction/lake")


@dag(
    dag_id="seedance_compaction",
    schedule="0 2 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=tags("compaction", "storage"),
    doc_md=__doc__,
    params={
        "uri": Param(
            "",
            type="string",
            title="Dataset URI",
            description_md="Root of the Parquet dataset: a local path, `file:///…` or `s3://bucket/prefix`. "
            "Empty: `compaction.default_uri` from config.",
            section="Dataset",
        ),
        "target_file_size": Param(
            "512MiB", type="string", pattern=r"^\d+(\.\d+)?\s*([KMGT]i?B|B)?$",
            title="Target file size", description="Size of the files written, e.g. 512MiB.", section="Sizes",
        ),
        "small_file_size": Param(
            None, type=["null", "string"], title="Small-file threshold",
            description="Compact files smaller than this; empty = 75% of the target.", section="Sizes",
        ),
        "min_age": Param(
            "1h", type="string", pattern=r"^\d+(\.\d+)?\s*(s|m|min|h|d|w)?$",
            title="Minimum file age", description="Leave files younger than this alone (0, 30m, 1h, 7d).",
            section="Sizes",
        ),
        "dry_run": Param(False, type="boolean", title="Dry run", description="Plan and report only.", section="Run"),
        "purge_older_than": Param(
            "7d", type="string", title="Purge trash older than",
            description="Trash runs older than this are purged after compaction.", section="Run",
        ),
    },
)
def seedance_compaction():
    @task(multiple_outputs=False)
    def plan(params: dict | None = None) -> dict:
        """Finish any interrupted run, list the lake once, save the plan; return its groups."""
        from seedance_tasks.compaction import airflow_tasks

        return airflow_tasks.plan_task(params)

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

        return airflow_tasks.report_task(planned, mapped_results(results))

    @task(multiple_outputs=False, trigger_rule="none_failed_min_one_success")
    def purge_trash(summary: dict, params: dict | None = None) -> dict:
        """Free the bytes of trash runs older than `purge_older_than`."""
        from seedance_tasks.compaction import airflow_tasks

        return airflow_tasks.purge_task(params, summary)

    planned = plan()
    results = compact.expand(group=groups(planned))
    summary = report(planned, results)
    purge_trash(summary=summary)


seedance_compaction()
