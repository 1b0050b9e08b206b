"""The DAG's source/shards/out params are checked before any work, with messages naming the
params (not CLI flags): relative paths, S3 keys with `..`, an output inside the samples or the
shards, the same folder for two of them."""

from __future__ import annotations

import pytest

from seedance_tasks.errors import UsageError
from seedance_tasks.preprocess.airflow_tasks import locations
from seedance_tasks.shards.sample import make_sample_files


def test_an_output_in_the_samples_folder_fails_before_anything_is_written(tmp_path, run_dag):
    src = tmp_path / "src"
    make_sample_files(src, 6)
    before = sorted(path.name for path in src.rglob("*"))
    dag_run = run_dag("seedance_preprocess", {"source": str(src), "out": str(src), "image_size": 16,
                                              "io_workers": 1, "cpu_workers": 1})
    assert dag_run.state == "failed"
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert states["build_shards"] == "failed" and states["preprocess"] == "upstream_failed"
    assert sorted(path.name for path in src.rglob("*")) == before  # nothing of the run mixed with the samples
    assert not (tmp_path / "src-shards").exists()


@pytest.mark.parametrize(("conf", "words"), [
    ({"out": "{src}"}, ["`out` param", "`source` param", "set `out`"]),
    ({"out": "{src}/pre"}, ["`out` param", "`source` param"]),
    ({"shards": "{src}/shards"}, ["`shards` param", "`source` param", "set `shards`"]),
    ({"shards": "{tmp}/sh", "out": "{tmp}/sh"}, ["`out` param", "`shards` param"]),
    ({"shards": "{tmp}/sh", "out": "{tmp}/x/../sh/"}, ["`out` param", "`shards` param"]),
    ({"source_kind": "shards", "out": "{src}"}, ["`out` param", "`source` param", "replace them"]),
    ({"source": "{tmp}/a", "out": "{tmp}/a-shards"}, ["`out` param", "default `shards` ({tmp}/a-shards, `shards` left empty)"]),
    ({"source_kind": "shards", "source": "{src}/shard-{{000000..000003}}.tar", "out": "{src}"}, ["`out` param"]),
])
def test_outputs_inside_their_inputs_are_refused_naming_the_params(tmp_path, conf, words):
    src = tmp_path / "src"
    src.mkdir()
    params = {"source": str(src)} | {key: value.format(src=src, tmp=tmp_path) for key, value in conf.items()}
    with pytest.raises(UsageError) as refused:
        locations(params)
    text = str(refused.value)
    words = [word.format(tmp=tmp_path) for word in words]
    assert all(word in text for word in words), text
    assert "--out" not in text and "hint:" in text


@pytest.mark.parametrize(("conf", "param"), [
    ({"source": "data/src"}, "source"),
    ({"out": "out"}, "out"),
    ({"shards": "./sh"}, "shards"),
    ({"out": "s3://bucket/a/../out"}, "out"),
    ({"source": "s3://bucket/./src"}, "source"),
])
def test_relative_paths_and_s3_dot_keys_are_refused(tmp_path, conf, param):
    with pytest.raises(UsageError, match=f"the `{param}` param") as refused:
        locations({"source": str(tmp_path / "src")} | conf)
    assert "hint:" in str(refused.value)


def test_sound_locations_pass(tmp_path):
    where = locations({"source": str(tmp_path / "src") + "/ ", "out": "", "shards": " "})
    assert where["shards"] == f"{tmp_path}/src-shards" and where["out"] == f"{tmp_path}/src-shards-preprocessed"
    assert locations({"source": f"{tmp_path}/sh/shardindex.json", "source_kind": "shards",
                      "out": f"{tmp_path}/sh/pre"})["out"] == f"{tmp_path}/sh/pre"  # listed by the index
    assert locations({"source": "s3://bucket/src", "out": "s3://bucket/src-out"})["out"] == "s3://bucket/src-out"
    assert locations({"source": str(tmp_path / "src"), "out": f"{tmp_path}/a/../out"})["out"] == f"{tmp_path}/a/../out"
