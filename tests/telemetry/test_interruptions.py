"""The interruption watcher (SIGTERM, the IMDSv2 spot notice) and the Young-Daly interval."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import time

import pytest

from seedance_tasks.training.resilience import InterruptWatcher, mtbf_from_history, young_daly
from tests.telemetry.imds_server import ImdsServer

NOTICE = {"action": "terminate", "time": "2026-01-01T00:02:00Z"}


def _wait(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_spot_notice_through_imdsv2_token_and_instance_action():
    with ImdsServer() as imds:
        watcher = InterruptWatcher(imds.endpoint, poll_interval=0.05)
        assert watcher.poll_once() is None  # 404: no notice yet
        assert watcher.poll_once() is None
        assert [method for method, path, status in imds.requests] == ["PUT", "GET", "GET"]  # one token, reused
        imds.tokens.clear()  # the token expired: 401, a new token, the same question again
        imds.notice = NOTICE
        assert watcher.poll_once() == NOTICE
        assert [status for _method, _path, status in imds.requests[-3:]] == [401, 200, 200]

        polling = InterruptWatcher(imds.endpoint, poll_interval=0.05)
        imds.notice = None
        polling.install()
        try:
            assert _wait(lambda: polling.polls >= 2) and polling.reason is None
            imds.notice = NOTICE
            assert _wait(lambda: polling.requested)
            assert polling.reason == "spot-notice" and polling.notice == NOTICE
        finally:
            polling.close()


def test_no_metadata_service_stops_polling():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed
    watcher = InterruptWatcher(f"http://127.0.0.1:{port}", poll_interval=0.01, give_up_after=3).install()
    try:
        assert _wait(lambda: watcher.imds_state.startswith("unreachable"))
        assert watcher.reason is None and watcher.polls == 0
    finally:
        watcher.close()


def test_sigterm_raises_the_flag_instead_of_killing():
    previous = signal.getsignal(signal.SIGTERM)
    watcher = InterruptWatcher(None).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert _wait(lambda: watcher.requested, timeout=5)
        assert watcher.reason == "SIGTERM"
    finally:
        watcher.close()
    assert signal.getsignal(signal.SIGTERM) is previous


def test_young_daly_interval_and_its_inputs():
    planned = young_daly(2.0, 3600.0, 0.5)
    assert planned["interval_s"] == pytest.approx(math.sqrt(2 * 2.0 * 3600))  # 120 s
    assert planned["interval_steps"] == 240 and planned["save_cost_s"] == 2.0 and planned["mtbf_s"] == 3600
    assert young_daly(2.0, 3600.0, 0.5, max_steps=100)["interval_steps"] == 100
    assert young_daly(0.0, 3600.0, 0.5)["interval_steps"] == 1  # a free save: every step


def test_mtbf_comes_from_the_runs_history_once_it_has_one(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    assert mtbf_from_history(metrics, 7200)["mtbf_source"] == "configured"
    lines = [{"event": "start", "attempt": 0}, {"step": 1, "seconds": 30.0}, {"step": 2, "seconds": 30.0},
             {"event": "checkpoint", "step": 2, "stall_s": 0.25},
             {"event": "start", "attempt": 1}, {"step": 3, "seconds": 40.0},
             {"event": "start", "attempt": 2}, {"step": 3, "seconds": 20.0}]
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    history = mtbf_from_history(metrics, 7200)
    assert history["mtbf_source"] == "observed" and history["failures"] == 3  # three attempts, none finished
    assert history["mtbf_s"] == pytest.approx(120.0 / 3) and history["save_stalls"] == [0.25]
    with metrics.open("a") as handle:
        handle.write(json.dumps({"event": "finish"}) + "\n")
    assert mtbf_from_history(metrics, 7200)["failures"] == 2


def _raw_server(answer: bytes):
    """A loopback server that answers every request with `answer`, as bytes on the wire."""
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            with client:
                client.recv(65536)
                client.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return server, f"http://127.0.0.1:{server.getsockname()[1]}"


@pytest.mark.parametrize("answer", [
    b"HELLO\r\n\r\n",  # not HTTP at all
    b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n\xff\xfe\xfd\xfc",  # a token that is not text
    b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc\r\nX: y",  # a token that would split its header
    b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n<html>hi</html>",  # a 200 that is no notice
    b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]',
])
def test_a_malformed_imds_answer_is_never_an_interruption_and_never_kills_the_poller(answer):
    server, endpoint = _raw_server(answer)
    try:
        with pytest.raises(OSError):
            InterruptWatcher(endpoint).poll_once()
        watcher = InterruptWatcher(endpoint, poll_interval=0.01, give_up_after=3).install()
        try:
            assert _wait(lambda: watcher.imds_state.startswith("unreachable"))
            assert watcher.reason is None and watcher.notice is None
        finally:
            watcher.close()
    finally:
        server.close()


def test_an_endpoint_that_is_not_a_url_stops_polling_instead_of_raising():
    watcher = InterruptWatcher("169.254.169.254", poll_interval=0.01, give_up_after=2).install()
    try:
        assert _wait(lambda: watcher.imds_state.startswith("unreachable"))
        assert "not an HTTP answer" in watcher.imds_state and watcher.reason is None
    finally:
        watcher.close()
