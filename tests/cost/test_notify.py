"""Notifier.send to an owner's channels from the CMDB: real e-mail (aiosmtpd on 127.0.0.1, through
Airflow's SmtpNotifier and an SMTP connection, or plain SMTP for CLI runs), a real webhook on
loopback, the outbox when nothing is configured, and each (key, channel) at most once across
retries."""

from __future__ import annotations

import json
import logging

import pytest

from seedance_tasks import storage
from seedance_tasks.cost.notify import DeliveryError, Notifier
from seedance_tasks.cost.owners import OwnersFile, load_owners
from seedance_tasks.errors import ConfigError
from seedance_tasks.notifiers import NotificationSettings
from tests.airflow_services import free_port
from tests.mail_services import smtp_connection, smtp_server, webhook_server

SECRET = "s3cr3tT0ken"


def _owners(**contacts) -> OwnersFile:
    return OwnersFile.model_validate({"owner_tags": ["owner"], "contacts": contacts})


def _outbox(state) -> list[dict]:
    path = state / "outbox.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def endpoints(monkeypatch):
    """(inbox, webhook bodies, settings): aiosmtpd behind Airflow connection `cost_smtp`, and a
    webhook whose URL is only in $TEAM_WEBHOOK."""
    with smtp_server() as (inbox, port), webhook_server() as (received, url):
        monkeypatch.setenv("AIRFLOW_CONN_COST_SMTP", smtp_connection(port))
        monkeypatch.setenv("TEAM_WEBHOOK", url)
        yield inbox, received, NotificationSettings(smtp_conn_id="cost_smtp", mail_from="seedance@example.com")


def test_send_delivers_mail_and_webhook_to_the_owner_once(tmp_path, endpoints):
    inbox, received, settings = endpoints
    owners = _owners(ml={"email": ["ml-leads@example.com", "oncall@example.com"], "webhook_env": "TEAM_WEBHOOK"})
    notifier = Notifier(storage.resolve(str(tmp_path)), owners=owners, settings=settings)
    assert notifier.channels("ml") == ["email", "webhook"]
    assert notifier.send("budget:ml:2024-09", "ml", "Over budget in 2024-09", "spent 12.00 USD", {}) is True
    assert [(m.to, m.subject) for m in inbox.messages] == [
        (["ml-leads@example.com", "oncall@example.com"], "Over budget in 2024-09")]
    assert "spent 12.00 USD" in inbox.messages[0].body
    assert [r["json"] for r in received] == [{"text": "*Over budget in 2024-09*\nspent 12.00 USD"}]
    # a retry of the same key (a new Notifier, as a new task attempt would build) sends nothing
    again = Notifier(storage.resolve(str(tmp_path)), owners=owners, settings=settings)
    assert again.send("budget:ml:2024-09", "ml", "Over budget in 2024-09", "spent 12.00 USD", {}) is False
    assert len(inbox.messages) == 1 and len(received) == 1
    ledger = json.loads((tmp_path / "notified.json").read_text())
    assert sorted(ledger["budget:ml:2024-09"]["channels"]) == ["email", "webhook"]
    assert not (tmp_path / "outbox.jsonl").exists()


def test_webhook_from_an_airflow_connection(tmp_path, monkeypatch):
    with webhook_server() as (received, url):
        monkeypatch.setenv("AIRFLOW_CONN_SLACK_ML", json.dumps({"conn_type": "http", "password": url}))
        notifier = Notifier(storage.resolve(str(tmp_path)), owners=_owners(ml={"webhook_conn": "slack_ml"}),
                            settings=NotificationSettings())
        assert notifier.send("k", "ml", "Idle resource", "stop it", {}) is True
    assert received == [{"path": f"/services/T000/B000/{SECRET}", "json": {"text": "*Idle resource*\nstop it"}}]


def test_crash_after_the_mail_resends_only_the_webhook(tmp_path, endpoints, monkeypatch, caplog):
    inbox, received, settings = endpoints
    owners = _owners(ml={"email": "ml@example.com", "webhook_env": "TEAM_WEBHOOK"})
    state = storage.resolve(str(tmp_path))
    monkeypatch.setenv("TEAM_WEBHOOK", f"http://127.0.0.1:{free_port()}/services/T000/B000/{SECRET}")  # nobody there
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DeliveryError) as failed:
        Notifier(state, owners=owners, settings=settings).send("idle:i-1", "ml", "Idle i-1", "stop it", {})
    assert list(failed.value.failed) == ["webhook"] and failed.value.delivered == ["email"]
    assert "webhook $TEAM_WEBHOOK unreachable" in str(failed.value) and failed.value.retryable
    assert SECRET not in str(failed.value) and SECRET not in caplog.text  # the URL is a secret
    assert len(inbox.messages) == 1 and received == []
    with webhook_server() as (again, url):  # the retry: the webhook is back
        monkeypatch.setenv("TEAM_WEBHOOK", url)
        assert Notifier(state, owners=owners, settings=settings).send("idle:i-1", "ml", "Idle i-1", "stop it", {})
        assert Notifier(state, owners=owners, settings=settings).send("idle:i-1", "ml", "Idle i-1", "x", {}) is False
    assert len(inbox.messages) == 1  # the e-mail was not sent twice
    assert [r["json"]["text"] for r in again] == ["*Idle i-1*\nstop it"]


