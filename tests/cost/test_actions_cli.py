"""`seedance cost actions` (the workflow's dry run outside Airflow) and `seedance cost ledger`:
what they print, that a dry run changes nothing in AWS or the outputs, errors that say what to do."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from pathlib import Path

from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.cost import actions
from tests.cost.actions_support import MONTH, instance_state, make_instance, publish_month, snapshots_of

runner = CliRunner()


def _digest(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


def test_the_dry_run_lists_deadlines_isolations_and_deductions_and_changes_nothing(s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDANCE__COST__ACTIONS__TUNING_WINDOW", "0")
    arn, instance = make_instance()
    out, owners = publish_month(tmp_path, {"alpha": [arn, "r-a2"], "beta": ["r-b1"]})
    before = _digest(out)
    result = runner.invoke(app, ["cost", "actions", "--month", MONTH, "--out", str(out), "--owners", str(owners),
                                 "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["plan"]["mode"] == "dry-run" and report["plan"]["confirmations"] == []
    assert any(step.startswith(f"{arn}: ") and "snapshot" in step for step in report["isolate"]["planned"])
    assert {item["resource_id"] for item in report["isolate"]["skipped"]} == {"r-a2", "r-b1"}
    assert report["settle"]["planned"][:2] == [
        "deduct 25.00 USD from alpha's budget pool if the owner confirms",
        "deduct 5.00 USD from beta's budget pool if the owner confirms"]
    assert f"freeze alpha's {actions.next_month(MONTH)} budget (25.00 USD spent against 10.00 USD)" in report["settle"]["planned"]
    state = instance_state(instance)
    assert state["state"] == "running" and state["tags"] == {} and all(snapshots_of(v) == [] for v in state["volumes"])
    assert _digest(out) == before  # nothing changed: no snapshot, stop or tag; no ledger, no outbox

    human = runner.invoke(app, ["cost", "actions", "--month", MONTH, "--out", str(out), "--owners", str(owners)])
    assert human.exit_code == 0, human.output
    assert "25.00 USD" in human.stdout and "5.00 USD" in human.stdout and "dry run: nothing changed" in human.stdout
    assert report["plan"]["deadlines"]["deduct_day"] in human.stdout.replace("\n", "") or \
        report["plan"]["deadlines"]["deduct_at"][:10] in human.stdout


def test_a_month_not_recovered_is_an_error_with_a_hint(tmp_path):
    result = runner.invoke(app, ["cost", "actions", "--month", "2024-10", "--out", str(tmp_path)])
    assert result.exit_code != 0
    assert "error: no published statements for 2024-10" in result.stderr and "hint:" in result.stderr
    assert "Traceback" not in result.output


def test_the_ledger_shows_each_pool_after_the_workflow_settled(s3_server, tmp_path):
    out, _ = publish_month(tmp_path, {"alpha": ["r-a1"], "beta": ["r-b1"]})
    empty = runner.invoke(app, ["cost", "ledger", "--out", str(out)])
    assert empty.exit_code == 0 and "(no entries)" in empty.stdout
    plan = actions.plan(month=MONTH, out=str(out), apply=True)
    for owner, chosen in (("alpha", actions.CONFIRM), ("beta", actions.DISPUTE)):
        request = next(r["request"] for r in plan["confirmations"] if r["request"]["owner"] == owner)
        actions.record_decision(request, chosen, "reason", {"id": "admin", "name": "admin"})
    actions.settle(plan)
    shown = runner.invoke(app, ["cost", "ledger", "--out", str(out), "--json"])
    assert shown.exit_code == 0, shown.output
    rows = {row["owner"]: row for row in json.loads(shown.stdout)}
    assert Decimal(rows["alpha"]["deducted"]) == Decimal("12.50") and rows["alpha"]["answer"] == "confirmed"
    assert rows["alpha"]["frozen"] == actions.next_month(MONTH)
    assert rows["beta"]["deducted"] is None and rows["beta"]["answer"] == "disputed"
    human = runner.invoke(app, ["cost", "ledger", "--out", str(out)])
    assert "12.50 USD" in human.stdout and "disputed" in human.stdout


def test_a_tampered_ledger_is_an_error_naming_the_file(s3_server, tmp_path):
    out, _ = publish_month(tmp_path, {"alpha": ["r-a1"]})
    plan = actions.plan(month=MONTH, out=str(out), apply=True)
    request = plan["confirmations"][0]["request"]
    actions.record_decision(request, actions.CONFIRM, "ok", {"id": "admin", "name": "admin"})
    actions.settle(plan)
    ledger = Path(actions.ledger_of(str(out)).uri.removeprefix("file://"))
    ledger.write_text(ledger.read_text().replace("12.5", "1.25"))
    result = runner.invoke(app, ["cost", "ledger", "--out", str(out)])
    assert result.exit_code != 0 and "error:" in result.stderr and "hint:" in result.stderr
    assert ledger.name in result.stderr and "Traceback" not in result.output


def test_a_hand_edited_summary_is_an_error_naming_the_file_and_key(s3_server, tmp_path):
    out, _ = publish_month(tmp_path, {"alpha": ["r-a1"]})
    summary = out / f"month={MONTH}" / "summary.json"
    data = json.loads(summary.read_text())
    for broken, key in ((5, "currencies"), ({"USD": {"by_owner": {"alpha": "lots"}}}, "currencies.USD.by_owner.alpha")):
        summary.write_text(json.dumps({**data, "currencies": broken}))
        result = runner.invoke(app, ["cost", "actions", "--month", MONTH, "--out", str(out)])
        assert result.exit_code == 1, result.output
        assert f"error: {summary}: not a cost summary ({key}:" in result.stderr and "hint:" in result.stderr
    summary.write_text(json.dumps({**data, "idle": [{"owner": "alpha"}]}))  # an idle finding without its id
    result = runner.invoke(app, ["cost", "actions", "--month", MONTH, "--out", str(out)])
    assert "idle.0.resource_id:" in result.stderr and "Traceback" not in result.output
