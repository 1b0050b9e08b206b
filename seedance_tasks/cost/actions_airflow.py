"""Thin Airflow adapters of the cost actions workflow (`actions.py`): the plan/isolate/settle task
bodies, the owners' confirmation (Airflow human-in-the-loop) and the deferrable reminders.

Importable at DAG parse time: only Airflow at the top; Seedance's library inside the calls.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
from airflow.sdk import BaseOperator, Param

from seedance_tasks.cost.assets import COST_STATEMENTS
from seedance_tasks.dag_support import fail_fast, run_type_of

log = logging.getLogger("seedance_tasks.dag")
CONFIRM, DISPUTE = "Confirm", "Dispute"  # the same as actions.CONFIRM / DISPUTE
NO_DEFER_WITHIN = timedelta(seconds=10)  # a wait shorter than this is slept in the worker, not deferred


def _last_closed_month(context: dict[str, Any]) -> str:
    run_after = getattr(context.get("dag_run"), "run_after", None) or datetime.now(UTC)
    first = run_after.astimezone(UTC).replace(day=1)
    return (first - timedelta(days=1)).strftime("%Y-%m")


@fail_fast
def plan_task(params: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """The run's plan: month and outputs root from the params, else from the triggering
    `seedance_cost_statements` event, else the last closed month and `cost.out_uri`. Skipped with
    the reason when no outputs root is configured, or when the event comes from a backfill; a
    malformed event fails, naming its field (`actions.statements_event`).
    Applies when the `apply` param says so, or, for an event-started run, `cost.actions.apply`."""
    from seedance_tasks.config import load_section
    from seedance_tasks.cost import actions
    from seedance_tasks.dag_support import skip, triggering_extras

    settings = load_section("cost")
    events = triggering_extras(context.get("triggering_asset_events"), [COST_STATEMENTS.name])
    event = actions.statements_event(events[-1]) if events and events[-1] else {}
    if event.get("backfill") and not params.get("month"):
        skip(f"the {event.get('month')} statements come from a backfill: a backfill never starts actions; "
             "trigger this DAG with the month to act on it")
    out = params.get("out") or event.get("out") or settings.out_uri
    if not out:
        skip("no output root configured: set the out param, or cost.out_uri in config/seedance.yaml")
    month = params.get("month") or event.get("month") or _last_closed_month(context)
    run_type = run_type_of(context.get("dag_run"))
    apply = bool(params.get("apply")) or (bool(event) and run_type == "asset_triggered" and settings.actions.apply)
    return actions.plan(month=month, out=out, owners=params.get("owners") or None, apply=apply)


@fail_fast
def isolate_task(data: dict[str, Any]) -> dict[str, Any]:
    """Snapshot and isolate the month's idle resources (dry run: the plan)."""
    from seedance_tasks.cost import actions

    result = actions.isolate(data)
    for line in result["planned"]:
        log.info("plan: %s", line)
    for item in result["failed"]:
        log.warning("error: %s refused by AWS (%s); hint: %s", item["resource_id"], item["error"], item["hint"])
    return result


@fail_fast
def settle_task(data: dict[str, Any]) -> dict[str, Any]:
    """Deduct confirmed charges and apply budget freezes (dry run: the plan)."""
    from seedance_tasks.cost import actions

    result = actions.settle(data)
    for line in result["planned"]:
        log.info("plan: %s", line)
    log.info("report ledger: %s", data["ledger"])
    return result


