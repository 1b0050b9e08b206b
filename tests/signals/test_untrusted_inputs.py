"""Inputs the audit does not control: metric samples with NaN/Inf, labels in any key order or
damaged, Prometheus answers that are not what the API promises, settings out of range, a night's
history damaged or beside stray folders. Each is named, never a traceback; the other rules go on."""

from __future__ import annotations

import http.server
import json
import threading
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seedance_tasks.errors import ConfigError, InputError, UnavailableError
from seedance_tasks.signals.audit import evaluate_rule, open_findings, run_audit
from seedance_tasks.signals.sources import SAMPLES, PrometheusMetrics
from tests.prometheus_support import MISSING, load_openmetrics, prometheus_server
from tests.signals.builders import NIGHT, counter, inputs, night_points, samples_file, settings

DIP = range(7 * 288 + 24, 7 * 288 + 40)  # tonight from 02:00, 80 minutes


def _util(i, poison=None):
    """80% for 7 days, 30% during DIP tonight; sample 5 (a week ago) is `poison` when given."""
    if poison is not None and i == 5:
        return poison
    return 30 if i in DIP else 80


def _lake(tmp_path):
    lake = tmp_path / "lake" / "day=1"
    lake.mkdir(parents=True)
    for index in range(10):
        (lake / f"part-{index}.parquet").write_bytes(b"p" * 4096)
    return str(tmp_path / "lake")


def _raw_samples(path, rows, value_type=pa.float64()):
    """A samples file written as another tool would: (unix s, name, labels text, value) rows as given."""
    table = pa.table({"timestamp": pa.array([int(ts * 1000) for ts, *_ in rows], pa.int64()).cast(SAMPLES.field(0).type),
                      "name": [row[1] for row in rows], "labels": [row[2] for row in rows],
                      "value": pa.array([row[3] for row in rows], value_type)})
    pq.write_table(table, path)
    return str(path)


# --------------------------------------------------------------------------- a rule that raises


def test_a_rule_that_raises_is_reported_and_the_other_rules_run(tmp_path, monkeypatch):
    from seedance_tasks.signals.registry import RULES

    out, lake = str(tmp_path / "out"), _lake(tmp_path)
    run_audit(NIGHT, inputs(lakes=[lake]), out)

    def broken(day, night_inputs):
        raise KeyError("created_at")

    monkeypatch.setattr(RULES["small-files"], "evaluate", broken)
    night = run_audit(NIGHT + timedelta(days=1), inputs(lakes=[lake]), out)
    signals = {signal["id"]: signal for signal in night["signals"]}
    assert list(signals) == list(RULES)
    failed = signals["small-files"]
    assert failed["skipped"].startswith("failed: missing key or column 'created_at'")
    assert failed["error"]["retryable"] is False and failed["error"]["hint"]
    [kept] = failed["findings"]  # it could not look: last night's finding stays open, unconfirmed
    assert kept["change"] == "unconfirmed" and night["resolved"] == []
    assert any(w.startswith("signal small-files failed, the other signals ran: missing key") for w in night["warnings"])
    assert all("skipped" in signals[rule_id] for rule_id in RULES)  # the others ran (skipped: no input)


def test_unreadable_metric_samples_fail_the_metric_rules_only(tmp_path):
    garbage = tmp_path / "metrics.parquet"
    garbage.write_bytes(b"PAR1 this is not parquet PAR1")
    night = run_audit(NIGHT, inputs(lakes=[_lake(tmp_path)], metrics_uri=str(garbage)))
    signals = {signal["id"]: signal for signal in night["signals"]}
    assert signals["small-files"]["fired"] is True
    assert signals["gpu-util-drop"]["skipped"].startswith(f"failed: {garbage}: unreadable metric samples")


