"""Airflow in many-machine mode, for real: Postgres metadata DB, CeleryExecutor with a Redis broker,
API server, scheduler, DAG processor and a Celery worker as separate processes on loopback.

Needs the PostgreSQL (127.0.0.1:5432, trust auth) and Redis (127.0.0.1:6379) that the
development machines and CI run; the test fails (not skips) when they are missing.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from tests.airflow_services import AirflowServices, free_port

REPO = Path(__file__).resolve().parents[2]


class AirflowCluster(AirflowServices):
    """Airflow's services on Postgres with a CeleryExecutor on Redis."""

    def __init__(self, home: Path, database: str, redis_db: int):
        self.port = free_port()
        super().__init__(home, {
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
        })

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
