"""Cost actions: what a closed month's chargeback leads to, on a FinOps timeline.

Started by each `seedance_cost_statements` event (a month published by `seedance_cost_recovery`),
or by hand with a `month` (and the outputs root). Wiring only; the work is in
`seedance_tasks.cost.actions` (see docs/cost.md, "The actions workflow"):

- **within 48 h** (`isolate`): the month's idle resources are snapshotted (EBS / RDS snapshots)
  and isolated (EC2 stopped, or moved into `cost.actions.isolation_security_group`; RDS stopped),
  all tagged `cost-review=pending`. A resource younger than `cost.actions.tuning_window` (30 days)
  is flagged, not acted on.
- **within 72 h** (`confirm`, one per owner): the owner confirms or disputes the charge, with a
  reason, in Airflow's *Required actions* (human-in-the-loop). `remind` reminds owners who have
  not answered (24 h, 48 h) and defers in between.
- **on the 5th working day** (`wait_for_deduction_day`, a deferrable sensor; then `settle`): confirmed
  amounts are deducted from the owners' budget pools and the over-budget rule's freezes applied,
  in the budget ledger `OUT/_seedance/cost/budget-ledger.json` (the dashboard's Cost page).

Working days come from `cost.actions` (weekend, holidays, time zone). Every action is a dry run
unless the run applies (`apply`; event-started runs: `cost.actions.apply`); a dry run reports the
plan in its task logs and summaries and waits for nothing. Every action is keyed in the ledger
(and snapshots by an AWS tag): a retried task or a re-run month repeats none. A run with no
output root (param empty, `cost.out_uri` unset, as shipped) is skipped with the reason.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from seedance_tasks.cost.actions_airflow import DeadlineSensor, OwnerConfirmation, OwnerReminders
from seedance_tasks.cost.assets import COST_STATEMENTS
from seedance_tasks.cost.workdays import MONTH_FORM_PATTERN
from seedance_tasks.dag_support import DEFAULT_ARGS, from_config, optional_param, tags

# a month as the task takes it (ASCII digits only), or empty: the event's month
MONTH_OR_EMPTY = rf"^(?:{MONTH_FORM_PATTERN.removeprefix('^')})?(?![\s\S])"


@dag(
    dag_id="seedance_cost_actions",
    schedule=[COST_STATEMENTS],
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=tags("cost"),
    doc_md=__doc__,
    params={
        "month": optional_param("Month", "The closed month (YYYY-MM) to act on.",
                                empty="the triggering event's month, else the last closed month",
                                section="Month", pattern=MONTH_OR_EMPTY),
        "out": optional_param("Output root", "The cost outputs root holding `month=YYYY-MM/summary.json`.",
                              empty="the event's, else " + from_config("cost.out_uri") + " (none set: skipped)",
                              section="Inputs"),
        "owners": optional_param("Owners / CMDB file", "Who confirms for each owner (`approvers`).",
                                 empty=from_config("cost.owners_file") + "; none: any user may answer",
                                 section="Inputs"),
        "apply": Param(False, type="boolean", title="Apply actions",
                       description="Snapshot and isolate, ask owners, deduct, freeze. Off: a dry run that "
                       "reports the plan.", section="Actions"),
    },
)
def seedance_cost_actions():
    @task(multiple_outputs=False)
    def plan(params: dict | None = None) -> dict:
        """Month, mode, deadlines from the working-day calendar, owners to ask."""
        from seedance_tasks.cost import actions_airflow

        return actions_airflow.plan_task(params or {}, get_current_context())

    @task(multiple_outputs=False)
    def requests(data: dict) -> list:
        """The owners to ask (none in a dry run): one `confirm` task each."""
        return data["confirmations"]

    @task(multiple_outputs=False)
    def isolate(data: dict) -> dict:
        """Within 48 h: snapshot and isolate idle resources (young ones flagged only)."""
        from seedance_tasks.cost import actions_airflow

        return actions_airflow.isolate_task(data)

    @task(multiple_outputs=False, trigger_rule="none_failed_min_one_success")
    def settle(data: dict) -> dict:
        """On the deduction day: deduct confirmed amounts, apply budget freezes."""
        from seedance_tasks.cost import actions_airflow

        return actions_airflow.settle_task(data)

    planned = plan()
    isolated = isolate(planned)
    confirm = OwnerConfirmation.partial(task_id="confirm").expand_kwargs(
        requests(planned))
    remind = OwnerReminders(task_id="remind", plan=planned)
    wait = DeadlineSensor(task_id="wait_for_deduction_day",
                               target_time="{{ ti.xcom_pull(task_ids='plan')['waits']['deduct_at'] }}")
    planned >> wait
    isolated >> [confirm, remind]
    [confirm, remind, wait] >> settle(planned)


seedance_cost_actions()