class OwnerConfirmation(HITLOperator):
    """One owner's confirmation of the month's chargeback (Confirm or Dispute, with a reason),
    answered in the Airflow UI (Required actions) or its REST API by the owner's approvers.

    Waits without a worker slot (Airflow 3.3 parks the task in `awaiting_input`) until the
    deadline (at least one calendar day); no answer by then is recorded as `unanswered`. The
    answer goes to the budget ledger; a retried task or re-run month whose answer is recorded
    returns it without asking again.
    """

    def __init__(self, *, request: dict[str, Any], options: list[str] | None = None,
                 params: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(
            options=options or [CONFIRM, DISPUTE],
            params=params or {"reason": Param("", type="string", title="Reason",
                                              description="Why you confirm or dispute the amount (kept in the "
                                              "budget ledger).")},
            **kwargs)
        self.request = dict(request)  # owner, month, out, confirm_by, day_length_s (see actions.plan)

    def _full_request(self) -> dict[str, Any]:
        return {**self.request, "subject": self.subject, "body": self.body or ""}

    def execute(self, context):
        from seedance_tasks.cost import actions

        request = self._full_request()

        @fail_fast
        def prepare() -> dict[str, Any] | None:
            found = actions.decision(request["out"], request["month"], request["owner"])
            if found is not None:
                return found.details
            actions.ask(request)
            self.response_timeout = actions.response_timeout(request, datetime.now(UTC))
            return None

        recorded = prepare()
        if recorded is not None:
            log.info("%s %s: answered before (%s); not asked again", request["owner"], request["month"],
                     recorded.get("status"))
            return {"owner": request["owner"], "status": recorded.get("status"), "recorded_before": True}
        return super().execute(context)  # parks the task until an answer or the deadline

    def validate_params_input(self, params_input) -> None:
        """Take the answer's form whatever a REST client sent: only `reason` is read (as text, by
        `actions.record_decision`); other keys are logged and left out. Airflow's check would fail
        the task after the owner answered, and the answer would be lost."""
        extra = sorted(str(key) for key in (params_input or {}) if key != "reason")
        if extra:
            log.warning("answer fields %s are not asked for; left out (only 'reason' is kept)", ", ".join(extra))

    def execute_complete(self, context, event: dict[str, Any]):
        from seedance_tasks.cost import actions

        request = self._full_request()
        if "error" in event and event.get("error_type") == "timeout":
            kept = fail_fast(actions.record_decision)(request, None, None, None)
        else:
            answer = super().execute_complete(context, event)
            kept = fail_fast(actions.record_decision)(
                request, answer["chosen_options"][0], (answer["params_input"] or {}).get("reason"),
                answer["responded_by_user"])
        log.info("%s %s: %s", request["owner"], request["month"], kept.details.get("status"))
        return {"owner": request["owner"], "status": kept.details.get("status"),
                "reason": kept.details.get("reason"), "by": kept.details.get("by")}


class OwnerReminders(BaseOperator):
    """Reminds owners who have not answered, at `cost.actions.reminders_after_hours`, each reminder
    once; between reminders it defers (a DateTimeTrigger in the triggerer, no worker slot held).
    Ends when everyone answered, the confirmation deadline passed, or in a dry run."""

    template_fields = ("plan",)

    def __init__(self, *, plan: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.plan = plan

    def execute(self, context):
        return self._next(sent=[])

    def resume(self, context, event: Any = None, index: int = 0, sent: list | None = None):
        from seedance_tasks.cost import actions

        reminded = fail_fast(actions.remind)(self.plan, index)
        log.info("reminder %d sent to %s", index + 1, ", ".join(reminded) or "nobody (all answered or sent before)")
        return self._next(sent=[*(sent or []), *[f"{index + 1}:{owner}" for owner in reminded]])

    def _next(self, sent: list):
        from airflow.providers.standard.triggers.temporal import DateTimeTrigger

        from seedance_tasks.cost import actions

        while True:
            due = fail_fast(actions.next_reminder)(self.plan, datetime.now(UTC))
            if due is None:
                return {"mode": self.plan["mode"], "sent": sent}
            index, when = due
            if when - datetime.now(UTC) > NO_DEFER_WITHIN:
                self.defer(trigger=DateTimeTrigger(moment=when), method_name="resume",
                           kwargs={"index": index, "sent": sent})
            time.sleep(max((when - datetime.now(UTC)).total_seconds(), 0))  # due (almost) now: no deferral
            reminded = fail_fast(actions.remind)(self.plan, index)
            sent = [*sent, *[f"{index + 1}:{owner}" for owner in reminded]]


class DeadlineSensor(DateTimeSensorAsync):
    """`DateTimeSensorAsync` that does not defer for a moment already (almost) reached: a re-run
    month's past deadline, or one a few seconds away, completes in the worker instead of racing
    its own resumption."""

    def execute(self, context):
        left = (self._moment - datetime.now(UTC)).total_seconds()
        if left > NO_DEFER_WITHIN.total_seconds():
            return super().execute(context)
        time.sleep(max(left, 0))
        return None
