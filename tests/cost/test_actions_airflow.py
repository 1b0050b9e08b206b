"""The cost actions workflow end to end through real Airflow services (API server, scheduler and
triggerer as subprocesses, LocalExecutor, SQLite) against moto_server on 127.0.0.1.

A published month's `seedance_cost_statements` event is POSTed to the REST API (as the recovery
DAG's report task emits it) and starts `seedance_cost_actions`, applying (`cost.actions.apply`),
on a rehearsal calendar whose days last 60 s: idle resources are snapshotted and stopped in moto;
the owners are reminded (a deferral in the triggerer; alpha by e-mail to aiosmtpd and a webhook on
loopback, beta, without contacts, through the outbox); alpha answers through the HITL REST
endpoint as the UI does and confirms, beta never answers and its confirmation times out in the
triggerer at the deadline (recorded as unanswered: nothing deducted); on the 5th working day (a
deferrable sensor) the confirmed amount is deducted in the ledger and alpha's over-budget freeze
applied. The same month
run again, and two tasks of the first run retried, repeat no side effect.

Slow (six to eight minutes on two cores): real services and a compressed five-working-day wait.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import urllib.request
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest

from seedance_tasks.cost.budget_ledger import BudgetLedger
from tests.airflow_services import AirflowServices, admin_token, free_port, standalone_env
from tests.cost.actions_support import (
    MONTH,
    db_snapshots,
    instance_state,
    make_database,
    make_instance,
    publish_month,
    snapshots_of,
)
from tests.mail_services import smtp_connection, smtp_server, webhook_server

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "seedance_cost_actions"


def _api(port: int, path: str, token: str, body: dict | None = None, method: str | None = None):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method or ("POST" if body is not None else "GET"),
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _reminders(inbox, hooks) -> tuple[int, int]:
    """alpha's reminders received so far: (e-mails, webhook posts)."""
    return (sum(m.subject.startswith("Reminder:") for m in inbox.messages),
            sum(h["json"]["text"].startswith("*Reminder:") for h in hooks))


def _outbox(out: Path) -> list[dict]:
    path = out / "_seedance" / "cost" / "outbox.jsonl"
    return [json.loads(row) for row in path.read_text().splitlines()] if path.exists() else []


