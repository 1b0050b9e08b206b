"""Airflow notifiers of Seedance (BaseNotifier subclasses): a Slack-compatible incoming webhook,
and the alert every Seedance task sends when it fails for good (`on_failure_callback`, wired
through `dag_support.failure_notifiers()`). E-mail goes through the smtp provider's `SmtpNotifier`
(`notifiers.send_email`).

Imports Airflow: load it only from a running task or callback, never at DAG top level.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import BaseNotifier

from seedance_tasks.errors import SeedanceError
from seedance_tasks.notifiers import (
    NotificationSettings,
    WebhookRef,
    load_notification_settings,
    post_webhook,
    send_email,
    webhook_url,
)

log = logging.getLogger("seedance_tasks.notify")


class WebhookNotifier(BaseNotifier):
    """POSTs `{"text": text}` to the incoming webhook whose URL is kept in Airflow connection
    `webhook_conn` (its password, or its host) or in environment variable `webhook_env`. The URL
    is never logged; errors name the reference. `text` is a template field."""

    template_fields = ("text", "webhook_conn", "webhook_env")

    def __init__(self, text: str, *, webhook_conn: str | None = None, webhook_env: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.text = text
        self.webhook_conn = webhook_conn
        self.webhook_env = webhook_env

    def notify(self, context) -> None:
        ref = WebhookRef(webhook_conn=self.webhook_conn, webhook_env=self.webhook_env)
        post_webhook(webhook_url(ref), self.text, name=ref.webhook_name)


def failure_message(context) -> tuple[str, str]:
    """(subject, text) of a failed task: DAG, run, task (and map index), try number, the error's
    first line and the task log's URL, from the callback's Airflow `context`."""
    ti = context.get("ti") or context.get("task_instance")
    dag_id = getattr(ti, "dag_id", None) or getattr(context.get("dag"), "dag_id", "?")
    task_id = getattr(ti, "task_id", None) or getattr(context.get("task"), "task_id", "?")
    run_id = getattr(ti, "run_id", None) or context.get("run_id", "?")
    map_index = getattr(ti, "map_index", -1)
    try_number = getattr(ti, "try_number", "?")
    error = context.get("exception")
    lines = [line for line in str(error or "").splitlines() if line.strip()]
    first = lines[0].strip() if lines else (type(error).__name__ if error else "unknown error")
    try:
        log_url = ti.log_url if ti is not None else "?"
    except Exception:  # noqa: BLE001 - a URL that cannot be built must not stop the alert
        log_url = "?"
    task = task_id + (f"[{map_index}]" if isinstance(map_index, int) and map_index >= 0 else "")
    subject = f"[seedance] task failed: {dag_id}.{task} (try {try_number})"
    text = "\n".join([f"DAG: {dag_id}", f"run: {run_id}", f"task: {task}", f"try: {try_number}",
                      f"error: {first[:500]}", f"log: {log_url}"])
    return subject, text


def notify_failure(context, settings: NotificationSettings | None = None) -> dict[str, Any]:
    """Send the failure alert to `notifications.on_failure` (e-mail and/or webhook); a no-op when
    that is empty. Never raises: a channel that fails is logged (naming the channel, not any
    secret) and the others are still tried. Returns {"sent": [...], "failed": {channel: why}}."""
    settings = settings or load_notification_settings()
    target = settings.on_failure
    result: dict[str, Any] = {"sent": [], "failed": {}}
    if not target.enabled:
        return result
    subject, text = failure_message(context)
    if target.email:
        try:
            send_email(target.email, subject, text, settings, context)
            result["sent"].append("email")
        except SeedanceError as exc:
            result["failed"]["email"] = exc.message
    if target.has_webhook:
        try:
            WebhookNotifier(f"*{subject}*\n{text}", webhook_conn=target.webhook_conn,
                            webhook_env=target.webhook_env).notify(context)
            result["sent"].append("webhook")
        except SeedanceError as exc:
            result["failed"]["webhook"] = exc.message
    for channel, why in result["failed"].items():
        log.error("failure alert: %s failed: %s", channel, why)
    if result["sent"]:
        log.info("failure alert sent: %s", ", ".join(result["sent"]))
    return result


class FailureNotifier(BaseNotifier):
    """The `on_failure_callback` of Seedance tasks: `notify_failure` with the config read when a
    task fails (so nothing is read at parse time)."""

    def notify(self, context) -> None:
        try:
            notify_failure(context)
        except SeedanceError as exc:  # e.g. a malformed notifications section
            log.error("failure alert not sent: %s", exc)
