"""Messages about findings: one per new or escalated finding, through Airflow's SmtpNotifier (to the
owner's contact from `signals.contacts`, the CMDB's) and a Slack-compatible incoming webhook. A
ledger under `<root>/_seedance/signals/` remembers what was sent, so a re-run sends nothing twice.
Fix triggers (Asset events) use the same ledger."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from seedance_tasks import storage
from seedance_tasks.cost.notify import Ledger
from seedance_tasks.errors import UnavailableError
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
    lines = [finding["summary"], f"at stake: {finding['at_stake']} {finding['currency']} a month",
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
            from airflow.providers.smtp.notifications.smtp import SmtpNotifier

            SmtpNotifier(to=contact, from_email=settings.mail_from, subject=subject,
                         html_content=f"<pre>{_escape(text)}</pre>", smtp_conn_id=settings.smtp_conn_id).notify({})
            book.record(_key("mail", finding), {"to": contact, "subject": subject})
            sent.append({"channel": "mail", "to": contact, "id": finding["id"]})
        if settings.webhook_url and _key("webhook", finding) not in book:
            post_webhook(settings.webhook_url, f"*{subject}*\n{text}")
            book.record(_key("webhook", finding), {"subject": subject})
            sent.append({"channel": "webhook", "id": finding["id"]})
    return sent


def _escape(text: str) -> str:
    import html

    return html.escape(text)


def post_webhook(url: str, text: str) -> None:
    """POST `{"text": ...}` as JSON (Slack's incoming-webhook format)."""
    request = urllib.request.Request(url, data=json.dumps({"text": text}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
    except OSError as exc:
        raise UnavailableError(f"webhook {url.split('?')[0]} failed: {exc}", hint="check signals.webhook_url") from None


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
