"""Real Airflow services (API server, scheduler, DAG processor, Celery worker...) as subprocesses,
for the tests that need a scheduler: `dag.test()` cannot run backfills or remote executors."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

AIRFLOW = str(Path(sys.executable).parent / "airflow")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(process: subprocess.Popen, grace_s: float = 10) -> None:
    """TERM `process`, KILL it if it is still there after `grace_s`; returns once it is gone."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def standalone_env(home: Path, dags: Path, port: int) -> dict[str, str]:
    """The environment of Airflow services with their own home, DAGs folder and API port (LocalExecutor,
    SQLite), free of the test session's Airflow, Seedance and AWS settings; DAGs start unpaused."""
    repo = Path(__file__).resolve().parents[1]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AIRFLOW", "SEEDANCE__", "AWS_"))}
    env.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "SEEDANCE_CONFIG": str(repo / "config" / "seedance.yaml"),
    })
    return env


def admin_token(home: Path, port: int) -> str:
    """A JWT for the simple auth manager's generated admin, from the API server on `port`."""
    passwords = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/auth/token", method="POST",
        data=json.dumps({"username": "admin", "password": passwords["admin"]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["access_token"]


class AirflowServices:
    """Airflow commands and long-running services sharing one environment and home."""

    def __init__(self, home: Path, env: dict[str, str]):
        self.home = home
        self.env = env
        self.processes: list[subprocess.Popen] = []
        self._logs: list = []

    def airflow(self, *args: str, timeout: float = 300) -> str:
        """Run `airflow ARGS`; its stdout, or RuntimeError with the output's tail."""
        out = subprocess.run([AIRFLOW, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return out.stdout

    def json(self, *args: str):
        """The JSON document an `airflow ... --output json` command prints (log lines skipped)."""
        lines = self.airflow(*args, "--output", "json").splitlines()
        for index, line in enumerate(lines):
            if line.startswith(("[", "{")):
                return json.loads("\n".join(lines[index:]))
        return []

    def start(self, name: str, *args: str) -> None:
        """Start `airflow ARGS` in its own session, logging to HOME/NAME.log."""
        log = open(self.home / f"{name}.log", "w")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        self.processes.append(
            subprocess.Popen([AIRFLOW, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        )

    def wait_healthy(self, port: int, timeout: float = 120) -> None:
        """Wait until the API server on `port` answers its health check."""

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5) as response:
                    return response.status == 200
            except OSError:
                return False

        self.wait_until(healthy, timeout, "the API server to come up")

    def wait_until(self, predicate, timeout: float, what: str, interval: float = 2):
        """The first truthy `predicate()`; fails if a service dies or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            for process in self.processes:
                if process.poll() is not None:
                    raise AssertionError(f"an Airflow service died while waiting for {what}; logs in {self.home}")
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; logs in {self.home}:\n{self.tail()}")

    def tail(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-2500:]}" for log in sorted(self.home.glob("*.log")))

    def stop(self) -> None:
        """TERM every service's process group, KILL what is still there after 20 s."""
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 20
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        for log in self._logs:
            log.close()
