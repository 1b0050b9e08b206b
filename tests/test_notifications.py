"""Task-failure alerts: every Seedance DAG's tasks carry the shared `on_failure_callback`
(`dag_support.failure_notifiers()`), parsing does not load it, and a real Airflow task failure
(`dag.test()`) sends one e-mail (aiosmtpd on 127.0.0.1, through SmtpNotifier) and one webhook (loopback)
naming the DAG, run, task, try, error and log URL; nothing configured: nothing sent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seedance_tasks.dag_support import FailureCallback
from tests.mail_services import smtp_connection, smtp_server, webhook_server

REPO = Path(__file__).resolve().parents[1]
DAG_FILES = sorted((REPO / "dags").glob("*.py"))


def test_every_task_of_every_dag_has_the_failure_callback(dagbag):
    assert not dagbag.import_errors
    assert {path.stem for path in DAG_FILES} <= set(dagbag.dags)
    for dag_id, dag in dagbag.dags.items():
        for task in dag.tasks:
            assert any(isinstance(cb, FailureCallback) for cb in task.on_failure_callback or []), (dag_id, task.task_id)


PROBE = """
import json, runpy, sys
for path in sys.argv[1:]:
    runpy.run_path(path)
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("seedance_tasks.notifiers",
      "seedance_tasks.airflow_notifiers", "airflow.providers.smtp.notifications", "airflow.providers.smtp.hooks",
      "smtplib")))))
"""


def test_parsing_loads_no_notifier_and_reads_no_notification_config(tmp_path):
    """The callback is built at parse time but imports and reads nothing until a task fails: a
    broken `notifications` section does not break parsing."""
    config = tmp_path / "seedance.yaml"
    config.write_text("notifications: {on_failure: {email: 7, no_such_key: 1}}\n")
    env = {"PATH": "/usr/bin:/bin", "SEEDANCE_CONFIG": str(config), "AIRFLOW_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", PROBE, *map(str, DAG_FILES)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.fixture
def alerting(monkeypatch):
    """(inbox, webhook bodies): notifications.on_failure configured through the environment, to
    aiosmtpd (Airflow connection `alerts_smtp`) and a webhook whose URL is only in $ALERTS_WEBHOOK."""
    with smtp_server() as (inbox, port), webhook_server() as (received, url):
        monkeypatch.setenv("AIRFLOW_CONN_ALERTS_SMTP", smtp_connection(port))
        monkeypatch.setenv("ALERTS_WEBHOOK", url)
        monkeypatch.setenv("SEEDANCE__NOTIFICATIONS__SMTP_CONN_ID", "alerts_smtp")
        monkeypatch.setenv("SEEDANCE__NOTIFICATIONS__MAIL_FROM", "airflow@example.com")
        monkeypatch.setenv("SEEDANCE__NOTIFICATIONS__ON_FAILURE__EMAIL", "[oncall@example.com]")
        monkeypatch.setenv("SEEDANCE__NOTIFICATIONS__ON_FAILURE__WEBHOOK_ENV", "ALERTS_WEBHOOK")
        yield inbox, received


FAILING_DAG = """
import pendulum
from airflow.sdk import DAG, task
from seedance_tasks.dag_support import DEFAULT_ARGS

with DAG("{dag_id}", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
         default_args={{**DEFAULT_ARGS, "retries": 0}}):
    @task
    def fine():
        return 1

    @task
    def boom(value):
        raise ValueError(f"row {{value + 6}} has no owner\\nsecond line of the error")

    boom(fine())
"""


@pytest.fixture
def failing_dag(airflow_db, tmp_path):
    """A tiny DAG (in its own file, synced to the metadata DB like the DAG processor does) with
    Seedance's DEFAULT_ARGS whose second task fails."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    def make(dag_id: str):
        path = tmp_path / f"{dag_id}.py"
        path.write_text(FAILING_DAG.format(dag_id=dag_id))
        bag = DagBag(dag_folder=str(path))
        assert not bag.import_errors, bag.import_errors
        DagBundlesManager().sync_bundles_to_db()
        sync_bag_to_db(bag, "dags-folder", None)
        return bag.dags[dag_id]

    return make


def _assert_alert(text: str, dag_id: str, run_id: str, task_id: str, error: str) -> None:
    assert f"DAG: {dag_id}" in text and f"run: {run_id}" in text and f"task: {task_id}" in text
    assert "try: 1" in text and f"error: {error}" in text
    assert f"log: http://localhost:8080/dags/{dag_id}/runs/" in text and f"/tasks/{task_id}" in text


