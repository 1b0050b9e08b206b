"""Shards in subfolders that share basenames (`train/shard-000000.tar`, `val/shard-000000.tar`):
each is one shard of its own everywhere. The DAG's groups name shards by their (unique) output
names, so each mapped task does its own shards only (a basename would select every shard of that
name, and two groups would run the same shards side by side under one journal prefix), and a
basename that two shards share is refused as a selection, naming both."""

from __future__ import annotations

import pytest

from seedance_tasks.errors import UsageError
from seedance_tasks.preprocess.run import run
from seedance_tasks.shards.build import build
from seedance_tasks.shards.sample import make_sample_files
from tests.conftest import xcom_value

from .conftest import read_output


@pytest.fixture
def split(tmp_path):
    for part, seed in (("train", 0), ("val", 1)):
        make_sample_files(tmp_path / "src" / part, 4, seed=seed)
        for path in (tmp_path / "src" / part).iterdir():
            path.rename(path.with_name(f"{part}-{path.name}"))
        build(str(tmp_path / "src" / part), str(tmp_path / "shards" / part), settings={"max_samples": 2})
        (tmp_path / "shards" / part / "shardindex.json").unlink()  # a plain folder of tars
    return tmp_path / "shards"


def test_a_shared_basename_is_not_a_selection(tmp_path, split):
    with pytest.raises(UsageError, match="names 2 shards") as raised:
        run(str(split), str(tmp_path / "out"), settings={"size": 16}, only=["shard-000000.tar"])
    assert "000000-shard-000000.tar" in raised.value.hint and not (tmp_path / "out").exists()


def test_the_dag_gives_each_mapped_task_its_own_shards(tmp_path, split, run_dag):
    dag_run = run_dag("seedance_preprocess", {"source": str(split), "source_kind": "shards", "out": str(tmp_path / "out"),
                                              "image_size": 16, "io_workers": 1, "cpu_workers": 1,
                                              "shards_per_group": 1, "check_decode": False})
    assert dag_run.state == "success"
    groups = [xcom_value(dag_run, "preprocess", map_index=i) for i in range(4)]
    assert [(group["shards"], group["skipped"]) for group in groups] == [(1, [])] * 4
    assert xcom_value(dag_run, "finalize")["output_shards"] == 4
    assert len(read_output(tmp_path / "out")) == 8
