"""A Parquet image column in any of Arrow's binary layouts (binary, large, view as polars writes it,
fixed size) is a bytes column: a row whose image is null is rejected as incomplete, naming the
column, instead of being packed as a sample without its image."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seedance_tasks.shards.build import build
from seedance_tasks.shards.sample import jpeg_bytes, photo_like
from tests.shards.test_shards import read_keys


@pytest.mark.parametrize("kind", ["binary", "large_binary", "binary_view", "fixed_size_binary"])
def test_a_null_image_in_any_binary_layout_rejects_its_row(tmp_path, kind):
    image = jpeg_bytes(photo_like(np.random.default_rng(0), 32, 24))
    type_ = pa.binary(len(image)) if kind == "fixed_size_binary" else getattr(pa, kind)()
    table = pa.table({"__key__": ["a", "b", "c"], "jpg": pa.array([image, None, image], type_), "cls": [1, 2, 3]})
    (tmp_path / "src").mkdir()
    pq.write_table(table, tmp_path / "src" / "part-0.parquet")
    result = build(str(tmp_path / "src"), str(tmp_path / "shards"))
    assert [(item["key"], item["reason"]) for item in result["rejected"]] == [("b", "incomplete: no jpg")]
    assert result["samples"] == 2 and sorted(read_keys(tmp_path / "shards")) == ["a", "c"]
