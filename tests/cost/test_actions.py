"""The cost actions workflow's parts, for real against moto_server on 127.0.0.1: the working-day
calendar, isolation (snapshots, tags, stops; young resources flagged only), confirmations and
deductions in the budget ledger, a tampered ledger refused, a dry-run DAG run that changes nothing."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedance_tasks.config import load_section
from seedance_tasks.cost import actions
from seedance_tasks.cost.budget_ledger import BudgetLedger, LedgerTamperedError, entry
from seedance_tasks.cost.workdays import Clock, WorkCalendar, month_close
from seedance_tasks.errors import InputError
from tests.conftest import xcom_value
from tests.cost.actions_support import (
    MONTH,
    db_snapshots,
    instance_state,
    make_database,
    make_instance,
    publish_month,
    snapshots_of,
)

# --------------------------------------------------------------------------- calendar

CALENDARS = st.builds(
    WorkCalendar,
    weekend=st.frozensets(st.integers(0, 6), max_size=6),
    holidays=st.frozensets(st.dates(date(2024, 1, 1), date(2025, 12, 31)), max_size=40),
)


@settings(max_examples=200, deadline=None)
@given(calendar=CALENDARS, start=st.dates(date(2024, 1, 1), date(2025, 12, 31)), n=st.integers(1, 25))
def test_the_nth_working_day_is_a_working_day_with_n_minus_1_before_it(calendar, start, n):
    day = calendar.nth_working_day(start, n)
    assert day >= start
    assert calendar.is_working_day(day)
    assert day.weekday() not in calendar.weekend and day not in calendar.holidays
    assert calendar.working_days(start, day) == n - 1


def test_weekends_and_holidays_push_the_deduction_day():
    plain = WorkCalendar()
    assert plain.nth_working_day(date(2024, 9, 1), 5) == date(2024, 9, 6)  # Sun 1st: Mon 2 .. Fri 6
    labour_day = WorkCalendar(holidays=frozenset({date(2024, 9, 2)}))
    assert labour_day.nth_working_day(date(2024, 9, 1), 5) == date(2024, 9, 9)  # the weekend is skipped too
    friday_weekend = WorkCalendar(weekend=frozenset({4, 5}))  # Fri + Sat
    assert friday_weekend.nth_working_day(date(2024, 9, 1), 5) == date(2024, 9, 5)  # Sun 1 .. Thu 5
    assert month_close("2024-12") == date(2025, 1, 1)


def test_a_short_day_length_compresses_the_clock():
    start = datetime(2026, 1, 1, tzinfo=UTC)
    clock = Clock(date(2024, 9, 1), start, day_length_s=10)
    assert clock.after_hours(72) == start + timedelta(seconds=30)
    assert clock.at_day(date(2024, 9, 6)) == start + timedelta(seconds=50)


# --------------------------------------------------------------------------- isolation


@pytest.fixture
def old_enough(monkeypatch):
    """Resources moto made a moment ago count as old: the tuning window is 0."""
    monkeypatch.setenv("SEEDANCE__COST__ACTIONS__TUNING_WINDOW", "0")


def test_isolation_snapshots_tags_and_stops_once(s3_server, tmp_path, old_enough):
    arn, instance = make_instance()
    database = make_database("idle-db-1")
    out, _ = publish_month(tmp_path, {"alpha": [arn], "beta": [database]})
    plan = actions.plan(month=MONTH, out=str(out), apply=True)
    assert {item["resource_id"] for item in plan["idle"]} == {arn, database}

    result = actions.isolate(plan)
    assert {row["resource_id"] for row in result["isolated"]} == {arn, database}
    state = instance_state(instance)
    assert state["state"] == "stopped" and state["tags"]["cost-review"] == "pending"
    (volume,) = state["volumes"]
    (snapshot,) = snapshots_of(volume)
    assert snapshot["tags"]["cost-review"] == "pending" and snapshot["tags"]["seedance:month"] == MONTH
    (db_snapshot,) = db_snapshots("idle-db-1")
    assert db_snapshot["DBSnapshotIdentifier"] == f"seedance-cost-{MONTH}-idle-db-1"

    again = actions.isolate(plan)  # a retried task: the ledger knows both
    assert again["isolated"] == [] and len(again["done_before"]) == 2
    (out / "_seedance" / "cost" / "budget-ledger.json").unlink()  # as if the entries had never been written
    third = actions.isolate(plan)  # ... then AWS's own tags stop a second snapshot
    assert len(snapshots_of(volume)) == 1 and len(db_snapshots("idle-db-1")) == 1
    assert any("taken before" in step for row in third["isolated"] for step in row["steps"])


def test_two_applying_attempts_at_once_snapshot_each_resource_once(s3_server, tmp_path, old_enough):
    """A retry that starts while the lost attempt still runs (Airflow marks a task failed on a lost
    heartbeat; its process may go on) waits for the month's isolation lease, then finds the first
    attempt's ledger entries: one snapshot per volume, not two."""
    import threading

    from seedance_tasks.cost.isolation import Isolator

    arns, instances = zip(*(make_instance() for _ in range(2)), strict=True)
    out, _ = publish_month(tmp_path, {"alpha": list(arns)})
    plan = actions.plan(month=MONTH, out=str(out), apply=True)
    inside, go_on = threading.Event(), threading.Event()

    class SlowIsolator(Isolator):  # the first attempt is caught between its look-up and its snapshot
        def isolate(self, resource, month, owner, *, apply):
            inside.set()
            go_on.wait(2)
            return super().isolate(resource, month, owner, apply=apply)

    results: list[dict] = []
    first = threading.Thread(target=lambda: results.append(actions.isolate(plan, isolator=SlowIsolator(
        load_section("cost")))))
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=lambda: results.append(actions.isolate(plan)))
    second.start()
    second.join(1.0)
    assert second.is_alive()  # waiting for the lease, not acting
    go_on.set()
    first.join(60)
    second.join(60)
    assert len(results) == 2
    assert sorted(len(result["isolated"]) for result in results) == [0, 2]
    assert sorted(len(result["done_before"]) for result in results) == [0, 2]
    for instance in instances:
        (volume,) = instance_state(instance)["volumes"]
        assert len(snapshots_of(volume)) == 1


