"""Notifications to owners, delivered to each owner's channels, and the ledger that makes them idempotent.

`Notifier.send(key, owner, subject, message, details)` delivers to the owner's contacts in the
owners file (`contacts:`): e-mail (when `notifications.smtp_conn_id` or `notifications.smtp.host`
is set) and a Slack-compatible webhook (by reference: `webhook_conn` / `webhook_env`). With
`cost.notifier: airflow:<module.Class>` that Airflow notifier is one more channel, built from
`notifier_kwargs` whose string values may use `{subject}`, `{message}` and `{owner}` (e.g.
`airflow.providers.smtp.notifications.smtp.SmtpNotifier`). When an owner has no channel (nothing
configured), the message goes to the outbox, JSON lines in `<state>/outbox.jsonl` that a mail/Slack
bridge can drain.

Each (key, channel) is delivered at most once: the ledger (`notified.json`) is written after each
delivery, so a retry after a crash between the e-mail and the webhook sends only the webhook.
"""

from __future__ import annotations

import importlib
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from seedance_tasks import storage
from seedance_tasks.errors import ConfigError, InputError, SeedanceError, UnavailableError
from seedance_tasks.notifiers import (
    NotificationSettings,
    load_notification_settings,
    send_email,
    send_webhook,
)
from seedance_tasks.storage import Location

if TYPE_CHECKING:
    from seedance_tasks.cost.owners import Contact, OwnersFile


NOTIFICATIONS_LEASE = "cost-notifications"


@contextmanager
def state_lease(root: Location, wait_s: float) -> Iterator[None]:
    """Hold the lease of the notification state (`notified.json`, the outbox, the quota ledger) on
    the cost outputs `root` for the block, waiting up to `wait_s` for another writer: each loads
    these files, then writes them back whole, so two writers at once would lose each other's
    entries (and resend what was sent, or drop an outbox line). Every writer takes it: the
    recovery's rules stage and each step of the actions workflow."""
    from seedance_tasks import lease

    holder = f"notify:{os.getpid()}:{secrets.token_hex(4)}"
    with lease.holding(root, NOTIFICATIONS_LEASE, holder=holder, purpose="owner notification", wait_s=wait_s):
        yield


class Ledger:
    """A small JSON document of keys already acted on (notifications sent, quotas frozen)."""

    def __init__(self, state: Location, name: str):
        self.state = state
        self.path = state.join(name)
        self.entries: dict[str, Any] = self._load()

    def _load(self) -> dict[str, Any]:
        """The ledger's entries; none if it has no file yet. InputError naming the file if it is not a
        JSON object: it records what was already done, so it is never silently started afresh."""
        if not storage.is_file(self.state.fs, self.path):
            return {}
        try:
            entries = storage.read_json(self.state.fs, self.path)
            problem = None if isinstance(entries, dict) else f"a JSON {type(entries).__name__}, not an object"
        except (ValueError, UnicodeDecodeError) as exc:
            problem = f"not JSON: {exc}"
        if problem:
            raise InputError(f"{self.state.uri_of(self.path)}: malformed state file ({problem})",
                             hint="it records what was already done (notified, frozen): restore it from the "
                             "trash or a backup, or move it away to act on everything again")
        return entries

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def record(self, key: str, value: Any) -> None:
        self.entries[key] = value
        self.save()

    def forget(self, key: str) -> None:
        if self.entries.pop(key, None) is not None:
            self.save()

    def save(self) -> None:
        storage.write_json_atomic(self.state.fs, self.path, self.entries)


class DeliveryError(UnavailableError):
    """Some channels of one notification failed; those that worked are recorded and not resent."""

    def __init__(self, key: str, owner: str, failed: dict[str, str], delivered: list[str]):
        done = f"; delivered: {', '.join(delivered)}" if delivered else ""
        super().__init__(f"notification {key} to {owner}: " + "; ".join(f"{name} failed: {why}"
                                                                         for name, why in failed.items()) + done,
                         hint="a retry sends only the channels that failed")
        self.key, self.owner, self.failed, self.delivered = key, owner, failed, delivered


