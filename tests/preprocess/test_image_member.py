"""Which member of a sample is its image: the plain `jpg`/`jpeg`/`png` where there is one, so a
depth map or mask beside it (`depth.png`, `alpha.png`: names that sort before `jpg`) is kept as
one of the sample's other members instead of being taken for the picture."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from seedance_tasks.preprocess.run import run
from seedance_tasks.preprocess.transform import image_extension, to_chw
from seedance_tasks.shards.sample import jpeg_bytes, photo_like

from .conftest import read_output, write_shard


@pytest.mark.parametrize("members,expected", [
    ({"jpg", "depth.png", "alpha.png", "cls"}, "jpg"),
    ({"JPG", "png"}, "JPG"),
    ({"png", "jpeg"}, "jpeg"),
    ({"right.jpg", "left.jpg", "txt"}, "left.jpg"),
    ({"cls", "txt"}, None),
])
def test_the_plain_image_member_is_the_image(members, expected):
    assert image_extension(members) == expected


@pytest.mark.parametrize("parallel", ["shards", "samples"])
def test_a_depth_map_beside_the_photo_is_not_taken_for_it(tmp_path, parallel):
    photo = jpeg_bytes(photo_like(np.random.default_rng(0), 64, 48))
    depth = io.BytesIO()
    Image.fromarray(np.full((48, 64), 7, np.uint8)).save(depth, "PNG")
    write_shard(tmp_path / "in" / "s-000000.tar", [("k.cls", b"1"), ("k.depth.png", depth.getvalue()),
                                                    ("k.jpg", photo)])
    result = run(str(tmp_path / "in"), str(tmp_path / "out"),
                 settings={"size": 16, "io_workers": 1, "cpu_workers": 1, "parallel": parallel})
    assert result["samples_out"] == 1 and result["failed"] == []
    sample = read_output(tmp_path / "out")["k"]
    assert sorted(sample) == ["cls", "depth.png", "npy"] and sample["depth.png"] == depth.getvalue()
    assert np.array_equal(np.load(io.BytesIO(sample["npy"])), to_chw(photo, 16))
