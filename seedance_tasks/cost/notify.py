"""Notifications to owners, through a pluggable notifier, and the ledger that makes them idempotent.

Default: an outbox of JSON lines (`<state>/outbox.jsonl`) that a mail/Slack bridge can drain.
`notifier: airflow:<module.Class>` sends through an Airflow notifier instead (e.g.
`airflow.providers.smtp.notifications.smtp.SmtpNotifier`), built from `notifier_kwargs` whose
string values may use `{subject}`, `{message}` and `{owner}`.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from seedance_tasks import storage
from seedance_tasks.errors import ConfigError
from seedance_tasks.storage import Location


class Ledger:
    """A small JSON document of keys already acted on (notifications sent, quotas frozen)."""

    def __init__(self, state: Location, name: str):
        self.state = state
        self.path = state.join(name)
        self.entries: dict[str, Any] = (
            storage.read_json(state.fs, self.path) if storage.is_file(state.fs, self.path) else {}
        )

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


class Notifier:
    """Sends one message to an owner; each (key) at most once, remembered in `notified.json`."""

    def __init__(self, state: Location, kind: str = "outbox", kwargs: dict[str, Any] | None = None):
        self.state = state
        self.kind = kind
        self.kwargs = kwargs or {}
        self.ledger = Ledger(state, "notified.json")
        if kind != "outbox" and not kind.startswith("airflow:"):
            raise ConfigError(f"unknown cost.notifier {kind!r}", hint="use outbox or airflow:<module.Class>")

    def send(self, key: str, owner: str, subject: str, message: str, details: dict[str, Any]) -> bool:
        """Send unless `key` was sent before; True if sent now."""
        if key in self.ledger:
            return False
        record = {"key": key, "owner": owner, "subject": subject, "message": message, "details": details}
        if self.kind == "outbox":
            path = self.state.join("outbox.jsonl")
            old = storage.read_bytes(self.state.fs, path) if storage.is_file(self.state.fs, path) else b""
            line = json.dumps(record, sort_keys=True, default=str) + "\n"
            storage.write_bytes_atomic(self.state.fs, path, old + line.encode())
        else:
            self._airflow(record)
        self.ledger.record(key, {"owner": owner, "subject": subject})
        return True

    def forget(self, key: str) -> None:
        """Allow `key` to be sent again (e.g. an idle resource that became active)."""
        self.ledger.forget(key)

    def _airflow(self, record: dict[str, Any]) -> None:
        module_name, _, class_name = self.kind.removeprefix("airflow:").rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError, ValueError):
            raise ConfigError(f"cost.notifier: cannot import {self.kind!r}") from None
        fields = {"subject": record["subject"], "message": record["message"], "owner": record["owner"]}
        kwargs = {key: value.format(**fields) if isinstance(value, str) else value for key, value in self.kwargs.items()}
        cls(**kwargs).notify({"seedance_notification": record})
