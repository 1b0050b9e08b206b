"""A run where every sample fails is an error (exit 1, an `error:` line naming the first failure and
a `hint:`), not a success with empty shards; one good sample among bad ones is a success."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.shards.sample import jpeg_bytes, photo_like

from .conftest import write_shard


@pytest.mark.parametrize("good", [0, 1])
def test_a_run_whose_every_sample_failed_is_an_error(tmp_path, good):
    shards = tmp_path / "shards"
    samples = {f"s{n}": b"<html>not found</html>" for n in range(3)}
    if good:
        samples["ok"] = jpeg_bytes(photo_like(np.random.default_rng(0), 64, 48))
    write_shard(shards / "shard-000000.tar",
                [(f"{key}.{ext}", data) for key, image in samples.items() for ext, data in (("jpg", image), ("cls", b"1"))])
    result = CliRunner().invoke(app, ["preprocess", "run", "--shards", str(shards), "--out", str(tmp_path / "out"),
                                      "--size", "16", "--cpu-workers", "1", "--io-workers", "1"])
    if good:
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 1, result.output
    assert "error: none of the 3 samples" in result.output and "'s0'" in result.output
    assert "hint: see the failed list" in result.output and "Traceback" not in result.output


def test_the_dag_fails_like_the_cli_when_every_sample_failed(tmp_path, run_dag):
    """The DAG's two faces agree: a run whose every sample failed fails at `finalize` (the index
    written, as the CLI writes it before exiting 1), naming the first failure; no Asset event."""
    from seedance_tasks.dag_support import read_xcom

    shards = tmp_path / "shards"
    write_shard(shards / "shard-000000.tar",
                [(f"s{n}.{ext}", data) for n in range(3) for ext, data in (("jpg", b"<html>404</html>"), ("cls", b"1"))])
    dag_run = run_dag("seedance_preprocess", {"source": str(shards), "source_kind": "shards", "out": str(tmp_path / "out"),
                                              "image_size": 16, "io_workers": 1, "cpu_workers": 1,
                                              "check_decode": False})
    assert dag_run.state == "failed"
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert states["preprocess"] == "success" and states["finalize"] == "failed"
    assert read_xcom(dag_run, "finalize", "return_value", -1) is None
    assert (tmp_path / "out" / "shardindex.json").is_file()
