"""The metrics paths (a real Prometheus loaded by promtool, Parquet from import-metrics), the CLI,
and the DAG: skipped rules, outputs, e-mail and webhook on loopback, Asset events, re-runs."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import pytest

from seedance_tasks.signals.audit import evaluate_rule
from tests.airflow_services import free_port
from tests.prometheus_support import MISSING, load_openmetrics, prometheus_server
from tests.signals.builders import NIGHT, inputs

SEEDANCE = [sys.executable, "-m", "seedance_tasks.cli"]


def _history_text() -> str:
    """30 days of DCGM GPU utilisation of two jobs, every 5 min; job a dips to 30% tonight for 1 h."""
    start = datetime(NIGHT.year, NIGHT.month, NIGHT.day, tzinfo=UTC) - timedelta(days=29)
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for job, usual in (("a", 80), ("b", 70)):  # OpenMetrics keeps each series' samples together
        for i in range(30 * 288):
            dip = job == "a" and 29 * 288 + 36 <= i < 29 * 288 + 48
            ts = int(start.timestamp() + i * 300)
            lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-{job}",job="{job}"}} {30 if dip else usual} {ts}')
    return "\n".join(lines) + "\n# EOF\n"


@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_prometheus_and_parquet_paths_agree(tmp_path):
    text = _history_text()
    load_openmetrics(text, tmp_path / "tsdb")
    (tmp_path / "history.om").write_text(text)
    done = subprocess.run([*SEEDANCE, "signals", "import-metrics", str(tmp_path / "history.om"), "--out",
                           str(tmp_path / "samples.parquet"), "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["samples"] == 2 * 30 * 288
    parquet = evaluate_rule("gpu-util-drop", NIGHT, inputs(metrics_uri=str(tmp_path / "samples.parquet")))
    with prometheus_server(tmp_path / "tsdb") as prom:
        served = evaluate_rule("gpu-util-drop", NIGHT, inputs(metrics_uri=prom.url))
    assert [f["key"] for f in served["findings"]] == ["a"]
    assert served["findings"][0]["evidence"]["longest_low_seconds"] == 3600
    assert served["findings"] == parquet["findings"]


def test_import_metrics_refuses_bad_text(tmp_path):
    (tmp_path / "bad.txt").write_text("DCGM_FI_DEV_GPU_UTIL{gpu=0} eighty\n")
    done = subprocess.run([*SEEDANCE, "signals", "import-metrics", str(tmp_path / "bad.txt"), "--out",
                           str(tmp_path / "x.parquet")], capture_output=True, text=True)
    assert done.returncode != 0
    assert "bad.txt" in done.stderr and "hint:" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("text, line", [
    ('up 1\nDCGM_FI_DEV_GPU_UTIL{gpu="1" 70\nup 2\n', 2),  # Prometheus text: an unclosed label set
    ("a 1\nb 2\nc 3 noon\n", 3),  # a timestamp that is not a number
    ('# TYPE a counter\na_total 1\na_total{x="1"} 2 \n# EOF\n', 3),  # OpenMetrics: a trailing space
    ("a 1\n# EOF\nb 2\n", 3),  # a sample after # EOF
    ("up 1 1\nup 2 9999999999999999999999\n", 2),  # a timestamp no datetime holds (was an OverflowError)
    ("up 1 1\nup 2 99999999999999999\n", 2),  # one past year 9999 (was written, then unreadable)
])
def test_import_metrics_names_the_line_it_refuses(tmp_path, text, line):
    from seedance_tasks.errors import InputError
    from seedance_tasks.signals.sources import import_openmetrics

    source = tmp_path / "scrape.txt"
    source.write_text(text)
    with pytest.raises(InputError) as caught:
        import_openmetrics(str(source), str(tmp_path / "x.parquet"))
    assert caught.value.message.startswith(f"{source}:{line}: not OpenMetrics/Prometheus text")
    assert repr(text.splitlines()[line - 1]) in caught.value.message and caught.value.hint
    assert not (tmp_path / "x.parquet").exists()


def test_imported_counters_keep_the_names_they_are_exposed_under(tmp_path):
    """prometheus_client renames a Prometheus-text counter `NAME` to `NAME_total`; a Prometheus
    server (and a rule) knows it as exposed, e.g. DCGM's DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION."""
    import pyarrow.parquet as pq

    from seedance_tasks.signals.sources import import_openmetrics

    source = tmp_path / "dcgm.prom"
    source.write_text('# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n'
                      'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"} 5000\n'
                      '# TYPE node_cpu_seconds_total counter\nnode_cpu_seconds_total{cpu="0"} 7\n')
    result = import_openmetrics(str(source), str(tmp_path / "x.parquet"))
    assert result["metrics"] == ["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "node_cpu_seconds_total"]
    assert sorted(pq.read_table(tmp_path / "x.parquet").column("name").to_pylist()) == result["metrics"]
    openmetrics = tmp_path / "om.txt"
    openmetrics.write_text('# TYPE a counter\na_total 1\n# EOF\n')
    assert import_openmetrics(str(openmetrics), str(tmp_path / "y.parquet"))["metrics"] == ["a_total"]


def test_cli_run_json_lists_every_rule(tmp_path):
    from seedance_tasks.signals.registry import RULES

    done = subprocess.run([*SEEDANCE, "signals", "run", "--date", "2024-10-30", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["date"] == "2024-10-30"
    assert [s["id"] for s in doc["signals"]] == list(RULES)
    assert all(s["fired"] is False and s["skipped"] for s in doc["signals"])
    bad = subprocess.run([*SEEDANCE, "signals", "run", "--date", "30/10/2024"], capture_output=True, text=True)
    assert bad.returncode == 2 and "YYYY-MM-DD" in bad.stderr


class _Webhook(http.server.BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def loopback(monkeypatch):
    """An aiosmtpd SMTP server and a webhook HTTP server on 127.0.0.1, and an Airflow SMTP connection."""
    from aiosmtpd.controller import Controller

    class Inbox:
        def __init__(self):
            self.messages = []

        async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
            self.messages.append((envelope.rcpt_tos, envelope.content.decode("utf-8", "replace")))
            return "250 OK"

    inbox = Inbox()
    smtp_port, http_port = free_port(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=smtp_port)
    controller.start()
    _Webhook.received = []
    server = http.server.HTTPServer(("127.0.0.1", http_port), _Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("AIRFLOW_CONN_SIGNALS_SMTP", json.dumps(
        {"conn_type": "smtp", "host": "127.0.0.1", "port": smtp_port,
         "extra": {"disable_tls": True, "disable_ssl": True}}))
    monkeypatch.setenv("SEEDANCE__SIGNALS__SMTP_CONN_ID", "signals_smtp")
    monkeypatch.setenv("SIGNALS_WEBHOOK", f"http://127.0.0.1:{http_port}/hook")
    monkeypatch.setenv("SEEDANCE__SIGNALS__WEBHOOK_ENV", "SIGNALS_WEBHOOK")
    monkeypatch.setenv("SEEDANCE__SIGNALS__DEFAULT_CONTACT", "data-team@example.com")
    yield inbox, _Webhook.received
    server.shutdown()
    controller.stop()


def _small_lake(tmp_path):
    lake = tmp_path / "lake" / "day=1"
    lake.mkdir(parents=True)
    for index in range(10):
        (lake / f"part-{index}.parquet").write_bytes(b"p" * 4096)
    return tmp_path / "lake"


def test_dag_small_files_mail_webhook_asset_event_once(run_dag, tmp_path, loopback):
    """Two real DAG runs of one night: the first announces and triggers, the re-run changes nothing."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    from seedance_tasks.dag_support import read_xcom
    from seedance_tasks.signals.registry import RULES

    inbox, hooks = loopback
    lake = _small_lake(tmp_path)
    conf = {"date": "2024-10-30", "out": str(tmp_path / "out"), "lakes": [str(lake)]}

    def events():
        with create_session() as session:
            return [event.extra for event in session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                    .filter(AssetModel.name == "seedance_signal_small_files")
                    if event.extra.get("date") == "2024-10-30"
                    and event.extra["targets"][0]["conf"]["uri"] == str(lake)]

    dag_run = run_dag("seedance_signals", conf)
    assert dag_run.state == "success"
    summary = read_xcom(dag_run, "publish")
    # the rules without inputs are skipped with their reason, never silently passed
    assert summary["fired"] == ["small-files"]
    assert set(summary["skipped"]) == set(RULES) - {"small-files"} and all(summary["skipped"].values())
    night = json.loads((tmp_path / "out/nights/2024-10-30/findings.json").read_text())
    assert {s["id"] for s in night["signals"] if s.get("skipped")} == set(summary["skipped"])
    first = (tmp_path / "out/nights/2024-10-30/findings.json").read_bytes()
    assert len(inbox.messages) == 1 and inbox.messages[0][0] == ["data-team@example.com"]
    assert "small-files" in inbox.messages[0][1]
    assert len(hooks) == 1 and "small-files" in hooks[0]["text"]
    [extra] = events()
    assert extra["targets"][0]["dag_id"] == "seedance_compaction"
    assert extra["targets"][0]["conf"] == {"uri": str(lake), "dry_run": True}
    assert extra["apply"] is False

    # a re-run of the night: same outputs, nothing sent or triggered twice
    dag_run = run_dag("seedance_signals", conf)
    assert dag_run.state == "success"
    assert (tmp_path / "out/nights/2024-10-30/findings.json").read_bytes() == first
    assert len(inbox.messages) == 1 and len(hooks) == 1 and len(events()) == 1
    assert read_xcom(dag_run, "notify") == {"sent": []}


def test_nights_persist_then_resolve_and_skipped_rules_stay_unconfirmed(tmp_path):
    """The audit over three nights (no DAG): a finding persists (first_seen kept, not announced
    again), a night that cannot look keeps it open, and a night where it is gone resolves it."""
    from datetime import timedelta

    import pyarrow.parquet as pq

    from seedance_tasks.signals.audit import open_findings, run_audit
    from seedance_tasks.signals.notify import to_announce

    lake, out = _small_lake(tmp_path), str(tmp_path / "out")
    assert open_findings(out) == []  # nothing audited yet
    with_lake = inputs(lakes=[str(lake)])
    first = run_audit(NIGHT, with_lake, out)
    [finding] = to_announce(first)
    assert (finding["change"], finding["first_seen"]) == ("new", "2024-10-30")

    second = run_audit(NIGHT + timedelta(days=1), inputs(lakes=[str(lake)]), out)
    [persisting] = [f for s in second["signals"] for f in s["findings"]]
    assert (persisting["id"], persisting["first_seen"], persisting["last_seen"], persisting["change"]) == (
        finding["id"], "2024-10-30", "2024-10-31", "persisting")
    assert to_announce(second) == [] and second["resolved"] == []
    [shown] = open_findings(out)  # what the dashboard lists
    assert (shown.id, shown.first_seen, shown.last_seen, shown.fix["dag_id"]) == (
        finding["id"], "2024-10-30", "2024-10-31", "seedance_compaction")

    blind = run_audit(NIGHT + timedelta(days=2), inputs(), out)  # no lake configured: small-files skipped
    [kept] = [f for s in blind["signals"] for f in s["findings"]]
    assert (kept["id"], kept["change"]) == (finding["id"], "unconfirmed") and blind["resolved"] == []

    for path in (lake / "day=1").iterdir():
        path.unlink()
    (lake / "day=1" / "big.parquet").write_bytes(b"p")
    gone = run_audit(NIGHT + timedelta(days=3), inputs(lakes=[str(lake)]), out)
    assert [f["id"] for s in gone["signals"] for f in s["findings"]] == [] and open_findings(out) == []
    assert [(f["id"], f["status"], f["last_seen"]) for f in gone["resolved"]] == [(finding["id"], "resolved", "2024-10-31")]
    parquet = pq.read_table(tmp_path / "out/nights/2024-11-02/findings.parquet").to_pylist()
    assert [(row["id"], row["status"]) for row in parquet] == [(finding["id"], "resolved")]


def test_the_scheduled_run_audits_the_whole_day_before_and_a_trigger_without_a_date_too(dagbag, monkeypatch):
    """The 04:30 run on day D audits D-1 (complete by then), never the 4.5 hours of D so far."""
    from datetime import date, datetime

    import airflow.sdk
    from airflow.sdk import CronDataIntervalTimetable
    from airflow.timetables.base import TimeRestriction
    from airflow.timetables.interval import CronDataIntervalTimetable as SchedulerTimetable

    from seedance_tasks.signals import airflow_tasks

    declared = dagbag.dags["seedance_signals"].timetable
    assert isinstance(declared, CronDataIntervalTimetable)
    timetable = SchedulerTimetable(declared.expression, declared.timezone)  # what the scheduler runs
    earliest = datetime(2026, 11, 10, 5, 0, tzinfo=UTC)
    scheduled = timetable.next_dagrun_info(last_automated_data_interval=None,
                                           restriction=TimeRestriction(earliest=earliest, latest=None, catchup=True))
    assert scheduled.run_after == datetime(2026, 11, 12, 4, 30, tzinfo=UTC)
    assert airflow_tasks._day({}, scheduled.logical_date) == date(2026, 11, 11)

    class _Run:
        run_after = datetime(2026, 11, 12, 10, 15, tzinfo=UTC)

    monkeypatch.setattr(airflow.sdk, "get_current_context", lambda: {"dag_run": _Run()})
    assert airflow_tasks._day({}, None) == date(2026, 11, 11)
    assert airflow_tasks._day({"date": "2026-11-03"}, None) == date(2026, 11, 3)


@pytest.mark.parametrize("try_number, max_tries, retried", [(1, 2, True), (2, 2, True), (3, 2, False), (1, 0, False)])
def test_a_source_down_fails_the_rule_task_while_airflow_has_retries_then_the_night_goes_on(
        tmp_path, monkeypatch, try_number, max_tries, retried):
    import airflow.sdk

    from seedance_tasks.errors import UnavailableError
    from seedance_tasks.signals import airflow_tasks

    class _Instance:
        pass

    instance = _Instance()
    instance.try_number, instance.max_tries = try_number, max_tries
    monkeypatch.setattr(airflow.sdk, "get_current_context", lambda: {"ti": instance})
    params = {"out": str(tmp_path / "out"), "metrics": "http://127.0.0.1:9"}  # nothing listens there
    night = {"date": "2026-11-11"}
    written = tmp_path / "out/nights/2026-11-11/rules/gpu-util-drop.json"
    if retried:
        with pytest.raises(UnavailableError, match="unreachable") as raised:
            airflow_tasks.evaluate_task("gpu-util-drop", night, params)
        assert "Airflow retries this rule" in raised.value.hint and not written.exists()
    else:
        summary = airflow_tasks.evaluate_task("gpu-util-drop", night, params)
        assert summary["skipped"].startswith("failed: ") and "unreachable" in summary["skipped"]
        assert json.loads(written.read_text())["error"]["retryable"] is True
