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
