"""A sample with a member of its own named `npy` (precomputed features, say) would have it replaced
by the preprocessed array (KEY.npy), or, spelled `NPY`, sit beside a second KEY.npy that readers
(which lowercase extensions) cannot tell apart: the sample fails, named, instead of being written
with a member silently lost. Other samples, and a member merely ending in `.npy`, go on."""

from __future__ import annotations

import io

import numpy as np
import pytest

from seedance_tasks.preprocess.run import run
from seedance_tasks.shards.sample import jpeg_bytes, photo_like

from .conftest import read_output, write_shard


@pytest.mark.parametrize("parallel", ["shards", "samples"])
def test_a_sample_with_its_own_npy_member_fails_instead_of_losing_it(tmp_path, parallel):
    image = jpeg_bytes(photo_like(np.random.default_rng(0), 32, 24))
    features = io.BytesIO()
    np.save(features, np.arange(5.0))
    write_shard(tmp_path / "in" / "s-000000.tar", [
        ("a.jpg", image), ("a.npy", features.getvalue()),
        ("b.NPY", features.getvalue()), ("b.jpg", image),
        ("c.feat.npy", features.getvalue()), ("c.jpg", image), ("c.npy.txt", b"kept"),
    ])
    result = run(str(tmp_path / "in"), str(tmp_path / "out"),
                 settings={"size": 16, "io_workers": 1, "cpu_workers": 1, "parallel": parallel})
    reasons = {item["key"]: item["reason"] for item in result["failed"]}
    assert sorted(reasons) == ["a", "b"] and "a.npy:" in reasons["a"] and "b.NPY:" in reasons["b"]
    assert all("rename" in reason for reason in reasons.values())
    output = read_output(tmp_path / "out")
    assert list(output) == ["c"] and output["c"]["feat.npy"] == features.getvalue()
    assert output["c"]["npy.txt"] == b"kept" and np.load(io.BytesIO(output["c"]["npy"])).shape == (3, 16, 16)

