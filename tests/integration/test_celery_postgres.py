"""The compaction pipeline on Airflow's many-machine setup: Postgres + CeleryExecutor + Redis."""

import json

from seedance_tasks.compaction.sample import make_sample_lake
from tests.compaction.conftest import read_lake


def test_compaction_runs_on_celery_workers(airflow_cluster, tmp_path):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=3, files_per_partition=4, rows_per_file=1_000)
    before = read_lake(lake)

    def parsed():
        try:
            return any(d["dag_id"] == "seedance_compaction" for d in airflow_cluster.json("dags", "list"))
        except RuntimeError:
            return False

    airflow_cluster.wait_until(parsed, 240, "the DAG processor to parse dags/")
    airflow_cluster.airflow("dags", "unpause", "seedance_compaction")
    conf = {"uri": str(lake), "target_file_size": "512KiB", "min_age": "0"}
    airflow_cluster.airflow(
        "dags", "trigger", "seedance_compaction", "--conf", json.dumps(conf), "--run-id", "celery-compaction"
    )

    def finished():
        state = airflow_cluster.run_state("seedance_compaction", "celery-compaction")
        return state if state in ("success", "failed") else None

    state = airflow_cluster.wait_until(finished, 300, "the compaction run to finish on the Celery worker")
    assert state == "success", airflow_cluster.tail()
    assert read_lake(lake).equals(before)
    assert len([p for p in lake.rglob("part-*.parquet") if "_seedance" not in p.parts]) < 12
    worker_log = (airflow_cluster.home / "worker.log").read_text()
    assert "seedance_compaction" in worker_log  # the tasks ran in the Celery worker process
