"""Checkpoint lifecycle: retention GC, hot -> warm -> cold tiering, trash purge, cost report.

Wiring only; the work is in `seedance_tasks.lifecycle`. Nightly, and on demand from the UI.
Per run of the store (mapped): GC drops the checkpoints the retention policy does not keep
(last N, every M-th step, best K by a metric, tagged, plus every base a kept delta needs), then
tiering moves the rest by age (copy, verify sha256, switch the manifest, retire the source).
Then the trash of the store and tier locations is purged by age, and a report gives bytes and
monthly cost per tier before and after. Each run is collected and tiered under its lease
(`run-<run>`, held by this DAG run: a retried task takes it back and finishes what its first
attempt's journal left; another DAG run or the CLI is refused). **Dry run unless `apply`**: a run from the UI applies
only when its `apply` box is ticked; a scheduled run only if `lifecycle.apply_on_schedule`.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from seedance_tasks.dag_support import DEFAULT_ARGS, mapped_results, tags


@dag(
    dag_id="seedance_checkpoint_lifecycle",
    schedule="30 3 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=tags("checkpoint", "storage", "cost"),
    doc_md=__doc__,
    params={
        "store": Param(
            "", type="string", title="Checkpoint store",
            description_md="Local path, `file:///…` or `s3://bucket/prefix`. Empty: `lifecycle.store`, "
            "else `checkpoint.store` from config.",
            section="Store",
        ),
        "run": Param("", type="string", title="Run", description="Only this run; empty = every run.", section="Store"),
        "apply": Param(
            False, type="boolean", title="Apply",
            description_md="Delete (to the trash) and move checkpoints. Off: a dry run that only reports.",
            section="Run",
        ),
        "keep_last": Param(None, type=["null", "integer"], minimum=1, title="Keep last N",
                           description="Empty: config (lifecycle.retention.keep_last).", section="Policy"),
        "keep_every": Param(None, type=["null", "integer"], minimum=1, title="Keep every M-th step",
                            description="Empty: config.", section="Policy"),
        "keep_best": Param(None, type=["null", "integer"], minimum=0, title="Keep best K",
                           description="By the metric below. Empty: config.", section="Policy"),
        "metric": Param(None, type=["null", "string"], title="Metric",
                        description="Metric recorded at save time, e.g. val_loss. Empty: config.", section="Policy"),
        "purge_older_than": Param(
            "", type="string", pattern=r"^(\d+(\.\d+)?\s*(s|m|min|h|d|w)?)?$", title="Purge trash older than",
            description="0 empties the trash. Empty: storage.trash_retention (7d).", section="Run",
        ),
    },
)
def seedance_checkpoint_lifecycle():
    @task(multiple_outputs=False)
    def plan(params: dict | None = None) -> dict:
        """Check the policy and list the runs (each run's gc/tier task recovers its own interrupted attempts)."""
        from seedance_tasks.lifecycle import airflow_tasks

        run_type = str(getattr(get_current_context()["dag_run"], "run_type", "") or "")
        return airflow_tasks.plan_task(params, run_type.split(".")[-1].lower())

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

    @task(multiple_outputs=False, trigger_rule="none_failed")
    def purge(planned: dict, results: list[dict]) -> dict:
        """Free the trash of the store and tier locations older than `purge_older_than`."""
        from seedance_tasks.lifecycle import airflow_tasks

        return airflow_tasks.purge_task(planned)

    @task(multiple_outputs=False, trigger_rule="none_failed")
    def report(planned: dict, results: list[dict], purged: dict) -> dict:
        """Bytes and monthly cost by tier, before and after; what was deleted and moved."""
        from seedance_tasks.lifecycle import airflow_tasks

        return airflow_tasks.report_task(planned, mapped_results(results), purged)

    planned = plan()
    gc_results = gc.expand(item=runs(planned))
    tier_results = tier.expand(gc_result=gc_results)
    purged = purge(planned, tier_results)
    report(planned, tier_results, purged)


seedance_checkpoint_lifecycle()