# --------------------------------------------------------------------------- samples


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf"), None])
def test_a_non_finite_sample_is_no_measurement(tmp_path, poison):
    """One NaN (a failed read, a stale marker) or ±Inf or null among a week of samples used to make
    the baseline NaN (the rule silent) or crash a rule on Decimal(NaN)."""
    rows = [(ts, "DCGM_FI_DEV_GPU_UTIL", '{"gpu": "0", "job": "a"}', value)
            for ts, value in night_points(lambda i: _util(i, poison), start_days=7)]
    [finding] = evaluate_rule("gpu-util-drop", NIGHT, inputs(metrics_uri=_raw_samples(tmp_path / "m.parquet", rows)))[
        "findings"]
    assert finding["evidence"]["baseline_percent"] == 80.0
    assert finding["evidence"]["longest_low_seconds"] == len(DIP) * 300

    job = {"job": "j"}
    waits = counter(0.05)
    waits[50] = (waits[50][0], poison if poison is not None else float("nan"))
    metrics = samples_file(tmp_path / "t.parquet", [
        ("seedance_step_seconds_total", job, counter(1.0)),
        ("seedance_phase_seconds_total", {**job, "phase": "data"}, waits),
        ("seedance_loader_bytes_total", job, counter(1e9))])
    result = evaluate_rule("loader-throughput", NIGHT, inputs(metrics_uri=metrics))
    assert "skipped" not in result, result
    [slow] = result["findings"]
    assert slow["evidence"]["loader_gbps"] == 1.0 and 0.049 < slow["evidence"]["data_wait_share"] < 0.051


def test_labels_in_any_key_order_or_type_are_one_series(tmp_path):
    """Samples written by another tool: the same GPU with its label keys in another order, a number
    as a label value, or no labels at all; one series each, as Prometheus has them."""
    from seedance_tasks.signals.sources import ParquetMetrics

    start = datetime(NIGHT.year, NIGHT.month, NIGHT.day, tzinfo=UTC)
    rows = []
    for i in range(288):
        rows.append((start.timestamp() + i * 300, "DCGM_FI_DEV_GPU_UTIL",
                     '{"job": "j", "gpu": "0"}' if i % 2 else '{"gpu": "0", "job": "j"}', 80.0))
        rows.append((start.timestamp() + i * 300, "DCGM_FI_DEV_GPU_UTIL", '{"gpu": 1, "job": "j"}', 70.0))
        rows.append((start.timestamp() + i * 300, "DCGM_FI_DEV_GPU_UTIL", None, 60.0))
    metrics = ParquetMetrics(_raw_samples(tmp_path / "m.parquet", rows))
    found = metrics.series("DCGM_FI_DEV_GPU_UTIL", start, start + timedelta(days=1))
    assert [(item.labels, len(item.ts), float(item.values.mean())) for item in found] == [
        ({"gpu": "0", "job": "j"}, 288, 80.0), ({"gpu": "1", "job": "j"}, 288, 70.0), ({}, 288, 60.0)]
    assert all((item.ts[1:] > item.ts[:-1]).all() for item in found)


@pytest.mark.parametrize("labels", ["gpu=0", "[1]", "null"])
def test_labels_that_are_not_a_json_object_are_named(tmp_path, labels):
    path = _raw_samples(tmp_path / "m.parquet", [(ts, "DCGM_FI_DEV_GPU_UTIL", labels, 80.0)
                                                 for ts, _ in night_points(80, start_days=7)])
    result = evaluate_rule("gpu-util-drop", NIGHT, inputs(metrics_uri=path))
    assert result["skipped"] == f"failed: {path}: metric DCGM_FI_DEV_GPU_UTIL: labels {labels!r} are not a JSON object"
    assert result["error"]["hint"]


def test_a_samples_column_of_the_wrong_type_is_named(tmp_path):
    path = _raw_samples(tmp_path / "m.parquet", [(ts, "DCGM_FI_DEV_GPU_UTIL", "{}", "80")
                                                 for ts, _ in night_points(80)], pa.string())
    result = evaluate_rule("gpu-util-drop", NIGHT, inputs(metrics_uri=path))
    assert result["skipped"] == f"failed: {path}: metric samples column value is string, not a number"


