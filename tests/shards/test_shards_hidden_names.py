"""Samples with hidden names (`_`/`.` prefix, e.g. a Sony camera's `_DSC0001.JPG`) are not packed
(shard readers skip such names) but never lost silently: the build counts and names them, with
a hint to rename them, through the library, the CLI and the DAG."""

from __future__ import annotations

import json
import logging

import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.errors import InputError
from seedance_tasks.shards.build import build
from seedance_tasks.shards.sample import make_sample_files
from seedance_tasks.shards.settings import ShardSettings
from tests.conftest import xcom_value

SETTINGS = ShardSettings(check_decode=False)


def _camera_folder(tmp_path):
    src = tmp_path / "src"
    keys = make_sample_files(src, 4)
    for name in ("_DSC0001", ".DSC0002"):
        (src / f"{name}.jpg").write_bytes((src / f"{keys[0]}.jpg").read_bytes())
        (src / f"{name}.cls").write_text("1")
    (src / ".thumbs").mkdir()
    for number in range(3):
        (src / ".thumbs" / f"t{number}.jpg").write_bytes(b"x")
    return src, keys


def test_hidden_samples_are_reported_not_lost_silently(tmp_path, caplog):
    src, keys = _camera_folder(tmp_path)
    with caplog.at_level(logging.WARNING, logger="seedance_tasks.shards.sources"):
        result = build(str(src), str(tmp_path / "shards"), settings=SETTINGS)
    assert result["samples"] == len(keys)
    hidden = {item["source"]: item["reason"] for item in result["rejected"]}
    assert set(hidden) == {"_DSC0001.cls", "_DSC0001.jpg", ".DSC0002.cls", ".DSC0002.jpg", ".thumbs/"}
    assert "rename" in hidden["_DSC0001.jpg"] and "3 file(s)" in hidden[".thumbs/"]
    report = json.loads((tmp_path / "shards" / result["report"].split("/shards/", 1)[1]).read_text())
    assert len(report["rejected"]) == 5
    warning = " ".join(record.getMessage() for record in caplog.records)
    assert "5 hidden name(s)" in warning and "_DSC0001.cls" in warning and "hint: rename" in warning
    again = build(str(src), str(tmp_path / "shards"), settings=SETTINGS)  # up to date: still reported
    assert again["up_to_date"] and len(again["rejected"]) == 5


def test_a_source_of_only_hidden_samples_says_so(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "_DSC0001.JPG").write_bytes(b"\xff\xd8")
    with pytest.raises(InputError, match="1 hidden name") as refused:
        build(str(src), str(tmp_path / "shards"), settings=SETTINGS)
    assert "rename" in refused.value.hint


def test_seedance_metadata_and_parquet_side_files_are_not_reported(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "lake"
    src.mkdir()
    pq.write_table(pa.table({"__key__": ["a", "b"], "cls": ["1", "2"]}), src / "part-0.parquet")
    (src / "_SUCCESS").write_bytes(b"")
    (src / "_seedance" / "journal").mkdir(parents=True)
    (src / "_seedance" / "journal" / "x.json").write_text("{}")
    pq.write_table(pa.table({"__key__": ["c"], "cls": ["3"]}), src / "_part-1.parquet")
    result = build(str(src), str(tmp_path / "shards"), settings=SETTINGS)
    assert result["samples"] == 2
    assert [item["source"] for item in result["rejected"]] == ["_part-1.parquet"]


def test_the_cli_lists_them(tmp_path):
    src, _keys = _camera_folder(tmp_path)
    result = CliRunner().invoke(app, ["shards", "build", str(src), "--out", str(tmp_path / "shards"), "--no-check-decode"])
    assert result.exit_code == 0, result.output
    assert "_DSC0001.jpg" in result.output and "rejected" in result.output


def test_the_dag_counts_them(tmp_path, run_dag):
    src, keys = _camera_folder(tmp_path)
    dag_run = run_dag("seedance_preprocess", {"source": str(src), "image_size": 16, "io_workers": 1,
                                              "cpu_workers": 1, "check_decode": False})
    assert dag_run.state == "success"
    built = xcom_value(dag_run, "build_shards")
    assert built["samples"] == len(keys) and built["rejected"] == 5 and built["report"]
