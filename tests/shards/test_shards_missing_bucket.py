"""An s3:// source or output in a bucket that does not exist is named as such (the bucket, the
URI, what to do), never AWS's bare `NoSuchBucket` of a lease's GET nor "no files"."""

from __future__ import annotations

import pytest

from seedance_tasks.errors import InputError
from seedance_tasks.preprocess.run import run
from seedance_tasks.preprocess.settings import PreprocessSettings
from seedance_tasks.shards.build import build
from seedance_tasks.shards.sample import make_sample_files
from seedance_tasks.shards.settings import ShardSettings

MISSING = "s3://seedance-no-such-bucket"
SETTINGS = ShardSettings(check_decode=False)


@pytest.fixture
def local_shards(tmp_path, s3_bucket):  # s3_bucket: the AWS env points at the loopback S3 server
    make_sample_files(tmp_path / "src", 4)
    build(str(tmp_path / "src"), str(tmp_path / "shards"), settings=SETTINGS)
    return tmp_path


@pytest.mark.parametrize("case", ["build out", "build source", "preprocess out", "preprocess shards"])
def test_a_missing_bucket_is_named(local_shards, case):
    tmp = local_shards
    calls = {
        "build out": lambda: build(str(tmp / "src"), f"{MISSING}/shards", settings=SETTINGS),
        "build source": lambda: build(f"{MISSING}/src", str(tmp / "o"), settings=SETTINGS),
        "preprocess out": lambda: run(str(tmp / "shards"), f"{MISSING}/out", settings=PreprocessSettings(size=16)),
        "preprocess shards": lambda: run(f"{MISSING}/shards", str(tmp / "o"), settings=PreprocessSettings(size=16)),
    }
    with pytest.raises(InputError, match="the bucket 'seedance-no-such-bucket' does not exist") as refused:
        calls[case]()
    assert ("create the bucket" in refused.value.hint) == case.endswith("out")
    assert not (tmp / "o").exists()