def test_a_gpu_whose_series_split_counts_once(tmp_path):
    """A pod restart (or an exporter upgrade adding a label) splits one GPU's DCGM series in two:
    the money at stake is that of one GPU, not two."""
    first = ("DCGM_FI_DEV_GPU_UTIL", {"job": "a", "gpu": "0", "UUID": "GPU-1", "pod": "a-0"},
             night_points(_util, start_days=7)[: 7 * 288 + 30])
    second = ("DCGM_FI_DEV_GPU_UTIL", {"job": "a", "gpu": "0", "UUID": "GPU-1", "pod": "a-1"},
              night_points(_util, start_days=7)[7 * 288 + 30:])
    split = evaluate_rule("gpu-util-drop", NIGHT, inputs(metrics_uri=samples_file(tmp_path / "s.parquet", [first, second])))
    whole = evaluate_rule("gpu-util-drop", NIGHT, inputs(metrics_uri=samples_file(tmp_path / "w.parquet", [
        ("DCGM_FI_DEV_GPU_UTIL", {"job": "a", "gpu": "0", "UUID": "GPU-1"}, night_points(_util, start_days=7))])))
    assert split["findings"][0]["evidence"]["gpus"] == 1
    assert split["findings"][0]["at_stake"] == whole["findings"][0]["at_stake"]


# --------------------------------------------------------------------------- Prometheus answers


class _Answer(http.server.BaseHTTPRequestHandler):
    answer: tuple[int, bytes] = (200, b"")
    seen: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        self.seen.append(self.headers.get("Authorization"))
        code, body = self.answer
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def answering():
    """A loopback HTTP server answering every GET with `_Answer.answer`; yields its URL."""
    _Answer.seen = []
    server = http.server.HTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()


def _matrix(*series) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": list(series)}}).encode()


@pytest.mark.parametrize(("code", "body", "error", "text"), [
    (200, b"<html>Sign in to the proxy</html>", InputError, "the answer is not a Prometheus API answer"),
    (200, b"[1, 2]", InputError, "the answer is not a Prometheus API answer"),
    (200, b'{"status": "success"}', InputError, "the answer has no data"),
    (200, b'{"status": "success", "data": {"resultType": "vector", "result": []}}', InputError, "not a range result"),
    (200, _matrix({"metric": {"job": "a"}, "values": [[1, "eighty"]]}), InputError, "is not [time, \"number\"]"),
    (200, _matrix({"metric": "job=a", "values": []}), InputError, "a series of the answer is malformed"),
    (503, b'{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}',
     UnavailableError, "HTTP 503 timeout: query timed out"),
    (429, b"Too Many Requests", UnavailableError, "HTTP 429"),
    (422, b'{"status":"error","errorType":"execution","error":"query processing would load too many samples"}',
     InputError, "HTTP 422 execution: query processing would load too many samples"),
])
def test_prometheus_answers_that_are_not_a_range_result_are_named(answering, code, body, error, text):
    _Answer.answer = (code, body)
    start = datetime(NIGHT.year, NIGHT.month, NIGHT.day, tzinfo=UTC)
    with pytest.raises(error) as caught:
        PrometheusMetrics(f"http://{answering}").series("DCGM_FI_DEV_GPU_UTIL", start, start + timedelta(days=1))
    assert text in caught.value.message and caught.value.hint
    assert caught.value.message.startswith(f"Prometheus http://{answering}")


def test_prometheus_non_finite_samples_are_dropped(answering):
    _Answer.answer = (200, _matrix({"metric": {"__name__": "x", "job": "a"},
                                    "values": [[1, "NaN"], [2, "+Inf"], [3, "70"], [4, "-Inf"]]}))
    [series] = PrometheusMetrics(f"http://{answering}").series("x", datetime.fromtimestamp(0, UTC),
                                                                datetime.fromtimestamp(10, UTC))
    assert (series.labels, series.ts.tolist(), series.values.tolist()) == ({"job": "a"}, [3.0], [70.0])


