"""Messages about findings: one per new or escalated finding, through Airflow's SmtpNotifier (to the
owner's contact from `signals.contacts`, the CMDB's) and a Slack-compatible incoming webhook. A
ledger under `<root>/_seedance/signals/` remembers what was sent, so a re-run sends nothing twice.
Fix triggers (Asset events) use the same ledger. Delivery is `seedance_tasks.notifiers`' (shared with the
cost notifications and the task-failure alerts)."""

from __future__ import annotations

import json
from typing import Any

from seedance_tasks import storage
from seedance_tasks.cost.money import display
from seedance_tasks.cost.notify import Ledger
from seedance_tasks.notifiers import NotificationSettings, send_email, send_webhook
from seedance_tasks.signals.audit import night_findings

STATE = "_seedance/signals"


def ledger(root: storage.Location) -> Ledger:
    state = root.child(STATE)
    state.fs.create_dir(state.path, recursive=True)
    return Ledger(state, "sent.json")


def _key(kind: str, finding: dict[str, Any]) -> str:
    return f"{kind}:{finding['id']}:{finding['severity']}:{finding['first_seen']}"


def to_announce(night: dict[str, Any]) -> list[dict[str, Any]]:
    """The night's new and escalated findings."""
    return [f for f in night_findings(night) if f["change"] in ("new", "escalated")]


def message(finding: dict[str, Any]) -> tuple[str, str]:
    """(subject, text) of a finding."""
    verb = "escalated" if finding["change"] == "escalated" else "new"
    subject = f"[seedance {finding['severity']}] {finding['signal']} ({verb}): {finding['key']}"
    fix = finding.get("fix")
    lines = [finding["summary"], f"at stake: {display(finding['at_stake'], finding['currency'])} a month",
             "evidence: " + json.dumps(finding["evidence"], sort_keys=True),
             f"fix: DAG {fix['dag_id']} conf {json.dumps(fix['conf'], sort_keys=True)}" if fix else "fix: none automatic",
             f"first seen {finding['first_seen']}, last seen {finding['last_seen']}"]
    return subject, "\n".join(lines)


def send_all(night: dict[str, Any], root: storage.Location, settings) -> list[dict[str, Any]]:
    """Send every new or escalated finding not sent before; one record per message sent."""
    sent = []
    book = ledger(root)
    for finding in to_announce(night):
        subject, text = message(finding)
        contact = settings.contacts.get(finding.get("owner") or "") or settings.default_contact
        if settings.smtp_conn_id and contact and _key("mail", finding) not in book:
            send_email([contact], subject, text,
                       NotificationSettings(smtp_conn_id=settings.smtp_conn_id, mail_from=settings.mail_from))
            book.record(_key("mail", finding), {"to": contact, "subject": subject})
            sent.append({"channel": "mail", "to": contact, "id": finding["id"]})
        if settings.webhook.has_webhook and _key("webhook", finding) not in book:
            send_webhook(settings.webhook, subject, text)
            book.record(_key("webhook", finding), {"subject": subject})
            sent.append({"channel": "webhook", "id": finding["id"]})
    return sent


def fix_targets(night: dict[str, Any], signal: str, root: storage.Location, *, record: bool = True) -> list[dict]:
    """The fixes of `signal`'s new or escalated findings not triggered before: [{"key", "dag_id", "conf"}]."""
    book = ledger(root)
    targets = []
    for finding in to_announce(night):
        if finding["signal"] != signal or not finding.get("fix") or _key("fix", finding) in book:
            continue
        targets.append({"key": finding["key"], **finding["fix"]})
        if record:
            book.record(_key("fix", finding), finding["fix"])
    return targets
