"""Test environment: a private Airflow home on SQLite, a real S3 server on loopback, helpers.

Airflow reads its settings when first imported, so the environment is set here, at import time
of this file, before any test module imports airflow.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.airflow_services import free_port

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="seedance-airflow-"))
os.environ.update(
    {
        "AIRFLOW_HOME": str(_AIRFLOW_HOME),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "SEEDANCE_CONFIG": str(REPO / "config" / "seedance.yaml"),
    }
)
for _name in list(os.environ):  # a developer's own overrides must not change test outcomes
    if _name.startswith("SEEDANCE__"):
        del os.environ[_name]


# --------------------------------------------------------------------------- Airflow


@pytest.fixture(scope="session")
def airflow_db():
    """An initialised Airflow metadata DB (SQLite) in this session's private AIRFLOW_HOME."""
    from airflow.utils import db

    db.initdb()
    return _AIRFLOW_HOME


@pytest.fixture(scope="session")
def dagbag():
    """Every DAG in dags/, parsed the way the DAG processor parses them."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


@pytest.fixture
def run_dag(airflow_db, dagbag):
    """Run a DAG for real with `dag.test()`; returns the DagRun. Does not assert success itself."""

    def _run(dag_id: str, conf: dict | None = None, logical_date=None):
        import copy

        assert not dagbag.import_errors, dagbag.import_errors
        dag = dagbag.dags[dag_id]
        # dag.test() runs the tasks in this process, and merging a run's conf sets the values of
        # the tasks' own Param objects: without this, a key of one run's conf leaks into the next
        # run of the same DAG whose conf lacks it (the form's defaults would not be tested)
        saved = {task.task_id: copy.deepcopy(task.params) for task in dag.tasks}
        try:
            return dag.test(run_conf=conf or {}, logical_date=logical_date)
        finally:
            for task in dag.tasks:
                task.params = saved[task.task_id]

    return _run


def xcom_value(dag_run, task_id: str, key: str = "return_value", map_index: int = -1):
    """The XCom a task of `dag_run` pushed; fails the test if there is none."""
    from seedance_tasks.dag_support import read_xcom

    value = read_xcom(dag_run, task_id, key, map_index)
    if value is None:
        raise AssertionError(f"no XCom {key!r} from {task_id} in {dag_run.run_id}")
    return value


# --------------------------------------------------------------------------- S3 on loopback


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible HTTP server (moto_server) on 127.0.0.1, and the AWS env pointing at it.

    Its conditional writes are atomic, as S3's are (`tests/s3_atomic_server.py`)."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("s3_atomic_server.py")), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.1)
    saved = {key: os.environ.get(key) for key in _AWS_ENV}
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_PROFILE", None)
    yield endpoint
    server.terminate()
    server.wait(10)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


_AWS_ENV = (
    "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
    "AWS_EC2_METADATA_DISABLED", "AWS_SESSION_TOKEN", "AWS_PROFILE",
)


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh, empty bucket on the loopback S3 server; yields its name."""
    from seedance_tasks.storage import boto3_client

    name = f"seedance-test-{uuid.uuid4().hex[:12]}"
    boto3_client("s3").create_bucket(Bucket=name)
    return name
