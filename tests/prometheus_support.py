"""A real Prometheus server on loopback for tests (Debian's `prometheus` and `promtool`).

Three calls, nothing else:

    load_openmetrics(text, data_dir)            # history into the storage, before start
    with prometheus_server(data_dir) as prom:   # started on a free 127.0.0.1 port, /-/ready
        prom.url                                # "http://127.0.0.1:PORT"
        prom.query_range("up", start, end, step)  # the `data.result` list of /api/v1/query_range

`prometheus_server(data_dir, scrape_targets=["127.0.0.1:9400"], scrape_interval="1s")` also
scrapes targets; `PrometheusServer` is the same as an object with `.start()` / `.stop()`.
Retention is 100 years, so history loaded with any past timestamps is kept and served.
Tests that need it skip when the binaries are absent (`make test` installs them with apt).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

from tests.airflow_services import free_port, stop_process

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
MISSING = None if PROMETHEUS and PROMTOOL else "prometheus/promtool not installed (apt-get install prometheus)"


def load_openmetrics(text: str, data_dir: Path) -> None:
    """Write OpenMetrics `text` (samples with timestamps in seconds, ending in `# EOF`) as TSDB
    blocks into `data_dir`, with `promtool tsdb create-blocks-from openmetrics`. Call it before the
    server over `data_dir` starts (a running server picks new blocks up only at its next reload).
    Raises RuntimeError with promtool's output if it refuses the text."""
    if not text.rstrip().endswith("# EOF"):
        text = text.rstrip("\n") + "\n# EOF\n"
    data_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".om", delete=False) as handle:
        handle.write(text)
    try:
        done = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "-q",
                               # hidden flag: a few large blocks instead of one per 2 h (12x a day)
                               "--max-block-duration=744h", handle.name,
                               str(data_dir)], capture_output=True, text=True, timeout=300)
    finally:
        Path(handle.name).unlink()
    if done.returncode != 0:
        raise RuntimeError(f"promtool refused the OpenMetrics text:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


class PrometheusServer:
    """One `prometheus` process over `data_dir`, on a free loopback port."""

    def __init__(self, data_dir: Path, scrape_targets: Iterable[str] = (), scrape_interval: str = "15s"):
        self.data_dir = Path(data_dir)
        self.scrape_targets = list(scrape_targets)
        self.scrape_interval = scrape_interval
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> PrometheusServer:
        """Start the server and wait until `/-/ready` answers 200 (RuntimeError with its log if not)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir.parent / f"prometheus-{self.port}.yml"
        scrape = [{"job_name": "targets", "static_configs": [{"targets": self.scrape_targets}]}] if self.scrape_targets else []
        config.write_text(json.dumps({"global": {"scrape_interval": self.scrape_interval}, "scrape_configs": scrape}))
        self._log = open(self.data_dir.parent / f"prometheus-{self.port}.log", "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={self.data_dir}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=36500d",
             "--log.level=warn"], stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"prometheus did not become ready:\n{Path(self._log.name).read_text()[-3000:]}")

    def query_range(self, query: str, start: float, end: float, step: str | float = "1h") -> list[dict]:
        """`/api/v1/query_range` through HTTP: the `data.result` list (series with `values`)."""
        params = urllib.parse.urlencode({"query": query, "start": start, "end": end, "step": step})
        with urllib.request.urlopen(f"{self.url}/api/v1/query_range?{params}", timeout=30) as response:
            return json.load(response)["data"]["result"]

    def stop(self) -> None:
        """TERM the server (KILL after 10 s) and close its log."""
        if self.process is not None:
            stop_process(self.process)
        if getattr(self, "_log", None):
            self._log.close()


@contextlib.contextmanager
def prometheus_server(data_dir: Path, scrape_targets: Iterable[str] = (), scrape_interval: str = "15s"
                      ) -> Iterator[PrometheusServer]:
    """A started `PrometheusServer` over `data_dir`, stopped on exit."""
    server = PrometheusServer(data_dir, scrape_targets, scrape_interval).start()
    try:
        yield server
    finally:
        server.stop()