def test_a_resource_younger_than_the_tuning_window_is_flagged_not_acted_on(s3_server, tmp_path):
    assert load_section("cost").actions.tuning_window == 30 * 86400  # the shipped default
    arn, instance = make_instance()  # launched just now
    out, _ = publish_month(tmp_path, {"alpha": [arn]})
    result = actions.isolate(actions.plan(month=MONTH, out=str(out), apply=True))
    assert [row["resource_id"] for row in result["flagged"]] == [arn] and result["isolated"] == []
    state = instance_state(instance)
    assert state["state"] == "running" and "cost-review" not in state["tags"]
    assert snapshots_of(state["volumes"][0]) == []
    flags = [e for e in BudgetLedger(str(out)).load().values() if e.kind == "flag"]
    assert [e.details["resource_id"] for e in flags] == [arn]


# --------------------------------------------------------------------------- confirm, settle


def _answer(plan, owner, chosen, reason):
    request = next(r["request"] for r in plan["confirmations"] if r["request"]["owner"] == owner)
    return actions.record_decision(request, chosen, reason, {"id": "admin", "name": "admin"})


def test_a_dispute_deducts_nothing_and_a_confirmation_deducts_once(s3_server, tmp_path):
    out, _ = publish_month(tmp_path, {"alpha": ["r-a1", "r-a2"], "beta": ["r-b1"]})
    plan = actions.plan(month=MONTH, out=str(out), apply=True)
    assert {r["request"]["owner"] for r in plan["confirmations"]} == {"alpha", "beta"}
    assert actions.pending(plan) == ["alpha", "beta"]
    _answer(plan, "alpha", actions.CONFIRM, "matches our usage")
    _answer(plan, "beta", actions.DISPUTE, "r-b1 belongs to gamma")
    assert _answer(plan, "beta", actions.CONFIRM, "changed my mind").details["status"] == "disputed"  # first kept
    assert actions.pending(plan) == []

    result = actions.settle(plan)
    assert result["deducted"] == [f"deduct:{MONTH}:alpha:USD"]
    assert result["not_deducted"] == [{"owner": "beta", "currency": "USD", "amount": "5", "status": "disputed"}]
    assert result["frozen"] == ["freeze:alpha:2024-09"]  # 25 USD against a budget of 10: over by 150 %
    entries = BudgetLedger(str(out)).load()
    deduction = entries[f"deduct:{MONTH}:alpha:USD"]
    assert deduction.amount == Decimal("25") and deduction.currency == "USD"
    assert not any(e.kind == "deduction" and e.owner == "beta" for e in entries.values())

    again = actions.settle(plan)  # a retried settle or a re-run month
    assert again["deducted"] == [] and again["frozen"] == [] and len(again["done_before"]) == 2
    outbox = (out / "_seedance" / "cost" / "outbox.jsonl").read_text().splitlines()
    keys = [json.loads(row)["key"] for row in outbox]
    assert keys.count(f"deduct:{MONTH}:alpha:USD") == 1 and keys.count("freeze:alpha:2024-09") == 1
    positions = actions.owner_positions(str(out))
    assert {(p["owner"], p["deducted"], p["answer"]) for p in positions} == {
        ("alpha", Decimal("25"), "confirmed"), ("beta", None, "disputed")}


