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
from seedance_tasks.notifiers import NotificationSettings, one_line, send_email, send_webhook
from seedance_tasks.signals.audit import night_findings
from seedance_tasks.signals.model import SEVERITIES

STATE = "_seedance/signals"


def ledger(root: storage.Location, name: str = "sent.json") -> Ledger:
    """The ledger `name` under `<root>/_seedance/signals/`: `sent.json` (messages) is written by the
    notify task only, `fixes-<signal>.json` by that signal's fix task only, so tasks running side
    by side never overwrite each other's records. InputError names a damaged ledger (nothing is sent
    or triggered rather than everything again)."""
    state = root.child(STATE)
    state.fs.create_dir(state.path, recursive=True)
    return Ledger(state, name)  # a damaged one is an InputError naming it (Ledger._load)


def _key(kind: str, finding: dict[str, Any]) -> str:
    return f"{kind}:{finding['id']}:{finding['severity']}:{finding['first_seen']}"


def to_announce(night: dict[str, Any]) -> list[dict[str, Any]]:
    """The night's new and escalated findings."""
    return [f for f in night_findings(night) if f["change"] in ("new", "escalated")]


def message(finding: dict[str, Any]) -> tuple[str, str]:
    """(subject, text) of a finding; the subject is one line (a key made of a label value or a file
    name with a newline in it cannot add a mail header)."""
    verb = "escalated" if finding["change"] == "escalated" else "new"
    subject = one_line(f"[seedance {finding['severity']}] {finding['signal']} ({verb}): {finding['key']}")
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


def _triggered_with(entries: dict[str, Any], finding: dict[str, Any]) -> list[Any]:
    """The fixes (dag_id and conf) this finding (since its first_seen, at any severity) was triggered with."""
    keys = (_key("fix", {**finding, "severity": severity}) for severity in SEVERITIES)
    return [entries[key] for key in keys if key in entries]


def fix_targets(night: dict[str, Any], signal: str, root: storage.Location, *, record: bool = True) -> list[dict]:
    """The fixes of `signal`'s new or escalated findings not triggered before, and of its persisting
    ones whose fix changed since it was triggered (`signals.apply` turned on after a dry run):
    [{"key", "dag_id", "conf"}]. Each (finding, fix) is triggered once."""
    book = ledger(root, f"fixes-{signal}.json")
    legacy = ledger(root).entries  # fixes recorded beside the messages by earlier versions
    targets = []
    for finding in night_findings(night):
        if finding["signal"] != signal or not finding.get("fix"):
            continue
        entries = {**legacy, **book.entries}
        if finding["change"] in ("new", "escalated"):
            due = entries.get(_key("fix", finding)) != finding["fix"]
        else:  # persisting: again only if its fix changed; unconfirmed (its rule could not look): never
            before = _triggered_with(entries, finding)
            due = finding["change"] == "persisting" and bool(before) and finding["fix"] not in before
        if not due:
            continue
        targets.append({"key": finding["key"], **finding["fix"]})
        if record:
            book.record(_key("fix", finding), finding["fix"])
    return targets
