"""Surviving interruptions: SIGTERM and the EC2 spot notice, and the Young-Daly checkpoint interval.

`InterruptWatcher` notes a SIGTERM (Kubernetes eviction, Slurm preemption, a stopped Airflow task)
and polls the EC2 instance metadata service (IMDSv2: a PUT for a session token, then
`GET /latest/meta-data/spot/instance-action` with it; 404 means no notice) for a spot
interruption notice. It only raises a flag: the trainer finishes the step it is in, all ranks
agree on it (the flag travels in the step's all-reduce), rank 0 saves with `save_async` and
waits, and every rank exits with `INTERRUPTED_EXIT` (75, EX_TEMPFAIL), which torchrun restarts
and the Airflow task retries.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import re
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

INTERRUPTED_EXIT = 75  # EX_TEMPFAIL: try again later
TOKEN_PATH = "/latest/api/token"
NOTICE_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
_TOKEN_RE = re.compile(r"[\x21-\x7e]{1,4096}")
_MAX_ANSWER_BYTES = 65536  # a notice is ~60 bytes, a token ~56

log = logging.getLogger("seedance.training")


class InterruptWatcher:
    """Flags an interruption: SIGTERM (after `install()`), or a spot notice found by polling
    `endpoint` every `poll_interval` seconds (None: no polling). `reason` is None until then."""

    def __init__(self, endpoint: str | None = None, poll_interval: float = 5.0, timeout: float = 1.0,
                 token_ttl: int = 21600, give_up_after: int = 3) -> None:
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self.poll_interval, self.timeout, self.token_ttl = poll_interval, timeout, token_ttl
        self.give_up_after = give_up_after
        self.reason: str | None = None
        self.notice: dict[str, Any] | None = None
        self.polls = 0
        self.imds_state = "off" if not endpoint else "starting"
        self._stop = threading.Event()
        self._token: str | None = None
        self._thread: threading.Thread | None = None
        self._previous = None

    def install(self) -> InterruptWatcher:
        """Catch SIGTERM (main thread only) and start polling for a spot notice."""
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.endpoint:
            self._thread = threading.Thread(target=self._poll_loop, name="seedance-spot-notice", daemon=True)
            self._thread.start()
        return self

    def _on_sigterm(self, signum, frame) -> None:
        if self.reason is None:
            self.reason = "SIGTERM"

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """(status, body) of one request; OSError for anything that is not an HTTP answer (no
        service, a garbled status line, an endpoint that is not an http:// URL)."""
        try:
            request = urllib.request.Request(self.endpoint + path, method=method, headers=headers)
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 - configured endpoint
                return response.status, response.read(_MAX_ANSWER_BYTES)
        except urllib.error.HTTPError as error:
            return error.code, error.read(_MAX_ANSWER_BYTES) if error.fp else b""
        except (http.client.HTTPException, ValueError) as error:
            what = f"{type(error).__name__}: {str(error).strip()[:200]}"
            raise OSError(f"not an HTTP answer from {self.endpoint}: {what}") from None

    def _fetch_token(self) -> str:
        status, body = self._request("PUT", TOKEN_PATH, {TOKEN_TTL_HEADER: str(self.token_ttl)})
        if status != 200:
            raise OSError(f"IMDSv2 token request answered {status}")
        token = body.decode("ascii", errors="replace").strip()
        if not _TOKEN_RE.fullmatch(token):  # it goes into a header: printable ASCII, no blanks
            raise OSError(f"IMDSv2 token request answered something that is not a token: {body[:60]!r}")
        return token

    def poll_once(self) -> dict[str, Any] | None:
        """One IMDSv2 round trip: the spot notice (an instance-action JSON object with an `action`)
        or None (404). Raises OSError when the endpoint cannot be reached or answers anything else
        (a garbled answer, a 200 that is not a notice: never taken for an interruption)."""
        if self._token is None:
            self._token = self._fetch_token()
        status, body = self._request("GET", NOTICE_PATH, {TOKEN_HEADER: self._token})
        if status == 401:  # the token expired: a new one, once
            self._token = self._fetch_token()
            status, body = self._request("GET", NOTICE_PATH, {TOKEN_HEADER: self._token})
        self.polls += 1
        if status == 404:
            return None
        if status != 200:
            raise OSError(f"spot notice request answered {status}")
        try:
            notice = json.loads(body)
        except ValueError:
            notice = None
        if not isinstance(notice, dict) or not isinstance(notice.get("action"), str):
            raise OSError(f"spot notice request answered 200 without an instance-action notice: {body[:80]!r}")
        return notice

    def _poll_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                notice = self.poll_once()
                failures, self.imds_state = 0, "polling"
                if notice is not None:
                    self.notice = notice
                    if self.reason is None:
                        self.reason = "spot-notice"
                    return
            except OSError as error:  # URLError, timeouts, refused: not on EC2, or IMDS hiccups
                failures += 1
                self._token = None
                if self.imds_state != "polling" and failures >= self.give_up_after:
                    self.imds_state = f"unreachable ({error})"
                    log.info("no instance metadata service at %s (%s): not polling for spot notices",
                             self.endpoint, error)
                    return
            self._stop.wait(self.poll_interval)

    def close(self) -> None:
        """Stop polling and give SIGTERM back to its previous handler."""
        self._stop.set()
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


def young_daly(save_cost_s: float, mtbf_s: float, step_seconds: float, *, max_steps: int | None = None) -> dict:
    """The Young-Daly optimum checkpoint interval sqrt(2 x save cost x MTBF), in seconds and in
    steps (at least 1, at most `max_steps`), with its inputs."""
    interval_s = math.sqrt(2.0 * max(0.0, save_cost_s) * max(0.0, mtbf_s))
    steps = max(1, round(interval_s / step_seconds)) if step_seconds > 0 else 1
    if max_steps:
        steps = min(steps, max_steps)
    return {"mode": "young-daly", "interval_s": round(interval_s, 3), "interval_steps": int(steps),
            "save_cost_s": round(save_cost_s, 6), "mtbf_s": round(mtbf_s, 3), "step_seconds": round(step_seconds, 6)}


def _seconds(value: Any) -> float | None:
    """A duration from a metrics record: a finite number >= 0, else None (a damaged field)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def mtbf_from_history(metrics: str | Path, configured_s: float) -> dict[str, Any]:
    """The MTBF to plan with: the run's observed exposure / interruptions (from its metrics file,
    read before this attempt starts: every earlier start without a finish was cut short), else
    `configured_s`; plus
    the save stalls its earlier checkpoints measured (`save_stalls`)."""
    from seedance_tasks.training.launch import metrics_records

    starts, finishes, exposure, stalls = 0, 0, 0.0, []
    for item in metrics_records(metrics)[0]:
        if item.get("event") == "start":
            starts += 1
        elif item.get("event") == "finish":
            finishes += 1
        elif item.get("event") == "checkpoint" and _seconds(item.get("stall_s")) is not None:
            stalls.append(_seconds(item["stall_s"]))
        elif "event" not in item:
            exposure += _seconds(item.get("seconds")) or 0.0
    failures = max(0, starts - finishes)  # read before this attempt starts: every unfinished one was cut short
    found = {"failures": failures, "exposure_s": round(exposure, 3), "save_stalls": stalls}
    if failures:
        return {"mtbf_s": exposure / failures, "mtbf_source": "observed", **found}
    return {"mtbf_s": float(configured_s), "mtbf_source": "configured", **found}