def test_a_failed_task_sends_one_mail_and_one_webhook(failing_dag, alerting):
    inbox, received = alerting
    dag_run = failing_dag("seedance_alert_probe").test()
    assert dag_run.state == "failed"
    assert [(m.to, m.subject) for m in inbox.messages] == [
        (["oncall@example.com"], "[seedance] task failed: seedance_alert_probe.boom (try 1)")]
    _assert_alert(inbox.messages[0].body, "seedance_alert_probe", dag_run.run_id, "boom", "row 7 has no owner")
    assert "second line" not in inbox.messages[0].body
    assert len(received) == 1 and set(received[0]["json"]) == {"text"}
    text = received[0]["json"]["text"]
    assert text.startswith("*[seedance] task failed: seedance_alert_probe.boom (try 1)*\n")
    _assert_alert(text, "seedance_alert_probe", dag_run.run_id, "boom", "row 7 has no owner")


def test_a_seedance_dag_with_a_bad_conf_alerts(run_dag, tmp_path, alerting):
    inbox, received = alerting
    missing = tmp_path / "no-owners.yaml"
    dag_run = run_dag("seedance_cost_recovery", {"month": "2024-09", "billing": str(tmp_path / "billing.csv"),
                                                 "owners": str(missing), "out": str(tmp_path / "out")})
    assert dag_run.state == "failed"
    assert [m.subject for m in inbox.messages] == ["[seedance] task failed: seedance_cost_recovery.prepare (try 1)"]
    assert len(received) == 1
    for text in (inbox.messages[0].body, received[0]["json"]["text"]):
        assert "DAG: seedance_cost_recovery" in text and "task: prepare" in text and str(missing) in text


def test_nothing_configured_sends_nothing(failing_dag, monkeypatch):
    from seedance_tasks.airflow_notifiers import notify_failure
    from seedance_tasks.notifiers import NotificationSettings

    class Untouchable(dict):
        def get(self, *args):
            raise AssertionError("a no-op must not read the context")

    assert notify_failure(Untouchable(), NotificationSettings()) == {"sent": [], "failed": {}}
    with webhook_server() as (received, url):
        monkeypatch.setenv("UNUSED_WEBHOOK", url)  # there, but not configured
        assert failing_dag("seedance_alert_quiet").test().state == "failed"
    assert received == []


def test_a_broken_channel_is_logged_and_the_other_still_sent(failing_dag, alerting, monkeypatch, caplog):
    inbox, received = alerting
    monkeypatch.delenv("ALERTS_WEBHOOK")
    dag_run = failing_dag("seedance_alert_half").test()
    assert dag_run.state == "failed" and len(inbox.messages) == 1 and received == []
    assert "failure alert: webhook failed: webhook: environment variable ALERTS_WEBHOOK is not set" in caplog.text


# ----------------------------------------------------------------------------- text from data


DATA_SUBJECT = "Idle resource arn:aws:ec2:i-1\r\nBcc: attacker@evil.example\u2028flagged"


def _mail_settings(through: str, port: int, monkeypatch):
    """Mail settings for the loopback server on `port`: plain `smtplib`, or Airflow's SMTP connection."""
    from seedance_tasks.notifiers import NotificationSettings, SmtpSettings

    if through == "smtplib":
        return NotificationSettings(smtp=SmtpSettings(host="127.0.0.1", port=port))
    monkeypatch.setenv("AIRFLOW_CONN_DATA_SMTP", smtp_connection(port))
    return NotificationSettings(smtp_conn_id="data_smtp")


@pytest.mark.parametrize("through", ["smtplib", "smtp connection"])
def test_a_subject_with_line_breaks_from_data_is_sent_as_one_line(monkeypatch, through):
    """A resource id or owner name with CR/LF (or U+2028) in a subject neither adds a header nor
    stops the mail: plain SMTP refused such a header (ValueError), SmtpNotifier failed retryably."""
    from seedance_tasks.notifiers import send_email

    with smtp_server() as (inbox, port):
        settings = _mail_settings(through, port, monkeypatch)
        send_email(["owner@example.com"], DATA_SUBJECT, "stop it", settings)
    assert [(m.to, m.subject) for m in inbox.messages] == [
        (["owner@example.com"], "Idle resource arn:aws:ec2:i-1 Bcc: attacker@evil.example flagged")]


@pytest.mark.parametrize("address", ["owner@example.com,attacker@evil.example", "owner@example.com\r\nBcc: a@evil.example",
                                     "owner@example.com attacker@evil.example"])
