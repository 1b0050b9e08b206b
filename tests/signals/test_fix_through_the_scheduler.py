"""A `small-files` finding starts a real compaction run through its Asset, as in production.

Real Airflow services (API server and scheduler, LocalExecutor, SQLite) in their own home: the
finding's event is POSTed to the REST API the way the signals DAG's fix task emits it (same
asset, same extra), the scheduler turns it into a `seedance_compaction` run, and that run
compacts exactly the lake the event names. Slow (a minute or two): real services.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.airflow_services import AirflowServices, admin_token, free_port, standalone_env

REPO = Path(__file__).resolve().parents[2]


def _api(port: int, path: str, token: str, body: dict | None = None):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method="POST" if body is not None else "GET",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_a_small_files_event_runs_the_compaction_dag_on_its_lake(tmp_path):
    from seedance_tasks.compaction.sample import make_sample_lake
    from seedance_tasks.signals.assets import SMALL_FILES

    lake, untouched = tmp_path / "lake", tmp_path / "other-lake"
    written = make_sample_lake(str(lake), partitions=2, files_per_partition=4, rows_per_file=200)
    make_sample_lake(str(untouched), partitions=1, files_per_partition=3, rows_per_file=50)
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(REPO / "dags" / "seedance_compaction.py", dags)
    home = tmp_path / "airflow"
    home.mkdir()
    port = free_port()
    env = standalone_env(home, dags, port)
    services = AirflowServices(home, env)
    services.airflow("db", "migrate")
    services.airflow("dags", "reserialize")
    try:
        services.start("api-server", "api-server")
        services.wait_healthy(port)
        services.start("scheduler", "scheduler")
        token = admin_token(home, port)
        assets = services.wait_until(
            lambda: _api(port, f"/api/v2/assets?name_pattern={SMALL_FILES.name}", token)["assets"], 120,
            "the compaction DAG's schedule asset to be registered")
        extra = {"signal": "small-files", "date": "2026-12-01", "apply": True, "targets": [
            {"key": str(lake), "dag_id": "seedance_compaction", "conf": {"uri": str(lake), "dry_run": False}}]}
        _api(port, "/api/v2/assets/events", token, {"asset_id": assets[0]["id"], "extra": extra})

        def asset_run():
            runs = _api(port, "/api/v2/dags/seedance_compaction/dagRuns?run_type=asset_triggered", token)["dag_runs"]
            return runs if runs and all(run["state"] in ("success", "failed") for run in runs) else None

        runs = services.wait_until(asset_run, 300, "the asset-triggered compaction run to finish")
    finally:
        services.stop()
    assert [run["state"] for run in runs] == ["success"], services.tail()
    visible = []
    for partition in sorted(path for path in lake.iterdir() if path.name.startswith("date=")):
        files = sorted(path for path in partition.iterdir() if path.suffix == ".parquet")
        assert len(files) == 1, files  # four small files became one
        visible += files
    assert len(visible) == 2
    assert sum(pq.read_metadata(path).num_rows for path in visible) == written["rows"]
    assert len(list(untouched.rglob("*.parquet"))) == 3  # only the lake the finding names