def test_no_answer_by_the_deadline_deducts_nothing(s3_server, tmp_path):
    out, _ = publish_month(tmp_path, {"alpha": ["r-a1"], "beta": ["r-b1"]})
    plan = actions.plan(month=MONTH, out=str(out), apply=True)
    request = next(r["request"] for r in plan["confirmations"] if r["request"]["owner"] == "alpha")
    assert actions.record_decision(request, None, None, None).details["status"] == "unanswered"  # HITL timed out
    result = actions.settle(plan)
    assert result["deducted"] == []
    assert {(row["owner"], row["status"]) for row in result["not_deducted"]} == {("alpha", "unanswered"),
                                                                              ("beta", "no answer recorded")}


def test_reminders_go_once_to_owners_who_have_not_answered(s3_server, tmp_path):
    out, _ = publish_month(tmp_path, {"alpha": ["r-a1"], "beta": ["r-b1"]})
    plan = actions.plan(month=MONTH, out=str(out), apply=True, now=datetime(2024, 9, 1, tzinfo=UTC))
    assert actions.next_reminder(plan, datetime(2024, 9, 1, 1, tzinfo=UTC))[0] == 0
    _answer(plan, "alpha", actions.CONFIRM, "ok")
    assert actions.remind(plan, 0) == ["beta"]
    assert actions.remind(plan, 0) == []  # retried: no second reminder
    assert actions.next_reminder(plan, datetime(2024, 9, 1, 1, tzinfo=UTC))[0] == 1
    assert actions.next_reminder(plan, datetime(2024, 9, 4, 1, tzinfo=UTC)) is None  # past the 72 h deadline


def test_a_dry_run_plan_asks_nobody_and_settle_only_plans(s3_server, tmp_path):
    out, _ = publish_month(tmp_path, {"alpha": ["r-a1"]})
    plan = actions.plan(month=MONTH, out=str(out), apply=False)
    assert plan["mode"] == "dry-run" and plan["confirmations"] == []
    result = actions.settle(plan)
    assert result["deducted"] == [] and any("deduct 12.50 USD from alpha" in p for p in result["planned"])
    assert not (out / "_seedance" / "cost" / "budget-ledger.json").exists()


def test_an_unpublished_month_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="no published statements for 2024-08"):
        actions.plan(month=MONTH, out=str(tmp_path), apply=False)


