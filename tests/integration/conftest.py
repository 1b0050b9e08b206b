"""Airflow in many-machine mode, for real: Postgres metadata DB, CeleryExecutor with a Redis broker,
API server, scheduler, DAG processor and a Celery worker as separate processes on loopback.

Needs the PostgreSQL (127.0.0.1:5432, trust auth) and Redis (127.0.0.1:6379) that the
development machines and CI run; the test fails (not skips) when they are missing.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class AirflowCluster:
    """Airflow's services started as subprocesses sharing one environment."""

    def __init__(self, home: Path, database: str, redis_db: int):
        self.home = home
        self.port = _free_port()
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}",
            "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:6379/{redis_db}",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://postgres@127.0.0.1:5432/{database}",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__FERNET_KEY": "",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "SEEDANCE_CONFIG": str(REPO / "config" / "seedance.yaml"),
        }
        self.processes: list[subprocess.Popen] = []

    def airflow(self, *args: str, timeout: float = 300) -> str:
        out = subprocess.run(
            [str(BIN / "airflow"), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if out.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return out.stdout

    def start(self, name: str, *args: str) -> None:
        log = open(self.home / f"{name}.log", "w")
        self.processes.append(
            subprocess.Popen(
                [str(BIN / "airflow"), *args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def stop(self) -> None:
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

    def wait_until(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            for process in self.processes:
                if process.poll() is not None:
                    raise AssertionError(f"an Airflow service died while waiting for {what}; logs in {self.home}")
            time.sleep(2)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; logs in {self.home}:\n{self.tail()}")

    def tail(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-2500:]}" for log in sorted(self.home.glob("*.log")))

    def json(self, *args: str):
        """The JSON document an `airflow ... --output json` command prints (log lines skipped)."""
        lines = self.airflow(*args, "--output", "json").splitlines()
        for index, line in enumerate(lines):
            if line.startswith(("[", "{")):
                return json.loads("\n".join(lines[index:]))
        return []

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        for run in self.json("dags", "list-runs", dag_id):
            if run["run_id"] == run_id:
                return run["state"]
        return None


@pytest.fixture(scope="module")
def airflow_cluster(tmp_path_factory):
    """A many-machine Airflow on a fresh Postgres database and Redis, torn down afterwards."""
    import psycopg2

    database = f"seedance_af_{secrets.token_hex(4)}"
    admin = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres")
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{database}"')
    cluster = AirflowCluster(tmp_path_factory.mktemp("airflow-celery"), database, redis_db=7)
    try:
        cluster.airflow("db", "migrate", timeout=600)
        cluster.start("api-server", "api-server", "--port", str(cluster.port))
        cluster.start("scheduler", "scheduler")
        cluster.start("dag-processor", "dag-processor")
        cluster.start("worker", "celery", "worker", "--concurrency", "2")
        yield cluster
    finally:
        cluster.stop()
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.close()
