"""An output folder inside the folder whose tars are the shards (no index) is refused up front: a
rerun would list the outputs among the shards. Shards named by a pattern are not listed: an output
beside them is fine."""

from __future__ import annotations

import numpy as np
import pytest

from seedance_tasks.shards.sample import jpeg_bytes, photo_like

from .conftest import write_shard


@pytest.mark.parametrize("inside", ["pp", "pp/deeper"])
def test_an_output_inside_the_shards_folder_is_refused_up_front(tmp_path, inside):
    """A rerun would list the outputs among the shards (and then call --out the shards' own
    folder): refused on the first run already, naming both, nothing written."""
    from typer.testing import CliRunner

    from seedance_tasks.cli import app

    image = jpeg_bytes(photo_like(np.random.default_rng(0), 32, 24))
    write_shard(tmp_path / "shards" / "s-000000.tar", [("k.jpg", image), ("k.cls", b"1")])
    out = tmp_path / "shards" / inside
    result = CliRunner().invoke(app, ["preprocess", "run", "--shards", str(tmp_path / "shards"), "--out", str(out),
                                      "--size", "16", "--io-workers", "1", "--cpu-workers", "1"])
    assert result.exit_code == 2 and "lies inside" in result.output, result.output
    assert "hint:" in result.output and "Traceback" not in result.output and not out.exists()


def test_an_output_beside_shards_named_by_a_pattern_is_fine(tmp_path):
    from seedance_tasks.preprocess.run import run

    image = jpeg_bytes(photo_like(np.random.default_rng(0), 32, 24))
    write_shard(tmp_path / "s-000000.tar", [("k.jpg", image), ("k.cls", b"1")])
    result = run(f"{tmp_path}/s-{{000000..000000}}.tar", str(tmp_path / "out"),
                 settings={"size": 16, "io_workers": 1, "cpu_workers": 1})
    assert result["samples_out"] == 1
