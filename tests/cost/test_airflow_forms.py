"""Odd trigger forms and hostile asset events reaching the cost DAGs: a month that has not begun
is refused before anything is published; a `seedance_cost_statements` event whose fields are
malformed fails the actions' plan naming the field, never a bug report or a silent skip."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from seedance_tasks.cost import actions_airflow, recover
from seedance_tasks.cost.assets import COST_STATEMENTS
from seedance_tasks.errors import UsageError
from tests.cost.actions_support import MONTH, publish_month
from tests.cost.helpers import three_months


def test_a_month_that_has_not_begun_fails_prepare_and_publishes_nothing(run_dag, tmp_path):
    billing, owners = three_months(tmp_path)
    out = tmp_path / "out"
    conf = {"billing": str(billing), "owners": str(owners), "out": str(out), "month": "2099-01", "apply": True}
    dag_run = run_dag("seedance_cost_recovery", conf)
    assert dag_run.state == "failed"
    assert not (out / "month=2099-01").exists()  # no empty statement announced as a closed month
    with pytest.raises(UsageError, match="2099-01 has not begun") as refused:
        recover.describe(month="2099-01", billing=str(billing), owners=str(owners), out=str(out),
                         now=datetime(2026, 12, 6, tzinfo=UTC))
    assert "2026-11" in refused.value.hint
    # the month under way is still a month one may recover (a preview of its charges so far)
    assert recover.describe(month="2026-12", billing=str(billing), owners=str(owners), out=str(out),
                            now=datetime(2026, 12, 6, tzinfo=UTC)).month == "2026-12"


class _Event:
    def __init__(self, extra):
        self.extra, self.timestamp = extra, datetime.now(UTC)


class _Run:
    run_type = "asset_triggered"
    run_after = datetime.now(UTC)


def _plan(extra, owners):
    context = {"triggering_asset_events": {COST_STATEMENTS: [_Event(extra)]}, "dag_run": _Run()}
    return actions_airflow.plan_task({"owners": str(owners)}, context)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    return publish_month(tmp_path_factory.mktemp("published"), {"alpha": ["i-1"]})


@pytest.mark.parametrize(("extra", "named"), [
    ({"month": MONTH, "out": 5}, "event field 'out' is 5"),
    ({"month": MONTH, "out": {"bucket": "x"}}, "event field 'out' is {'bucket': 'x'}"),
    ({"month": MONTH, "out": ""}, "event field 'out' is ''"),
    ({"month": 202408, "out": "OUT"}, "event field 'month': not a month (YYYY-MM): 202408"),
    ({"month": "2024-8", "out": "OUT"}, "event field 'month'"),
    ({"month": MONTH, "out": "OUT", "backfill": "false"}, "event field 'backfill' is 'false'"),
    ({"month": "2024-07", "out": "OUT/month=2024-08"}, "is the folder of month=2024-08, but its 'month' is 2024-07"),
])
def test_a_malformed_statements_event_fails_the_plan_naming_its_field(published, extra, named):
    out, owners = published
    extra = {key: value.replace("OUT", str(out)) if isinstance(value, str) else value for key, value in extra.items()}
    with pytest.raises(AirflowFailException) as failed:
        _plan(extra, owners)
    message = str(failed.value)
    assert named in message and "unexpected" not in message and "--debug" not in message
    assert "trigger seedance_cost_actions by hand" in message


def test_a_well_formed_statements_event_plans_its_month(published):
    out, owners = published
    planned = _plan({"month": MONTH, "out": str(out / f"month={MONTH}"), "backfill": False}, owners)
    assert (planned["month"], planned["out"], planned["mode"]) == (MONTH, str(out), "dry-run")
    with pytest.raises(AirflowSkipException, match="backfill"):
        _plan({"month": MONTH, "out": str(out / f"month={MONTH}"), "backfill": True}, owners)


def test_a_month_of_thousands_of_owners_keeps_its_xcoms_and_event_small(run_dag, tmp_path, caplog):
    from seedance_tasks.dag_support import read_xcom
    from tests.cost.helpers import line, write_focus, write_owners

    many = 1500
    names = [f"team-{index:05d}" for index in range(many)]
    billing = write_focus(tmp_path / "billing" / "focus.csv",
                          [line("2024-08-03 00:00:00", "10", tags={"owner": name}) for name in names])
    owners = write_owners(tmp_path / "owners.yaml",
                          budgets={name: {"amount": "1", "currency": "USD"} for name in names})  # all over budget
    out = tmp_path / "out"
    caplog.set_level("INFO", logger="seedance_tasks.dag")
    dag_run = run_dag("seedance_cost_recovery", {"billing": str(billing), "owners": str(owners), "out": str(out),
                                                 "month": "2024-08", "backfill": False})
    assert dag_run.state == "success"
    rules = read_xcom(dag_run, "rules", "return_value", -1)
    assert len(rules["over_budget"]) == 100 and len(rules["actions"]["planned"]) == 100
    assert rules["omitted"] == {"over_budget": many - 100, "actions.planned": many - 100}
    report = read_xcom(dag_run, "report", "return_value", -1)
    assert len(report["event"]["owners"]) == 100 and report["event"]["owners_count"] == many
    assert report["event"]["totals"] == {"USD": "15000"}
    for step in ("rules", "report"):
        assert len(json.dumps(read_xcom(dag_run, step, "return_value", -1))) < 40_000, step
    logged = caplog.text  # the full lists are in the task logs
    assert f"freeze {names[-1]}'s quota for 2024-09" in logged
    assert len(json.loads((out / "month=2024-08" / "summary.json").read_text())["over_budget"]) == many


@pytest.mark.parametrize(("params_input", "kept"), [
    ({"reason": 42}, "42"),
    ({"reason": ["too", "much"]}, '["too", "much"]'),
    ({"reason": "  fine  ", "cc": "boss"}, "fine"),  # a key nobody asked for: left out, answer kept
    ({"reason": "x" * 50_000}, "x" * 1999 + "…"),
    ({}, ""),
])
def test_an_odd_hitl_answer_is_recorded_never_lost(tmp_path, params_input, kept):
    from seedance_tasks.cost import actions
    from seedance_tasks.cost.actions_airflow import OwnerConfirmation

    request = {"owner": "alpha", "month": MONTH, "out": str(tmp_path / "out"), "confirm_by": "2024-09-04T00:00:00+00:00"}
    operator = OwnerConfirmation(task_id="confirm", request=request, subject="Confirm", body="b")
    event = {"chosen_options": ["Confirm"], "params_input": params_input, "responded_at": datetime.now(UTC),
             "responded_by_user": {"id": 7, "name": ["not", "a", "name"]}}
    answer = operator.execute_complete({}, event)
    assert (answer["status"], answer["reason"], answer["by"]) == ("confirmed", kept, "7")
    assert actions.decision(request["out"], MONTH, "alpha").details["reason"] == kept
