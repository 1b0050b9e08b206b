"""Delivery channels shared by every Seedance notification, and their settings (section
`notifications:` of config/seedance.yaml).

- E-mail: through Airflow's `SmtpNotifier` and an SMTP connection (`smtp_conn_id`, e.g. the smtp
  provider's `smtp_default`), or, for CLI runs without Airflow connections, plain SMTP from
  `notifications.smtp` (the password is read from the environment variable it names).
- Webhook: a Slack-compatible incoming webhook, POST `{"text": ...}`. The URL is a secret: it is
  named by reference only (an Airflow connection id, `webhook_conn`, or an environment variable,
  `webhook_env`) and never appears in config files, logs or error messages.

Cheap to import (no Airflow, no network): DAG files reach it through `dag_support`. The Airflow
notifier classes are in `seedance_tasks.airflow_notifiers`.
"""

from __future__ import annotations

import html
import http.client
import json
import os
import re
import urllib.error
import urllib.request
from typing import Literal

from pydantic import Field, field_validator, model_validator

from seedance_tasks.boundary import utf8
from seedance_tasks.errors import ConfigError, UnavailableError
from seedance_tasks.settings_base import StrictModel
from seedance_tasks.units import Duration

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
SECRET_HINT = ("a webhook URL is a secret: store it in an Airflow connection (`webhook_conn: <conn id>`, the URL "
               "as the connection's password or host) or an environment variable (`webhook_env: <NAME>`)")