def test_a_failing_mail_does_not_lose_the_webhook(tmp_path, endpoints, monkeypatch):
    inbox, received, _ = endpoints
    monkeypatch.setenv("AIRFLOW_CONN_DEAD_SMTP", smtp_connection(free_port()))
    settings = NotificationSettings(smtp_conn_id="dead_smtp")
    owners = _owners(ml={"email": "ml@example.com", "webhook_env": "TEAM_WEBHOOK"})
    with pytest.raises(DeliveryError) as failed:
        Notifier(storage.resolve(str(tmp_path)), owners=owners, settings=settings).send("k", "ml", "S", "M", {})
    assert list(failed.value.failed) == ["email"] and "dead_smtp" in failed.value.failed["email"]
    assert failed.value.delivered == ["webhook"] and len(received) == 1 and inbox.messages == []


def test_plain_smtp_from_settings_for_cli_runs(tmp_path):
    with smtp_server() as (inbox, port):
        settings = NotificationSettings.model_validate({"smtp": {"host": "127.0.0.1", "port": port},
                                                        "mail_from": "cost@example.com"})
        notifier = Notifier(storage.resolve(str(tmp_path)), owners=_owners(ml={"email": "ml@example.com"}),
                            settings=settings)
        assert notifier.send("k", "ml", "Quota frozen", "see the ROI form", {}) is True
    assert [(m.to, m.subject, m.body.strip()) for m in inbox.messages] == [
        (["ml@example.com"], "Quota frozen", "see the ROI form")]


def test_outbox_when_nothing_is_configured(tmp_path):
    owners = _owners(ml={"email": "ml@example.com"})  # an address, but no SMTP configured
    notifier = Notifier(storage.resolve(str(tmp_path)), owners=owners, settings=NotificationSettings())
    assert notifier.channels("ml") == ["outbox"] and notifier.channels("nobody") == ["outbox"]
    assert notifier.send("k1", "ml", "S", "M", {"month": "2024-09"}) is True
    assert notifier.send("k1", "ml", "S", "M", {"month": "2024-09"}) is False
    assert notifier.send("k2", "nobody", "S2", "M2", {}) is True
    assert [(r["key"], r["owner"], r.get("to")) for r in _outbox(tmp_path)] == [
        ("k1", "ml", ["ml@example.com"]), ("k2", "nobody", None)]


def test_entries_of_the_old_ledger_count_as_sent(tmp_path, endpoints):
    inbox, received, settings = endpoints
    (tmp_path / "notified.json").write_text(json.dumps({"k": {"owner": "ml", "subject": "S"}}))
    owners = _owners(ml={"email": "ml@example.com", "webhook_env": "TEAM_WEBHOOK"})
    assert Notifier(storage.resolve(str(tmp_path)), owners=owners, settings=settings).send("k", "ml", "S", "M", {}) is False
    assert inbox.messages == [] and received == []


def test_contacts_in_the_owners_file(tmp_path):
    good = tmp_path / "owners.yaml"
    good.write_text("owner_tags: [owner]\ncontacts:\n  ml: {email: ml@example.com, webhook_conn: slack_ml}\n")
    contact = load_owners(str(good)).contacts["ml"]
    assert contact.email == ["ml@example.com"] and contact.webhook_conn == "slack_ml"
    leaky = tmp_path / "leaky.yaml"
    leaky.write_text(f"owner_tags: [owner]\ncontacts:\n  ml: {{webhook: 'https://hooks.example/{SECRET}'}}\n")
    with pytest.raises(ConfigError) as error:
        load_owners(str(leaky))
    assert "contacts.ml" in str(error.value) and "webhook_conn" in str(error.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text("owner_tags: [owner]\ncontacts:\n  ml: {email: not-an-address}\n")
    with pytest.raises(ConfigError, match="contacts.ml.email.*not an e-mail address"):
        load_owners(str(bad))


def test_a_missing_webhook_reference_is_reported(tmp_path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_HOOK", raising=False)
    notifier = Notifier(storage.resolve(str(tmp_path)), owners=_owners(ml={"webhook_env": "NO_SUCH_HOOK"}),
                        settings=NotificationSettings())
    with pytest.raises(DeliveryError, match="webhook failed: webhook: environment variable NO_SUCH_HOOK is not set"):
        notifier.send("k", "ml", "S", "M", {})
    assert not (tmp_path / "notified.json").exists()  # nothing delivered, nothing recorded