def test_prometheus_credentials_are_sent_never_printed(answering):
    import base64

    _Answer.answer = (200, b'{"status": "success", "data": ["DCGM_FI_DEV_GPU_UTIL"]}')
    assert PrometheusMetrics(f"http://audit:s3cr%40t@{answering}").names() == {"DCGM_FI_DEV_GPU_UTIL"}
    assert _Answer.seen == ["Basic " + base64.b64encode(b"audit:s3cr@t").decode()]
    _Answer.answer = (401, b"Unauthorized")
    with pytest.raises(InputError) as refused:
        PrometheusMetrics(f"http://audit:s3cr3t@{answering}").names()
    with pytest.raises(UnavailableError) as down:
        PrometheusMetrics("http://audit:s3cr3t@127.0.0.1:1/?token=t0ken").names()
    for caught in (refused, down):
        assert "s3cr3t" not in str(caught.value) and "t0ken" not in str(caught.value) and "audit" not in str(caught.value)
    assert "HTTP 401" in refused.value.message and "127.0.0.1:1" in down.value.message


@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_a_nan_sample_served_by_prometheus_leaves_the_baseline_alone(tmp_path):
    """A real Prometheus stores and serves a NaN sample as it was scraped."""
    start = datetime(NIGHT.year, NIGHT.month, NIGHT.day, tzinfo=UTC) - timedelta(days=7)
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for i in range(8 * 288):
        value = _util(i, float("nan"))
        lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-a",job="a"}} {value} {int(start.timestamp()) + i * 300}')
    load_openmetrics("\n".join(lines) + "\n# EOF\n", tmp_path / "tsdb")
    with prometheus_server(tmp_path / "tsdb") as prom:
        result = evaluate_rule("gpu-util-drop", NIGHT, inputs(metrics_uri=prom.url))
    [finding] = result["findings"]
    assert finding["evidence"]["baseline_percent"] == 80.0


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize(("key", "value"), [
    ("TARGET_CPU_PERCENT", "0"), ("UTIL_DROP_PERCENT", "-5"), ("IDLE_IOPS_PERCENT", "150"),
    ("CRITICAL_DOLLARS", "-1"), ("GPU_HOUR_PRICE", "-2.5"), ("SURGE_K", "-3"), ("COLLECTIVE_TIMEOUT", "0"),
    ("SMALL_FILE_SIZE", "0"), ("OVERFLOW_PER_EPOCH", "-1"), ("CHECKPOINT_HOT_MAX_AGE", "0"),
    ("MEMORY_RESERVED_PERCENT", "100"), ("COLD_PRICE_PER_GB_MONTH", "0.5"), ("EGRESS_PATTERNS", '["(?i)data (out"]'),
])
def test_thresholds_out_of_range_are_refused_naming_the_key(monkeypatch, key, value):
    from seedance_tasks.config import load_section

    monkeypatch.setenv(f"SEEDANCE__SIGNALS__{key}", value)
    with pytest.raises(ConfigError) as caught:
        load_section("signals")
    assert "signals" in caught.value.message
    assert key.lower() in caught.value.message or "cold_price_per_gb_month" in caught.value.message


@pytest.mark.parametrize(("contacts", "default", "named"), [
    ('{"team-a": "not an address"}', None, "'team-a'"),
    ('{"team-a": "ops@example.com", "team-b": "a@b@c"}', None, "'team-b'"),
    ('{"team-a": ["ops@example.com"]}', None, "team-a"),
    ('{"  ": "ops@example.com"}', None, "'  '"),
    ('{"team-a": "a@example.com", " team-a ": "b@example.com"}', None, "given twice"),
    ("{}", "nobody", "default_contact"),
])
def test_a_malformed_contact_is_refused_at_load_naming_its_key(monkeypatch, contacts, default, named):
    from seedance_tasks.config import load_section

    monkeypatch.setenv("SEEDANCE__SIGNALS__CONTACTS", contacts)
    if default is not None:
        monkeypatch.setenv("SEEDANCE__SIGNALS__DEFAULT_CONTACT", default)
    with pytest.raises(ConfigError) as caught:
        load_section("signals")
    assert named in caught.value.message and "signals." in caught.value.message