def test_a_recipient_that_is_not_one_address_is_refused_and_nothing_is_sent(address):
    from seedance_tasks.errors import ConfigError
    from seedance_tasks.notifiers import NotificationSettings, SmtpSettings, send_email

    with smtp_server() as (inbox, port):
        settings = NotificationSettings(smtp=SmtpSettings(host="127.0.0.1", port=port))
        with pytest.raises(ConfigError, match="e-mail: not an e-mail address"):
            send_email([address], "subject", "text", settings)
    assert inbox.messages == []


def test_webhook_text_from_data_cannot_mention_everyone_or_disguise_a_link():
    """Slack reads `<!channel>` as a mention and `<url|label>` as a link: `&`, `<`, `>` go escaped."""
    from seedance_tasks.notifiers import post_webhook

    with webhook_server() as (received, url):
        post_webhook(url, "owner <!channel> & <https://evil.example|approve>")
    assert received[0]["json"]["text"] == "owner &lt;!channel&gt; &amp; &lt;https://evil.example|approve&gt;"


@pytest.mark.parametrize("through", ["smtplib", "smtp connection", "webhook"])
def test_a_message_naming_a_file_whose_name_is_not_utf8_is_sent(monkeypatch, through):
    """A folder name with the byte 0xff (Python's surrogate escape from os.listdir) in a subject or
    body: UnicodeEncodeError before (a traceback, or a retryable failure that never succeeds)."""
    import os

    from seedance_tasks.notifiers import post_webhook, send_email

    name = os.fsdecode(b"lake/p=\xff")
    if through == "webhook":
        with webhook_server() as (received, url):
            post_webhook(url, f"quarantined {name}")
        assert received[0]["json"]["text"] == "quarantined lake/p=\\xff"
        return
    with smtp_server() as (inbox, port):
        settings = _mail_settings(through, port, monkeypatch)
        send_email(["owner@example.com"], f"quarantined {name}", f"file {name} was quarantined", settings)
    [mail] = inbox.messages
    assert mail.subject == "quarantined lake/p=\\xff" and "file lake/p=\\xff was quarantined" in mail.body


@pytest.mark.parametrize("name", [
    "[Confirm here](https://evil.example)", "![x](https://tracker.example/p.gif)", "<img src=x onerror=alert(1)>",
    "**bold** _it_ `code` # heading", "team\n\n# Approve now", "a\\b*c", "<https://evil.example>",
])
def test_a_name_from_data_in_markdown_is_shown_as_itself_never_as_markup(name):
    from html import escape as html_escape

    from markdown_it import MarkdownIt

    from seedance_tasks.cost.actions import _confirmation_body
    from seedance_tasks.notifiers import markdown_literal, one_line

    html = MarkdownIt("gfm-like", {"linkify": False}).render(f"**{markdown_literal(name)}** is charged")
    assert "<a " not in html and "<img" not in html and "<h1" not in html and "<code" not in html
    assert "<em>" not in html and html.count("<strong>") == 1
    shown = MarkdownIt("commonmark").render(markdown_literal(name))  # the text a person reads: the name itself
    assert shown == f"<p>{html_escape(one_line(name), quote=False)}</p>\n"
    body = _confirmation_body("2026-10", name, {"charges": {name: {"USD": "12.5"}}, "idle": [
        {"owner": name, "resource_id": "i-1](https://evil.example)"}]},
        {"deduct_day": "2026-11-04", "confirm_by": "2026-11-03T12:00:00+00:00"})
    rendered = MarkdownIt("gfm-like", {"linkify": False}).render(body)
    assert "<a " not in rendered and "<img" not in rendered


@pytest.mark.parametrize("through", ["smtplib", "smtp connection"])
def test_a_long_evidence_line_wraps_in_the_html_mail_and_the_text_is_unchanged(monkeypatch, through):
    """Mail clients ignore stylesheets: a bare `<pre>` ran a long line (a finding's JSON evidence) off
    screen. The HTML body wraps by an inline style; the text itself (and the plain-text mail) is as written."""
    from seedance_tasks.notifiers import send_email

    evidence = "evidence: " + json.dumps({f"s3://lake/table/p={i}/part-{i:05}.parquet": i for i in range(40)})
    text = f"egress rose 80% <b>owner</b> & co\n{evidence}\nfirst seen 2026-03-01"
    with smtp_server() as (inbox, port):
        settings = _mail_settings(through, port, monkeypatch)
        send_email(["owner@example.com"], "finding", text, settings)
    [mail] = inbox.messages
    if through == "smtplib":
        assert mail.body.replace("\r\n", "\n").rstrip("\n") == text
        return
    from html import escape

    style = mail.body.split("<pre style=\"", 1)[1].split("\"", 1)[0]
    assert "white-space:pre-wrap" in style and "overflow-wrap:anywhere" in style
    assert f">{escape(text)}</pre>" in mail.body and "<b>" not in mail.body
