"""Thousands of shards through the DAG: the mapped groups never exceed Airflow's
`[core] max_map_length` (a longer list fails the plan task), and the XComs stay small."""

from __future__ import annotations

import json

from seedance_tasks.shards.build import build
from seedance_tasks.shards.sample import make_sample_files
from seedance_tasks.shards.settings import ShardSettings
from tests.conftest import xcom_value


def test_more_groups_than_airflow_maps_are_merged_not_failed(tmp_path, run_dag, monkeypatch):
    src = tmp_path / "src"
    keys = make_sample_files(src, 14)
    build(str(src), str(tmp_path / "shards"), settings=ShardSettings(max_samples=2, check_decode=False))
    shard_count = len(list((tmp_path / "shards").glob("*.tar")))
    assert shard_count == 7
    monkeypatch.setenv("AIRFLOW__CORE__MAX_MAP_LENGTH", "3")
    dag_run = run_dag("seedance_preprocess", {"source": str(tmp_path / "shards"), "source_kind": "shards",
                                              "out": str(tmp_path / "out"), "image_size": 16, "io_workers": 1,
                                              "cpu_workers": 1, "shards_per_group": 1})
    assert dag_run.state == "success"
    mapped = [ti for ti in dag_run.get_task_instances() if ti.task_id == "preprocess"]
    assert len(mapped) == 3  # ceil(7 / 3) shards per group: 3 groups, every shard in one
    groups = xcom_value(dag_run, "plan")
    assert sorted(name for group in groups for name in group["names"]) == sorted(
        path.name for path in (tmp_path / "shards").glob("*.tar"))
    summary = xcom_value(dag_run, "finalize")
    assert summary["output_shards"] == 7 and summary["samples_out"] == len(keys)
    assert len(json.dumps(summary)) < 2000