# --------------------------------------------------------------------------- ledger


def test_the_ledger_refuses_a_tampered_file(tmp_path):
    ledger = BudgetLedger(str(tmp_path))
    assert ledger.record(entry(f"deduct:{MONTH}:alpha:USD", "deduction", MONTH, owner="alpha",
                               amount=Decimal("25.00"), currency="USD"))
    path = tmp_path / "_seedance" / "cost" / "budget-ledger.json"
    document = json.loads(path.read_text())
    document["entries"][0]["amount"] = "2.50"  # someone lowers a deduction by hand
    path.write_text(json.dumps(document))
    with pytest.raises(LedgerTamperedError, match="modified outside Seedance") as caught:
        ledger.load()
    assert "budget-ledger.json" in str(caught.value) and caught.value.hint
    path.write_text('{"format": "seedance.budget-ledger/1", "entries": [{"key": "x"}], "sha256": "0"}')
    with pytest.raises(InputError, match="malformed"):
        ledger.load()
    path.write_text("{not json")
    with pytest.raises(LedgerTamperedError, match="not JSON"):
        ledger.load()


def test_the_ledger_keeps_money_exact_and_keys_unique(tmp_path):
    ledger = BudgetLedger(str(tmp_path))
    first = entry("deduct:2024-08:a:EUR", "deduction", "2024-08", owner="a", amount=Decimal("0.10"), currency="EUR")
    assert ledger.record(first) and not ledger.record(first)
    assert ledger.load()["deduct:2024-08:a:EUR"].amount == Decimal("0.10")
    with pytest.raises(ValueError):
        entry("x", "deduction", "2024-13", amount=Decimal(1), currency="EUR")


# --------------------------------------------------------------------------- the DAG, dry run


def test_a_dry_run_dag_run_reports_the_plan_and_changes_nothing_in_aws(s3_server, tmp_path, run_dag, old_enough):
    arn, instance = make_instance()
    out, _ = publish_month(tmp_path, {"alpha": [arn]})
    before = instance_state(instance)
    dag_run = run_dag("seedance_cost_actions", {"month": MONTH, "out": str(out)})
    assert dag_run.state == "success", [(ti.task_id, ti.state) for ti in dag_run.get_task_instances()]
    isolated = xcom_value(dag_run, "isolate")
    assert isolated["mode"] == "dry-run" and isolated["isolated"] == []
    assert any(arn in step and "would snapshot" in step for step in isolated["planned"])
    assert any("would stop" in step for step in isolated["planned"])
    settled = xcom_value(dag_run, "settle")
    assert any("deduct 12.50 USD from alpha" in step for step in settled["planned"])
    assert instance_state(instance) == before  # still running, untagged
    assert snapshots_of(before["volumes"][0]) == []
    assert not (out / "_seedance" / "cost" / "budget-ledger.json").exists()


# --------------------------------------------------------------------------- dashboard


def test_the_cost_page_shows_deductions_and_freezes_to_the_cent(tmp_path):
    from seedance_tasks.dashboard import pages
    from seedance_tasks.dashboard.cost import cost_view

    out, _ = publish_month(tmp_path, {"alpha": ["r-a1"], "beta": ["r-b1"]})
    plan = actions.plan(month=MONTH, out=str(out), apply=True)
    _answer(plan, "alpha", actions.CONFIRM, "ok")
    _answer(plan, "beta", actions.DISPUTE, "not ours")
    actions.settle(plan)
    html = pages.cost_section(0, "test", cost_view(str(out), datetime(2024, 9, 10, tzinfo=UTC)))
    assert "Budget pools: deductions and freezes" in html
    assert "<span data-owner='alpha' data-deduction='2024-08'>12.50 USD</span>" in html
    assert "<td>beta</td><td>2024-08</td><td>disputed</td>" in html
    assert "<td>2024-09</td>" in html  # alpha's frozen budget month
    path = out / "_seedance" / "cost" / "budget-ledger.json"
    assert '"12.50"' in path.read_text()  # the deduction, at the currency's minor unit
    path.write_text(path.read_text().replace('"12.50"', '"1.25"'))
    html = pages.cost_section(0, "test", cost_view(str(out), datetime(2024, 9, 10, tzinfo=UTC)))
    assert "modified outside Seedance" in html and "data-deduction=" not in html  # refused, not half-read