def _aws_side(instance: str, volume: str) -> tuple:
    return (instance_state(instance)["state"], len(snapshots_of(volume)), len(db_snapshots("beta-idle-db")),
            instance_state(instance)["tags"].get("cost-review"))


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the rehearsal calendar's five working days take five minutes by themselves
def test_the_month_runs_from_its_event_with_hitl_and_deferrable_waits_once(s3_server, tmp_path):
    mail = contextlib.ExitStack()
    inbox, smtp_port = mail.enter_context(smtp_server())  # alpha's e-mail (aiosmtpd on loopback) ...
    hooks, hook_url = mail.enter_context(webhook_server())  # ... and alpha's Slack-compatible webhook
    arn, instance = make_instance()
    database = make_database("beta-idle-db")
    out, owners = publish_month(tmp_path, {"alpha": [arn], "beta": [database]},
                                approvers={"alpha": ["admin"], "beta": ["admin"]},
                                contacts={"alpha": {"email": "alpha-leads@example.com", "webhook_env": "ALPHA_HOOK"}})
    volume = instance_state(instance)["volumes"][0]
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(REPO / "dags" / "seedance_cost_actions.py", dags)
    home = tmp_path / "airflow"
    home.mkdir()
    port = free_port()
    env = standalone_env(home, dags, port)
    env.update({
        "AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
        "SEEDANCE__COST__OWNERS_FILE": str(owners),
        "SEEDANCE__COST__ACTIONS__APPLY": "true",  # event-started runs apply
        "SEEDANCE__COST__ACTIONS__DAY_LENGTH": "60s",  # the rehearsal calendar: a day lasts 60 s (room for a loaded CI)
        "SEEDANCE__COST__ACTIONS__ANCHOR": "run_start",
        "SEEDANCE__COST__ACTIONS__TUNING_WINDOW": "0",  # moto's resources are minutes old
        "AIRFLOW_CONN_ACTIONS_SMTP": smtp_connection(smtp_port), "SEEDANCE__NOTIFICATIONS__SMTP_CONN_ID": "actions_smtp",
        "ALPHA_HOOK": hook_url,  # beta has no contacts: its notices go to the outbox
    })
    services = AirflowServices(home, env)
    services.airflow("db", "migrate")
    services.airflow("dags", "reserialize")
    try:
        services.start("api-server", "api-server")
        services.wait_healthy(port)
        services.start("scheduler", "scheduler")
        services.start("triggerer", "triggerer")
        token = admin_token(home, port)
        services.wait_until(lambda: _api(port, "/api/v2/monitor/health", token).get("triggerer", {})
                            .get("status") == "healthy", 120, "the triggerer to heartbeat")
        (asset,) = services.wait_until(
            lambda: _api(port, "/api/v2/assets?name_pattern=seedance_cost_statements", token)["assets"], 120,
            "the statements asset to be registered")
        _api(port, "/api/v2/assets/events", token, {"asset_id": asset["id"], "extra": {
            "month": MONTH, "out": str(out / f"month={MONTH}"), "backfill": False}})

        def runs():
            return _api(port, f"/api/v2/dags/{DAG_ID}/dagRuns?order_by=run_after", token)["dag_runs"]

        (first,) = services.wait_until(runs, 120, "the event to start a run")
        assert first["run_type"] == "asset_triggered"
        run_id = first["dag_run_id"]

        # within 48 h: snapshotted and stopped in moto, tagged for review
        services.wait_until(lambda: _aws_side(instance, volume) == ("stopped", 1, 1, "pending"), 120,
                            "the idle resources to be snapshotted and stopped")
        # while waiting: a reminder (its deferral runs in the triggerer), before anyone answers
        services.wait_until(lambda: _reminders(inbox, hooks) == (1, 1), 180, "alpha's first reminder, mailed and posted")
        # beta's comes right after alpha's, from the same task: it may land a moment later
        services.wait_until(lambda: any(m["key"] == f"remind:{MONTH}:beta:0" for m in _outbox(out)), 60,
                            "beta's first reminder, in the outbox")

        def waiting():
            found = _api(port, f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/hitlDetails", token)["hitl_details"]
            return found if len(found) == 2 and all(d["task_instance"]["state"] == "awaiting_input"
                                                    for d in found) else None

        details = services.wait_until(waiting, 120, "both owners' confirmations to wait for an answer")
        answers = {"alpha": ("Confirm", "matches our training runs")}  # beta never answers: its deadline passes
        for detail in details:
            owner = "alpha" if "of alpha" in detail["subject"] else "beta"
            assert detail["assigned_users"] == [{"id": "admin", "name": "admin"}]
            if owner not in answers:
                continue
            chosen, reason = answers[owner]
            response = _api(port, f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/confirm/"
                            f"{detail['task_instance']['map_index']}/hitlDetails", token,
                            {"chosen_options": [chosen], "params_input": {"reason": reason}}, method="PATCH")
            assert response["responded_by"]["name"] == "admin"

        def finished(run: str):
            state = _api(port, f"/api/v2/dags/{DAG_ID}/dagRuns/{run}", token)["state"]
            return state if state in ("success", "failed") else None

        assert services.wait_until(lambda: finished(run_id), 600, "the run to settle") == "success"
        plan = _api(port, f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/plan/xcomEntries/return_value",
                    token)["value"]
        settle = _api(port, f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/settle", token)
        # the deferrable sensor let settle start only on the deduction day (5th working day: Fri 2024-09-06)
        assert plan["deadlines"]["deduct_day"] == "2024-09-06"
        assert datetime.fromisoformat(settle["start_date"]) >= datetime.fromisoformat(plan["deadlines"]["deduct_at"])

        entries = BudgetLedger(str(out)).load()
        deductions = {key: (e.amount, e.currency) for key, e in entries.items() if e.kind == "deduction"}
        assert deductions == {f"deduct:{MONTH}:alpha:USD": (Decimal("12.5"), "USD")}  # beta unanswered: nothing
        # beta's confirmation timed out in the triggerer (HITL's timeout event): recorded as unanswered
        assert entries[f"confirm:{MONTH}:beta"].details["status"] == "unanswered"
        assert entries[f"confirm:{MONTH}:beta"].details["reason"] == "" and entries[f"confirm:{MONTH}:beta"].details["by"] is None
        beta_task = next(d["task_instance"] for d in _api(port, f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/hitlDetails",
                                                          token)["hitl_details"] if "of beta" in d["subject"])
        assert beta_task["state"] == "success"
        assert entries[f"confirm:{MONTH}:alpha"].details["by"] == "admin"
        assert "freeze:alpha:2024-09" in entries  # 12.50 against a budget of 10: over by 25 % > 20 %
        aws_after, ledger_after, outbox_after = _aws_side(instance, volume), dict(entries), _outbox(out)
        assert [m["key"] for m in outbox_after].count(f"remind:{MONTH}:beta:0") == 1
        assert all(m.to == ["alpha-leads@example.com"] for m in inbox.messages)
        assert any(m.subject.startswith("Confirm the 2024-08 chargeback of alpha") for m in inbox.messages)
        assert hook_url not in json.dumps(_outbox(out))
        assert not any("s3cr3tT0ken" in log.read_text(errors="replace") for log in home.rglob("*.log"))
        mail_after, hooks_after = [m.subject for m in inbox.messages], [h["json"] for h in hooks]
        assert len(mail_after) == len(hooks_after)  # every notice of alpha's on both channels, once

        # the same month again, by hand: everything is found done
        second = _api(port, f"/api/v2/dags/{DAG_ID}/dagRuns", token, {
            "logical_date": None, "conf": {"month": MONTH, "out": str(out), "apply": True}})["dag_run_id"]
        assert services.wait_until(lambda: finished(second), 300, "the re-run") == "success"
        assert _api(port, f"/api/v2/dags/{DAG_ID}/dagRuns/{second}/hitlDetails", token)["hitl_details"] == []
        # two tasks of the first run retried (cleared, as from the UI)
        _api(port, f"/api/v2/dags/{DAG_ID}/clearTaskInstances", token, {
            "dag_run_id": run_id, "task_ids": ["isolate", "settle"], "dry_run": False, "only_failed": False})
        services.wait_until(lambda: _api(port, f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/settle",
                                         token)["try_number"] >= 2 and finished(run_id), 300, "the retried tasks")
    finally:
        services.stop()
        mail.close()
    assert _aws_side(instance, volume) == aws_after  # no second snapshot, stop or tag
    assert [m.subject for m in inbox.messages] == mail_after and [h["json"] for h in hooks] == hooks_after
    assert BudgetLedger(str(out)).load() == ledger_after  # no second deduction or freeze
    assert _outbox(out) == outbox_after  # no second reminder or notice
