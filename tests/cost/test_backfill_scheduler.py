"""`airflow backfill create` for real: a scheduler and an API server (LocalExecutor, SQLite) in
their own Airflow home run three past months of the cost DAG; each month's outputs are checked.

Slow (about a minute and a half on two cores): it starts real Airflow services as subprocesses.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from decimal import Decimal
from pathlib import Path

import pytest

from tests.cost.helpers import three_months

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).parent / "airflow")
DAG_ID = "seedance_cost_recovery"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _airflow(env, *args, timeout=120) -> str:
    done = subprocess.run([AIRFLOW, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _json_list(text: str) -> list[dict]:
    """The JSON array in a CLI's stdout (it may print other lines, or nothing when there are no runs)."""
    start, end = text.find("[{"), text.rfind("}]")
    return json.loads(text[start:end + 2]) if start >= 0 and end > start else []


def _wait_healthy(port: int, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        assert process.poll() is None, "the API server exited"
        assert time.monotonic() < deadline, "the API server did not come up"
        time.sleep(1)


@pytest.mark.slow
def test_airflow_backfill_create_runs_three_past_months(tmp_path):
    billing, owners = three_months(tmp_path)
    out = tmp_path / "out"
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(REPO / "dags" / "seedance_cost_recovery.py", dags)
    home = tmp_path / "airflow"
    port = _free_port()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("AIRFLOW", "SEEDANCE__", "AWS_"))}
    env.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",  # a paused DAG's backfill runs stay queued
        "SEEDANCE_CONFIG": str(REPO / "config" / "seedance.yaml"),
        # the regular run that unpausing creates (the latest month) needs these defaults
        "SEEDANCE__COST__BILLING_URI": str(billing), "SEEDANCE__COST__OWNERS_FILE": str(owners),
        "SEEDANCE__COST__OUT_URI": str(out),
    })
    home.mkdir()
    _airflow(env, "db", "migrate")
    _airflow(env, "dags", "reserialize")
    conf = json.dumps({"billing": str(billing), "owners": str(owners), "out": str(out), "apply": True})
    # created before the services start: SQLite takes one writer at a time
    _airflow(env, "backfill", "create", "--dag-id", DAG_ID, "--from-date", "2024-07-01",
             "--to-date", "2024-09-30", "--dag-run-conf", conf)
    logs, services = [], []
    try:
        for name in ("api-server", "scheduler"):  # tasks report to the API server: it must be up first
            logs.append(open(tmp_path / f"{name}.log", "w"))  # noqa: SIM115
            services.append(subprocess.Popen([AIRFLOW, name], env=env, stdout=logs[-1], stderr=subprocess.STDOUT,
                                             start_new_session=True))
            if name == "api-server":
                _wait_healthy(port, services[-1])
        deadline = time.monotonic() + 300
        summaries = [out / f"month={month}" / "summary.json" for month in ("2024-07", "2024-08", "2024-09")]
        while not all(path.exists() for path in summaries):  # files, not the DB: no lock contention
            assert time.monotonic() < deadline, "backfill did not publish three months"
            time.sleep(2)
        while True:
            listed = subprocess.run([AIRFLOW, "dags", "list-runs", DAG_ID, "-o", "json"], env=env,
                                    capture_output=True, text=True, timeout=120)  # may meet a locked DB: retry
            backfills = [run for run in _json_list(listed.stdout) if run["run_id"].startswith("backfill__")]
            if len(backfills) == 3 and all(run["state"] in ("success", "failed") for run in backfills):
                break
            assert time.monotonic() < deadline, f"backfill runs did not finish: {backfills}"
            time.sleep(2)
    finally:
        for service in services:
            os.killpg(service.pid, signal.SIGTERM)
        for service in services:
            try:
                service.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(service.pid, signal.SIGKILL)
        for log in logs:
            log.close()
    assert sorted(run["logical_date"][:7] for run in backfills) == ["2024-07", "2024-08", "2024-09"]
    assert {run["state"] for run in backfills} == {"success"}, backfills
    for month, alpha in (("2024-07", "10.5"), ("2024-08", "20.25"), ("2024-09", "30.125")):
        usd = json.loads((out / f"month={month}" / "summary.json").read_text())["currencies"]["USD"]
        assert usd["by_owner"] == {"alpha": alpha, "beta": "5"}
        assert sum(map(Decimal, usd["by_owner"].values())) + Decimal(usd["unallocated"]) == Decimal(usd["total"])
    state = out / "_seedance" / "cost"  # over budget every month, apply=true: a backfill still never acts
    assert not (state / "quota-ledger.json").exists() and not (state / "outbox.jsonl").exists()