def _event_context(extra: dict) -> dict:
    """A task context started by one `seedance_cost_statements` event carrying `extra`."""
    from types import SimpleNamespace

    from seedance_tasks.cost.assets import COST_STATEMENTS

    event = SimpleNamespace(timestamp=datetime(2024, 9, 1, 3, tzinfo=UTC), extra=extra)
    return {"triggering_asset_events": {COST_STATEMENTS: [event]},
            "dag_run": SimpleNamespace(run_type="asset_triggered", run_after=datetime(2024, 9, 1, 3, tzinfo=UTC))}


def test_statements_from_a_backfill_start_no_actions(tmp_path):
    from airflow.exceptions import AirflowSkipException

    from seedance_tasks.cost.actions_airflow import plan_task

    out, _ = publish_month(tmp_path, {"alpha": ["i-0abc"]})
    extra = {"month": MONTH, "out": str(out / f"month={MONTH}"), "backfill": True}
    with pytest.raises(AirflowSkipException, match="backfill never starts actions"):
        plan_task({}, _event_context(extra))
    assert not (out / "_seedance" / "cost" / "budget-ledger.json").exists()


def test_a_resource_aws_refuses_is_reported_and_the_others_are_isolated(s3_server, tmp_path, old_enough):
    """An instance-store-backed instance cannot be stopped: AWS says so for that one; the database
    is still snapshotted and stopped, the refused one is in `failed`, not in the ledger (tried again)."""
    import boto3
    from botocore.exceptions import ClientError

    from seedance_tasks.config import load_settings
    from seedance_tasks.cost.isolation import Isolator

    arn, instance = make_instance()
    database = make_database("idle-db-2")
    out, _ = publish_month(tmp_path, {"alpha": [arn], "beta": [database]})
    plan = actions.plan(month=MONTH, out=str(out), apply=True)

    class InstanceStoreEc2:
        """The real (moto) EC2 client, except that this instance cannot be stopped, as AWS answers
        for an instance-store-backed instance (moto does not model root device types)."""

        def __init__(self, client):
            self.client = client

        def __getattr__(self, name):
            return getattr(self.client, name)

        def stop_instances(self, InstanceIds):  # noqa: N803 - boto3's keyword
            raise ClientError({"Error": {"Code": "UnsupportedOperation", "Message": f"The instance '{instance}' "
                               "does not have an 'ebs' root device type and cannot be stopped."}}, "StopInstances")

    settings = load_settings().cost
    ec2 = InstanceStoreEc2(boto3.client("ec2", region_name="us-east-1"))
    result = actions.isolate(plan, isolator=Isolator(settings, ec2=ec2))
    assert [row["resource_id"] for row in result["isolated"]] == [database]
    [failed] = result["failed"]
    assert failed["resource_id"] == arn and failed["error"].startswith("UnsupportedOperation: ") and failed["hint"]
    assert instance_state(instance)["state"] == "running"
    assert len(db_snapshots("idle-db-2")) == 1
    keys = BudgetLedger(str(out)).load()
    assert not any(e.details.get("resource_id") == arn for e in keys.values())  # the next run tries again

    class ThrottledEc2(InstanceStoreEc2):
        def describe_instances(self, **kwargs):
            raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}}, "DescribeInstances")

    with pytest.raises(ClientError):  # not a refusal of this resource: the task fails, Airflow retries
        actions.isolate(plan, isolator=Isolator(settings, ec2=ThrottledEc2(boto3.client("ec2", region_name="us-east-1"))))