def email_list(value):
    """A single address or a list of them, as a list; each must look like `name@host`."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    for item in items:
        if not isinstance(item, str) or not _EMAIL.match(item.strip()):
            raise ValueError(f"not an e-mail address: {item!r}")
    return [item.strip() for item in items]


class WebhookRef(StrictModel):
    """Where a webhook URL is kept: an Airflow connection, or an environment variable (never the URL)."""

    webhook_conn: str | None = Field(None, description="Airflow connection holding the webhook URL")
    webhook_env: str | None = Field(None, pattern=ENV_NAME, description="environment variable holding the URL")

    @model_validator(mode="before")
    @classmethod
    def _no_url(cls, data):
        if isinstance(data, dict):
            for key in ("webhook", "webhook_url", "url"):
                if key in data:
                    raise ValueError(f"'{key}' is not allowed: {SECRET_HINT}")
            if data.get("webhook_conn") and data.get("webhook_env"):
                raise ValueError("give webhook_conn or webhook_env, not both")
        return data

    @property
    def has_webhook(self) -> bool:
        return bool(self.webhook_conn or self.webhook_env)

    @property
    def webhook_name(self) -> str:
        """The reference, safe to log: `connection X` or `$NAME`."""
        return f"connection {self.webhook_conn}" if self.webhook_conn else f"${self.webhook_env}"


class SmtpSettings(StrictModel):
    host: str | None = Field(None, description="SMTP server of CLI runs when smtp_conn_id is null; null: none")
    port: int = Field(25, gt=0, lt=65536)
    security: Literal["none", "starttls", "ssl"] = "none"
    user: str | None = None
    password_env: str | None = Field(None, pattern=ENV_NAME, description="environment variable with the password")
    timeout: Duration = Field(30, gt=0)


class FailureSettings(WebhookRef):
    email: list[str] = Field(default_factory=list, description="addresses told of every failed Seedance task")

    @field_validator("email", mode="before")
    @classmethod
    def _emails(cls, value):
        return email_list(value)

    @property
    def enabled(self) -> bool:
        return bool(self.email or self.has_webhook)


class NotificationSettings(StrictModel):
    smtp_conn_id: str | None = Field(None, description="Airflow SMTP connection (e.g. smtp_default); else `smtp`")
    mail_from: str = "seedance@localhost"
    smtp: SmtpSettings = SmtpSettings()
    on_failure: FailureSettings = FailureSettings()

    @property
    def email_configured(self) -> bool:
        return bool(self.smtp_conn_id or self.smtp.host)


def webhook_url(ref: WebhookRef) -> str:
    """The URL `ref` points at (connection password, else its host/URI; or the env variable).

    Raises ConfigError naming the reference, never the URL.
    """
    if ref.webhook_env:
        url = os.environ.get(ref.webhook_env, "").strip()
        if not url:
            raise ConfigError(f"webhook: environment variable {ref.webhook_env} is not set",
                              hint=f"export {ref.webhook_env}=<the incoming-webhook URL>")
    elif ref.webhook_conn:
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            conn = BaseHook.get_connection(ref.webhook_conn)
        except AirflowNotFoundException:
            raise ConfigError(f"webhook: Airflow connection {ref.webhook_conn!r} is not defined",
                              hint="create it (Admin > Connections, or AIRFLOW_CONN_<ID>) with the URL as password"
                              ) from None
        url = (conn.password or "").strip()
        if not url.startswith(("http://", "https://")):
            host = (conn.host or "").strip()
            if host.startswith(("http://", "https://")):
                url = host
            elif host:
                scheme = conn.schema if conn.schema in ("http", "https") else "https"
                url = f"{scheme}://{host}" + (f":{conn.port}" if conn.port else "")
                url += "/" + ((conn.extra_dejson or {}).get("endpoint") or "").lstrip("/")
            else:
                url = ""
        if not url:
            raise ConfigError(f"webhook: Airflow connection {ref.webhook_conn!r} has no URL",
                              hint="put the incoming-webhook URL in the connection's password (or host)")
    else:
        raise ConfigError("webhook: no webhook_conn or webhook_env given", hint=SECRET_HINT)
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"webhook: {ref.webhook_name} does not hold an http(s) URL")
    return url


def post_webhook(url: str, text: str, *, name: str = "webhook", timeout: float = 30) -> None:
    """POST `{"text": text}` as JSON (Slack's incoming-webhook format), `&`, `<` and `>` escaped as
    Slack asks, so text from data shows as written and never becomes a mention (`<!channel>`) or a
    disguised link (`<https://…|label>`); a non-2xx answer or a network error raises
    UnavailableError naming `name` (the reference), never the URL."""
    text = utf8(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    request = urllib.request.Request(url, data=json.dumps({"text": text}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        raise UnavailableError(f"webhook {name}: HTTP {exc.code} {exc.reason}",
                               hint="check the webhook URL kept there") from None
    except (OSError, ValueError, http.client.HTTPException) as exc:  # InvalidURL's message quotes the URL: not shown
        reason = getattr(exc, "reason", None) or type(exc).__name__
        raise UnavailableError(f"webhook {name} unreachable: {reason}", hint="check the webhook URL kept there") from None


def send_webhook(ref: WebhookRef, subject: str, text: str) -> None:
    """Resolve `ref` and post `*subject*\\ntext` to it, the subject as `one_line` (ConfigError /
    UnavailableError name the ref)."""
    post_webhook(webhook_url(ref), f"*{one_line(subject)}*\n{text}", name=ref.webhook_name)


def one_line(text: str) -> str:
    """`text` with every run of whitespace (CR, LF, U+2028 and the other line breaks included) as one
    space: a mail subject built from data (a resource id, an owner) cannot add a header or fail to send."""
    return " ".join(str(text).split())


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~&])")


def markdown_literal(text: str) -> str:
    """`text` (a name, an id from data) shown as itself inside Markdown: on one line, every character
    Markdown or HTML would act on backslash-escaped, so it cannot become a link, an image (a remote
    fetch), emphasis or a heading where a person reads it (Airflow's required-action requests)."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", one_line(utf8(str(text))))


# inline (mail clients drop <style>): line breaks kept as written, a line too long for the window
# wrapped at spaces, and one with none (a JSON evidence line, a URI) wherever it must
_PRE_STYLE = "white-space:pre-wrap;word-wrap:break-word;overflow-wrap:anywhere;max-width:100%;font-family:monospace"


def html_body(text: str) -> str:
    """`text` as a mail's HTML body: escaped (markup from data is shown, never obeyed), its line
    breaks kept, and every line wrapped to the reader's window rather than running off it."""
    return f'<pre style="{_PRE_STYLE}">{html.escape(text)}</pre>'


def send_email(to: list[str], subject: str, text: str, settings: NotificationSettings, context=None) -> None:
    """Mail `text` to `to`: through SmtpNotifier and `settings.smtp_conn_id` if set, else plain SMTP
    from `settings.smtp`. The subject is sent as `one_line`; a recipient that is not one `name@host`
    address raises ConfigError naming it (nothing is sent). Failures raise UnavailableError naming
    the connection or host (never a password); no SMTP configured at all raises ConfigError."""
    subject, text = one_line(utf8(subject)), utf8(text)
    try:
        to = email_list(to)
    except ValueError as exc:
        raise ConfigError(f"e-mail: {exc}", hint="give one address per entry, e.g. team@example.com") from None
    if not to:
        raise ConfigError("e-mail: no recipient", hint="give at least one address")
    if settings.smtp_conn_id:
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        notifier = SmtpNotifier(to=to, from_email=settings.mail_from, subject=subject,
                                html_content=html_body(text), smtp_conn_id=settings.smtp_conn_id)
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            notifier.notify(context or {})
        except AirflowNotFoundException:
            raise ConfigError(f"e-mail: Airflow connection {settings.smtp_conn_id!r} is not defined",
                              hint="create that SMTP connection, or set notifications.smtp_conn_id") from None
        except Exception as exc:  # smtplib, socket and Airflow connection errors alike
            raise UnavailableError(f"e-mail through SMTP connection {settings.smtp_conn_id!r} failed: "
                                   f"{type(exc).__name__}: {exc}", hint="check that connection's host/port") from None
        return
    if not settings.smtp.host:
        raise ConfigError("e-mail: no SMTP configured",
                          hint="set notifications.smtp_conn_id (an Airflow SMTP connection) or notifications.smtp.host")
    _smtplib_send(to, subject, text, settings)


def _smtplib_send(to: list[str], subject: str, text: str, settings: NotificationSettings) -> None:
    import smtplib
    from email.message import EmailMessage

    smtp = settings.smtp
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = settings.mail_from, ", ".join(to), subject
    message.set_content(text)
    password = os.environ.get(smtp.password_env) if smtp.password_env else None
    if smtp.password_env and password is None:
        raise ConfigError(f"e-mail: environment variable {smtp.password_env} is not set",
                          hint="export it, or drop notifications.smtp.password_env")
    where = f"{smtp.host}:{smtp.port}"
    try:
        client_class = smtplib.SMTP_SSL if smtp.security == "ssl" else smtplib.SMTP
        with client_class(smtp.host, smtp.port, timeout=float(smtp.timeout)) as client:
            if smtp.security == "starttls":
                client.starttls()
            if smtp.user:
                client.login(smtp.user, password or "")
            client.send_message(message)
    except (OSError, smtplib.SMTPException) as exc:
        raise UnavailableError(f"e-mail through {where} failed: {type(exc).__name__}: {exc}",
                               hint="check notifications.smtp") from None


def load_notification_settings() -> NotificationSettings:
    """Section `notifications` of the config (file, then SEEDANCE__NOTIFICATIONS__* environment)."""
    from seedance_tasks.config import load_section

    return load_section("notifications")