def test_contacts_are_keyed_by_the_owner_as_tags_give_it():
    loaded = settings(contacts={" team-a ": " ops@example.com "}, default_contact=" all@example.com")
    assert loaded.contacts == {"team-a": "ops@example.com"} and loaded.default_contact == "all@example.com"


def test_a_right_sizing_target_of_zero_cannot_reach_a_rule():
    with pytest.raises(Exception, match="target_cpu_percent"):
        settings(target_cpu_percent="0")


# --------------------------------------------------------------------------- the nights' history


def _two_nights(tmp_path):
    out, lake = str(tmp_path / "out"), _lake(tmp_path)
    first = run_audit(NIGHT, inputs(lakes=[lake]), out)
    return out, lake, tmp_path / "out" / "nights" / NIGHT.isoformat() / "findings.json", first


@pytest.mark.parametrize("damage", ["truncated", "a list", "no signals"])
def test_a_damaged_previous_night_is_passed_over_with_a_warning(tmp_path, damage):
    out, lake, document, _ = _two_nights(tmp_path)
    (tmp_path / "out" / "nights" / "2024-10-29").mkdir()  # an older night, readable, empty
    (tmp_path / "out" / "nights" / "2024-10-29" / "findings.json").write_text(
        json.dumps({"date": "2024-10-29", "signals": [], "resolved": []}))
    text = document.read_text()
    document.write_text({"truncated": text[: len(text) // 2], "a list": "[]", "no signals": '{"date": 1}'}[damage])
    night = run_audit(NIGHT + timedelta(days=1), inputs(lakes=[lake]), out)
    assert [f["change"] for s in night["signals"] for f in s["findings"]] == ["new"]
    assert any(w.startswith(f"{document}: ") and "passed over" in w for w in night["warnings"])
    assert [f.id for f in open_findings(out)] == [f"small-files:{lake}"]
    document.write_text(text[:10])  # the latest readable night is what the dashboard shows
    (tmp_path / "out" / "nights" / "2024-10-31" / "findings.json").write_text("{")
    assert open_findings(out) == []


@pytest.mark.parametrize("change", [
    lambda f: f.pop("last_seen"), lambda f: f.update(severity="urgent"), lambda f: f.update(at_stake="lots"),
    lambda f: f.update(first_seen="yesterday"), lambda f: f.pop("evidence"),
])
def test_a_malformed_finding_of_the_previous_night_is_left_out(tmp_path, change):
    out, lake, document, _ = _two_nights(tmp_path)
    night = json.loads(document.read_text())
    good = night["signals"][[s["id"] for s in night["signals"]].index("small-files")]["findings"][0]
    broken = json.loads(json.dumps(good))
    broken["key"] = "s3://other-lake"
    change(broken)
    night["signals"][[s["id"] for s in night["signals"]].index("small-files")]["findings"].append(broken)
    document.write_text(json.dumps(night))
    second = run_audit(NIGHT + timedelta(days=1), inputs(lakes=[lake]), out)
    assert [(f["id"], f["change"]) for s in second["signals"] for f in s["findings"]] == [(good["id"], "persisting")]
    assert second["resolved"] == []
    assert any("1 malformed finding(s) of the night of 2024-10-30 left out" in w for w in second["warnings"])
    assert [f.id for f in open_findings(out)] == [good["id"]]


def test_folders_beside_the_nights_are_not_nights(tmp_path):
    """A copy (`2024-10-30.bak`) sorts between two nights and a `latest` folder after them all:
    neither is the previous night, nor the latest one the dashboard shows."""
    out, lake, document, first = _two_nights(tmp_path)
    for stray in ("2024-10-30.bak", "latest"):
        (tmp_path / "out" / "nights" / stray).mkdir()
        (tmp_path / "out" / "nights" / stray / "findings.json").write_text(
            json.dumps({"date": stray, "signals": [], "resolved": []}))
    second = run_audit(NIGHT + timedelta(days=1), inputs(lakes=[lake]), out)
    [finding] = [f for s in second["signals"] for f in s["findings"]]
    assert (finding["change"], finding["first_seen"]) == ("persisting", "2024-10-30")
    assert [f.id for f in open_findings(out)] == [finding["id"]]


# --------------------------------------------------------------------------- notifications


def test_a_key_with_a_newline_cannot_add_a_mail_header():
    from seedance_tasks.signals.notify import message

    finding = {"id": "gpu-util-drop:a", "signal": "gpu-util-drop", "key": "a\r\nBcc: everyone@example.com",
               "severity": "warning", "change": "new", "summary": "s", "at_stake": "1.00", "currency": "USD",
               "evidence": {}, "fix": None, "first_seen": "2024-10-30", "last_seen": "2024-10-30"}
    subject, _ = message(finding)
    assert "\n" not in subject and "\r" not in subject
    assert subject.endswith("a Bcc: everyone@example.com")


def test_overlapping_sample_files_count_a_counter_once(tmp_path):
    """Two imports of overlapping scrapes in one folder: each timestamp once, so a counter that
    stepped back within a duplicated timestamp is not taken for a reset."""
    start = datetime(NIGHT.year, NIGHT.month, NIGHT.day, tzinfo=UTC).timestamp()
    folder = tmp_path / "samples"
    folder.mkdir()
    job = '{"device": "nvme1n1", "volume_id": "vol-1"}'
    _raw_samples(folder / "a.parquet", [(start + i * 300, "node_disk_reads_completed_total", job, 1000.0 * i)
                                        for i in range(288)])
    _raw_samples(folder / "b.parquet", [(start + i * 300, "node_disk_reads_completed_total", job, 1000.0 * i - 1)
                                        for i in range(100, 288)])  # the same scrape, read a moment earlier
    from seedance_tasks.signals.sources import ParquetMetrics, increase

    [series] = ParquetMetrics(str(folder)).series("node_disk_reads_completed_total", datetime.fromtimestamp(start, UTC),
                                                   datetime.fromtimestamp(start + 86400, UTC))
    assert len(series.ts) == 288 and increase(series) == 287_000.0


def test_turning_apply_on_after_a_dry_run_triggers_the_fix_once_more(tmp_path):
    """A finding's fix runs dry first; once `signals.apply` is turned on, the persisting finding's
    fix is triggered again, applying, once; re-runs and later nights trigger nothing."""
    from seedance_tasks import storage
    from seedance_tasks.signals.notify import fix_targets

    out, lake = str(tmp_path / "out"), _lake(tmp_path)
    root = storage.resolve(out)

    def targets(night_day, lakes=(lake,), **changes):
        night = run_audit(night_day, inputs(settings=settings(**changes), lakes=list(lakes)), out)
        return [target["conf"] for target in fix_targets(night, "small-files", root)]

    assert targets(NIGHT) == [{"uri": lake, "dry_run": True}]
    assert targets(NIGHT) == []  # a re-run of the night
    assert targets(NIGHT + timedelta(days=1)) == []  # persisting, same fix
    assert targets(NIGHT + timedelta(days=2), apply=True) == [{"uri": lake, "dry_run": False}]
    assert targets(NIGHT + timedelta(days=2), apply=True) == []
    assert targets(NIGHT + timedelta(days=3), apply=True) == []
    assert targets(NIGHT + timedelta(days=4), lakes=(), apply=False) == []  # could not look: unconfirmed


def test_a_damaged_checkpoint_manifest_does_not_hide_the_rest_of_the_store(tmp_path):
    from seedance_tasks.checkpoint.catalog import manifest_path
    from seedance_tasks.checkpoint.store import existing_store
    from tests.signals.test_rules import _ages, _bloat, _checkpoint_store

    store, rows = _checkpoint_store(tmp_path, steps=(0, 10, 20))
    location = existing_store(store)
    damaged = location.uri_of(manifest_path(location, "r", 10))
    with open(damaged, "r+b") as handle:
        handle.truncate(20)
    result = _bloat(store, rows, checkpoint_hot_max_age=_ages(rows)[0] + 3600, checkpoint_max_per_run=1)
    assert "skipped" not in result, result
    [finding] = result["findings"]
    assert finding["evidence"]["checkpoints"] == 2  # steps 0 and 20, still audited
    [note] = result["warnings"]
    assert note.startswith("1 damaged manifest(s): ") and "left out of the audit" in note and "hint:" in note


def test_the_notify_and_fix_tasks_side_by_side_keep_each_others_records(tmp_path):
    """The DAG runs notify and the fix tasks at once after publish: notify's ledger, read before the
    fix task recorded its trigger and saved after its mails went out, must not drop that record
    (a re-run of the night would trigger the fix again), nor the other way round."""
    from seedance_tasks import storage
    from seedance_tasks.signals.notify import fix_targets, ledger

    night = run_audit(NIGHT, inputs(lakes=[_lake(tmp_path)]), str(tmp_path / "out"))
    root = storage.resolve(str(tmp_path / "out"))
    notifying = ledger(root)  # the notify task, sending
    assert len(fix_targets(night, "small-files", root)) == 1  # the fix task, meanwhile
    notifying.record("mail:small-files:x:warning:2024-10-30", {"to": "team@example.com"})
    assert fix_targets(night, "small-files", root) == []  # a re-run triggers nothing twice
    assert "mail:small-files:x:warning:2024-10-30" in ledger(root)


def test_a_training_log_path_that_does_not_exist_is_said_never_silent(tmp_path):
    """A typo in signals.training_logs used to read as "no collective waited" every night."""
    from tests.signals.builders import DATA

    missing = str(tmp_path / "logs" / "rank0.log")
    alone = evaluate_rule("allreduce-wait", NIGHT, inputs(logs=[missing]))
    assert alone["skipped"].startswith(f"no training log file at {missing}")
    (tmp_path / "empty").mkdir()
    assert evaluate_rule("allreduce-wait", NIGHT, inputs(logs=[str(tmp_path / "empty")]))["skipped"].startswith(
        "no training log file at ")
    real = str(DATA / "torch_watchdog_timeout_default_10min_basicsr737.log")
    night = run_audit(NIGHT, inputs(logs=[missing, real]))
    wait = next(signal for signal in night["signals"] if signal["id"] == "allreduce-wait")
    assert wait["fired"] and wait["warnings"] == [f"training log(s) not found, not read: {missing}\n"
                                                  "  hint: check signals.training_logs"]
    assert f"signal allreduce-wait: training log(s) not found, not read: {missing}" in "\n".join(night["warnings"])


def test_a_dataset_root_that_does_not_exist_is_said_never_silent(tmp_path):
    missing, lake = str(tmp_path / "no-such-lake"), _lake(tmp_path)
    alone = evaluate_rule("small-files", NIGHT, inputs(lakes=[missing]))
    assert alone["skipped"] == f"no dataset root found at {missing} (--lake or signals.lakes)"
    both = evaluate_rule("small-files", NIGHT, inputs(lakes=[missing, lake]))
    assert [f["key"] for f in both["findings"]] == [lake]
    assert both["warnings"] == [f"dataset root(s) not found, not read: {missing}\n  hint: check --lake / signals.lakes"]


def test_the_cli_runs_every_rule_writes_the_night_then_exits_non_zero_when_a_rule_failed(tmp_path):
    from typer.testing import CliRunner

    from seedance_tasks.cli import app

    missing, out = str(tmp_path / "billing.csv"), tmp_path / "out"
    result = CliRunner().invoke(app, ["signals", "run", "--date", NIGHT.isoformat(), "--billing", missing,
                                      "--lake", _lake(tmp_path), "--out", str(out), "--json"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    doc = json.loads(result.stdout)
    states = {s["id"]: ("failed" if s.get("error") else "fired" if s["fired"] else "other") for s in doc["signals"]}
    assert states["small-files"] == "fired" and states["cost-surge"] == "failed"
    assert (out / "nights" / NIGHT.isoformat() / "findings.json").is_file()
    assert ("warning: signals egress-jump, idle-provisioned-iops, idle-vcpu-spend, cost-surge, unallocated-share "
            f"failed, the other signals ran: no billing files (.csv, .csv.gz, .parquet) at {missing}") in result.stderr
    assert ("error: 5 signal(s) failed: egress-jump, idle-provisioned-iops, idle-vcpu-spend, cost-surge, "
            "unallocated-share; the other signals ran and the night is written") in result.stderr


@pytest.mark.parametrize("damage", ['{"mail:x": ', "[]"])
def test_a_damaged_ledger_is_named_not_silently_restarted(tmp_path, damage):
    from seedance_tasks import storage
    from seedance_tasks.signals.notify import fix_targets

    night = run_audit(NIGHT, inputs(lakes=[_lake(tmp_path)]), str(tmp_path / "out"))
    state = tmp_path / "out" / "_seedance" / "signals"
    state.mkdir(parents=True)
    (state / "sent.json").write_text(damage)
    with pytest.raises(InputError) as caught:
        fix_targets(night, "small-files", storage.resolve(str(tmp_path / "out")))
    assert caught.value.message.startswith(f"{state / 'sent.json'}: ") and caught.value.hint


def _stale_history(days_ago: int = 10) -> list[tuple[float, float]]:
    """30 days of DCGM GPU utilisation (80%) ending `days_ago` days before the night: the exporter stopped."""
    return night_points(80, NIGHT - timedelta(days=days_ago + 30), count=30 * 288)


def test_a_metric_without_a_sample_on_the_night_is_missing_not_silent(tmp_path):
    """An exporter that stopped weeks ago left its name in the store: the rules that need it are
    skipped as missing and the blind spot says so, instead of finding nothing every night."""
    metrics = samples_file(tmp_path / "m.parquet", [
        ("DCGM_FI_DEV_GPU_UTIL", {"job": "a", "gpu": "0", "UUID": "GPU-1"}, _stale_history()),
        ("DCGM_FI_DEV_FB_USED", {"job": "a", "gpu": "0", "UUID": "GPU-1"}, night_points(100))])
    result = evaluate_rule("gpu-util-drop", NIGHT, inputs(metrics_uri=metrics))
    assert result["skipped"] == "metrics missing: DCGM_FI_DEV_GPU_UTIL"
    blind = {f["key"]: f for f in evaluate_rule("metrics-blind-spot", NIGHT, inputs(metrics_uri=metrics))["findings"]}
    assert blind["gpu-util-drop"]["evidence"]["missing"] == ["DCGM_FI_DEV_GPU_UTIL"]
    assert "DCGM_FI_DEV_FB_USED" not in blind["gpu-memory-residency"]["evidence"]["missing"]
    a_night_with_it = evaluate_rule("gpu-util-drop", NIGHT - timedelta(days=15), inputs(metrics_uri=metrics))
    assert "skipped" not in a_night_with_it


@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_a_metric_prometheus_stopped_receiving_is_missing_on_the_night(tmp_path):
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    lines += [f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-1",job="a"}} {value} {int(ts)}' for ts, value in _stale_history()]
    load_openmetrics("\n".join(lines) + "\n# EOF\n", tmp_path / "tsdb")
    with prometheus_server(tmp_path / "tsdb") as prom:
        result = evaluate_rule("gpu-util-drop", NIGHT, inputs(metrics_uri=prom.url))
        earlier = evaluate_rule("gpu-util-drop", NIGHT - timedelta(days=15), inputs(metrics_uri=prom.url))
    assert result["skipped"] == "metrics missing: DCGM_FI_DEV_GPU_UTIL"
    assert "skipped" not in earlier, earlier