class Notifier:
    """Sends one message to an owner's channels; each (key, channel) at most once, remembered in
    `notified.json` under `state`. `owners` (an OwnersFile or its URI) gives the contacts; without
    it every message goes to the outbox (or the configured Airflow notifier). `settings` (the
    `notifications` section) is loaded from config when needed and not given."""

    def __init__(self, state: Location, kind: str = "outbox", kwargs: dict[str, Any] | None = None, *,
                 owners: OwnersFile | str | None = None, settings: NotificationSettings | None = None):
        self.state = state
        self.kind = kind
        self.kwargs = kwargs or {}
        self.ledger = Ledger(state, "notified.json")
        if kind != "outbox" and not kind.startswith("airflow:"):
            raise ConfigError(f"unknown cost.notifier {kind!r}", hint="use outbox or airflow:<module.Class>")
        if isinstance(owners, str):
            from seedance_tasks.cost.owners import load_owners

            owners = load_owners(owners)
        self.contacts: dict[str, Contact] = dict(owners.contacts) if owners is not None else {}
        self._settings = settings
        self.failures: list[DeliveryError] = []

    @property
    def settings(self) -> NotificationSettings:
        if self._settings is None:
            self._settings = load_notification_settings()
        return self._settings

    def channels(self, owner: str) -> list[str]:
        """The channels a message to `owner` goes to now: `email`, `webhook`, `airflow`, else `outbox`."""
        contact = self.contacts.get(owner)
        names = []
        if contact is not None and contact.email and self.settings.email_configured:
            names.append("email")
        if contact is not None and contact.has_webhook:
            names.append("webhook")
        if self.kind.startswith("airflow:"):
            names.append("airflow")
        return names or ["outbox"]

    def send(self, key: str, owner: str, subject: str, message: str, details: dict[str, Any]) -> bool:
        """Deliver to every channel of `owner` that `key` was not delivered to yet; True if any was now.

        The ledger is written after each delivery. A key whose channels all worked once is never
        sent again (even if channels are added later). If a channel fails, the others are still
        tried, and then DeliveryError (retryable) names each failed channel and why; the channels
        that worked are not resent by the retry.
        """
        entry = self.ledger.entries.get(key)
        if entry is not None and (entry.get("complete", True)):  # entries before channels existed: sent
            return False
        done: dict[str, str] = dict((entry or {}).get("channels", {}))
        record = {"key": key, "owner": owner, "subject": subject, "message": message, "details": details}
        failed: dict[str, str] = {}
        delivered: list[str] = []
        for channel in self.channels(owner):
            if channel in done:
                continue
            try:
                getattr(self, f"_{channel}")(record)
            except SeedanceError as exc:
                failed[channel] = exc.message
                continue
            done[channel] = datetime.now(UTC).isoformat(timespec="seconds")
            delivered.append(channel)
            self.ledger.record(key, {"owner": owner, "subject": subject, "channels": done, "complete": False})
        if failed:
            error = DeliveryError(key, owner, failed, delivered)
            self.failures.append(error)
            raise error
        self.ledger.record(key, {"owner": owner, "subject": subject, "channels": done, "complete": True})
        return bool(delivered)

    def forget(self, key: str) -> None:
        """Allow `key` to be sent again (e.g. an idle resource that became active)."""
        self.ledger.forget(key)

    def _outbox(self, record: dict[str, Any]) -> None:
        contact = self.contacts.get(record["owner"])
        if contact is not None and contact.email:
            record = {**record, "to": contact.email}
        path = self.state.join("outbox.jsonl")
        old = storage.read_bytes(self.state.fs, path) if storage.is_file(self.state.fs, path) else b""
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        storage.write_bytes_atomic(self.state.fs, path, old + line.encode())

    def _email(self, record: dict[str, Any]) -> None:
        send_email(self.contacts[record["owner"]].email, record["subject"], record["message"], self.settings)

    def _webhook(self, record: dict[str, Any]) -> None:
        send_webhook(self.contacts[record["owner"]], record["subject"], record["message"])

    def _airflow(self, record: dict[str, Any]) -> None:
        module_name, _, class_name = self.kind.removeprefix("airflow:").rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError, ValueError):
            raise ConfigError(f"cost.notifier: cannot import {self.kind!r}") from None
        fields = {"subject": record["subject"], "message": record["message"], "owner": record["owner"]}
        kwargs = {key: value.format(**fields) if isinstance(value, str) else value for key, value in self.kwargs.items()}
        try:
            cls(**kwargs).notify({"seedance_notification": record})
        except SeedanceError:
            raise
        except Exception as exc:
            raise UnavailableError(f"{self.kind}: {type(exc).__name__}: {exc}") from None
