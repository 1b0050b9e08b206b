"""Cost signals: the nightly early-warning audit of the red lines, each signal wired to its fix.

Wiring only; the work is in `seedance_tasks.signals`. Each night at 04:30 UTC the day before is
audited, whole (the run's data interval starts at 04:30 that day, so its logical date is that
day; a backfilled day likewise; a run triggered without a date audits the day before the
trigger): every rule runs as one mapped task, then the night's findings are merged with the previous night's and written under `signals.root/nights/<date>/`
(JSON, Parquet, HTML). New or escalated findings are announced once (e-mail, webhook), and the
fixes of `small-files` and `checkpoint-bloat` are triggered through Asset events whose extra names
the targets (dry runs unless `signals.apply`). Re-running a night writes the same outputs and
sends nothing twice. A rule whose inputs are not configured is reported `skipped: <reason>`.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import CronDataIntervalTimetable, Param, dag, task

from seedance_tasks.dag_support import DEFAULT_ARGS, mapped_results, tags
from seedance_tasks.signals.assets import CHECKPOINT_BLOAT, SMALL_FILES


@dag(
    dag_id="seedance_signals",
    schedule=CronDataIntervalTimetable("30 4 * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=tags("signals", "cost"),
    doc_md=__doc__,
    params={
        "date": Param(None, type=["null", "string"], format="date", title="Night",
                      description="Day to audit (YYYY-MM-DD); empty: the day before the run (a whole day).",
                      section="Run"),
        "billing": Param(None, type=["null", "string"], title="Billing (FOCUS)",
                         description="FOCUS file or folder; empty: signals.billing_uri.", section="Inputs"),
        "lakes": Param([], type="array", title="Dataset roots",
                       description="Dataset roots to audit; empty: signals.lakes.", section="Inputs"),
        "checkpoints": Param(None, type=["null", "string"], title="Checkpoint store",
                             description="Empty: signals.checkpoints_uri.", section="Inputs"),
        "metrics": Param(None, type=["null", "string"], title="Metrics",
                         description_md="Parquet samples URI or a Prometheus `http://` URL; empty: "
                         "`signals.metrics_uri`.", section="Inputs"),
        "out": Param(None, type=["null", "string"], title="Output root",
                     description="Empty: signals.root.", section="Run"),
    },
)
def seedance_signals():
    @task
    def prepare(params: dict | None = None, logical_date=None) -> dict:
        """The night audited and the rules to map over."""
        from seedance_tasks.signals import airflow_tasks

        return airflow_tasks.prepare_task(params, logical_date)

    @task
    def rules(night: dict) -> list[str]:
        return night["rules"]

    @task(max_active_tis_per_dagrun=4)
    def evaluate(rule_id: str, night: dict, params: dict | None = None) -> dict:
        """One rule for the night (fired, silent, or skipped with its reason)."""
        from seedance_tasks.signals import airflow_tasks

        return airflow_tasks.evaluate_task(rule_id, night, params)

    @task
    def publish(night: dict, results: list[dict], params: dict | None = None) -> dict:
        """Merge with the previous night; write findings.json, findings.parquet, report.html."""
        from seedance_tasks.signals import airflow_tasks

        mapped_results(results)
        return airflow_tasks.publish_task(night, params)

    @task
    def notify(summary: dict, params: dict | None = None) -> dict:
        """One message per new or escalated finding, e-mail and webhook, never twice."""
        from seedance_tasks.signals import airflow_tasks

        return airflow_tasks.notify_task(summary, params)

    @task(outlets=[SMALL_FILES])
    def fix_small_files(summary: dict, params: dict | None = None, outlet_events=None) -> dict:
        """Asset event for the compaction DAG: the lakes of new small-files findings."""
        from seedance_tasks.signals import airflow_tasks

        return airflow_tasks.fix_task("small-files", summary, params, outlet_events, SMALL_FILES)

    @task(outlets=[CHECKPOINT_BLOAT])
    def fix_checkpoint_bloat(summary: dict, params: dict | None = None, outlet_events=None) -> dict:
        """Asset event for the lifecycle DAG: the stores of new checkpoint-bloat findings."""
        from seedance_tasks.signals import airflow_tasks

        return airflow_tasks.fix_task("checkpoint-bloat", summary, params, outlet_events, CHECKPOINT_BLOAT)

    night = prepare()
    results = evaluate.partial(night=night).expand(rule_id=rules(night))
    summary = publish(night, results)
    notify(summary)
    fix_small_files(summary)
    fix_checkpoint_bloat(summary)


seedance_signals()
