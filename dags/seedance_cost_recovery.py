"""Cost recovery (chargeback): each month's bill attributed to owners, shared costs split,
idle resources and over-budget owners acted on, statements and a report published.

Wiring only; the work is in `seedance_tasks.cost`. Runs at 03:00 UTC on the 1st and covers the
previous month (its data interval). Set `month` to run any month by hand. Past months (the DAG
must be unpaused: a paused DAG's backfill runs stay queued):

    airflow backfill create --dag-id seedance_cost_recovery \\
        --from-date 2024-07-01 --to-date 2024-09-30 --dag-run-conf '{"billing": "...", "out": "..."}'

runs July, August and September (logical dates 2024-07-01, 08-01, 09-01 03:00 UTC).

A backfill recomputes a month's outputs (byte-identical when nothing changed) and never tags,
freezes quotas or notifies again.

A run with no billing source or no output root (params empty, `cost.billing_uri` / `cost.out_uri`
unset, as shipped) is skipped with the reason. Every empty field is taken from config. The report
task emits `seedance_cost_statements` for each closed month: its extra carries the month, basis,
totals and unallocated amounts per currency and the URIs of `summary.json` and `report.html`.

One writer per month: every task holds the month's lease (`OUT/_seedance/leases/month-M.json`,
holder `airflow:<dag_id>:<run_id>`, shared by all tasks and retries of the run), so a CLI run or
another deployment on the same month is refused naming this run. Every task is safe to retry: a
retried report rolls an interrupted publish forward or back and publishes the same files. With
`cost.fail_on_empty_month`, a month without any valid billing line fails at `check`, unpublished.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import CronDataIntervalTimetable, Param, dag, get_current_context, task

from seedance_tasks.cost.assets import COST_STATEMENTS
from seedance_tasks.cost.workdays import MONTH_FORM_PATTERN
from seedance_tasks.dag_support import DEFAULT_ARGS, from_config, optional_param, tags


@dag(
    dag_id="seedance_cost_recovery",
    schedule=CronDataIntervalTimetable("0 3 1 * *", timezone="UTC"),
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=tags("cost"),
    doc_md=__doc__,
    params={
        "month": Param(
            None, type=["null", "string"], pattern=MONTH_FORM_PATTERN, title="Month",
            description="YYYY-MM to recover (a month not yet begun is refused); empty: the run's data "
            "interval (the previous month).",
            section="Month",
        ),
        "billing": optional_param(
            "Billing source", "FOCUS CSV/Parquet or CUR 2.0 Parquet file or folder (local, `file://`, `s3://`), "
            "or `ce://TAG` for Cost Explorer.",
            empty=from_config("cost.billing_uri") + " (none set: the run is skipped)", section="Inputs",
        ),
        "format": Param("focus", type="string", enum=["focus", "cur", "ce"], title="Billing format",
                        values_display={"focus": "FOCUS", "cur": "AWS CUR 2.0", "ce": "Cost Explorer API"},
                        description="How the billing data is laid out: FOCUS (CSV/Parquet), CUR 2.0 Parquet, "
                        "or the Cost Explorer API.",
                        section="Inputs"),
        "owners": optional_param("Owners / CMDB file", "Owners, shared-cost splits and budgets (YAML).",
                                 empty=from_config("cost.owners_file"), section="Inputs"),
        "utilization": optional_param("Utilization CSV", "Daily CPU/network/GPU CSV for the idle rule, or cloudwatch.",
                                      empty="no idle rule", section="Inputs"),
        "currency": Param(None, type=["null", "string"], title="Currency of files without BillingCurrency",
                          description="ISO 4217 code (e.g. USD) for billing files that lack a BillingCurrency "
                          "column; empty: cost.default_currency, else such files are refused.",
                          section="Inputs"),
        "out": optional_param("Output root", "Outputs go to OUT/month=YYYY-MM/.",
                              empty=from_config("cost.out_uri") + " (none set: the run is skipped)", section="Outputs"),
        "basis": optional_param("Charge basis", "Amortized (EffectiveCost) or cash (BilledCost).",
                                empty=from_config("cost.basis"), section="Outputs",
                                enum=["EffectiveCost", "BilledCost"]),
        "apply": Param(False, type="boolean", title="Apply actions",
                       description="Tag idle resources, freeze quotas, notify owners. Off: dry-run.",
                       section="Actions"),
        "backfill": Param(None, type=["null", "boolean"], title="Backfill mode",
                          description="No side effects at all. Empty: by month (older than last month) "
                          "or by run type (backfill runs always).", section="Actions"),
        "refresh": Param(False, type="boolean", title="Re-query Cost Explorer",
                         description="Query a closed month again although it is cached ($0.01 a page).",
                         section="Actions"),
    },
)
def seedance_cost_recovery():
    @task(multiple_outputs=False)
    def prepare(params: dict | None = None) -> dict:
        """Decide the month and mode, finish any interrupted publish, describe the run."""
        from seedance_tasks.cost import airflow_tasks

        return airflow_tasks.prepare_task(params or {}, get_current_context())

    @task(multiple_outputs=False)
    def ingest(job: dict) -> dict:
        """Read the billing source; keep the month's valid lines; record rejected rows."""
        from seedance_tasks.cost import airflow_tasks

        return {"job": job, **airflow_tasks.stage_task("ingest", job)}

    @task(multiple_outputs=False)
    def allocate(step: dict) -> dict:
        """Shared-cost splits, owner tags, CMDB rules; per-owner totals."""
        from seedance_tasks.cost import airflow_tasks

        return {"job": step["job"], **airflow_tasks.stage_task("allocate", step["job"])}

    @task(multiple_outputs=False)
    def rules(step: dict) -> dict:
        """Idle resources and over-budget owners; tagging/freezing/notifying only with apply."""
        from seedance_tasks.cost import airflow_tasks

        return {"job": step["job"], **airflow_tasks.stage_task("rules", step["job"])}

    @task(multiple_outputs=False)
    def statements(step: dict) -> dict:
        """One CSV statement per owner and summary.json (owners + unallocated == total, checked)."""
        from seedance_tasks.cost import airflow_tasks

        return {"job": step["job"], **airflow_tasks.stage_task("statements", step["job"])}

    @task(multiple_outputs=False)
    def check(step: dict) -> dict:
        """The staged month's warnings; with cost.fail_on_empty_month, an empty month fails here, unpublished."""
        from seedance_tasks.cost import airflow_tasks

        return {"job": step["job"], **airflow_tasks.stage_task("check", step["job"])}

    @task(multiple_outputs=False, outlets=[COST_STATEMENTS])
    def report(step: dict) -> dict:
        """The HTML report; then the month's outputs replace the old ones atomically."""
        from seedance_tasks.cost import airflow_tasks

        return airflow_tasks.report_task(step["job"], COST_STATEMENTS)

    report(check(statements(rules(allocate(ingest(prepare()))))))


seedance_cost_recovery()
