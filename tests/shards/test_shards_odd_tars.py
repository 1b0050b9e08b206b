"""Odd but legal tars, and what is not a tar at all: a second tar appended after the end-of-archive
marker (readers stop at the marker, so its samples would be lost unseen), zero padding after the
marker (fine), compressed shards."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.shards.tario import TarProblem, iter_members
from seedance_tasks.shards.verify import verify
from tests.shards.test_shards import write_tar


def _two_tars(path: Path) -> Path:
    first = write_tar(path.with_suffix(".a"), [("k1.txt", b"one"), ("k1.cls", b"1")]).read_bytes()
    second = write_tar(path.with_suffix(".b"), [("k2.txt", b"two"), ("k2.cls", b"2")]).read_bytes()
    path.write_bytes(first + second)
    return path


def test_a_second_tar_appended_is_reported_not_silently_left_unread(tmp_path):
    (tmp_path / "shards").mkdir()
    shard = _two_tars(tmp_path / "shards" / "cat-000000.tar")
    report = verify(str(shard), check_decode=False)
    assert not report["ok"]
    (problem,) = report["problems"]
    assert problem["kind"] == "trailing-data" and "after its end-of-archive marker" in problem["problem"]
    with open(shard, "rb") as stream, pytest.raises(TarProblem, match="another tar appended"):
        list(iter_members(stream, str(shard)))
    result = CliRunner().invoke(app, ["shards", "verify", str(tmp_path / "shards")])
    assert result.exit_code == 4 and "error:" in result.output and "hint:" in result.output
    assert "Traceback" not in result.output


def test_zero_padding_after_the_marker_is_fine(tmp_path):
    shard = write_tar(tmp_path / "p-000000.tar", [("k.txt", b"x")])
    shard.write_bytes(shard.read_bytes() + b"\0" * 3 * 1024 * 1024)  # beyond one read of the padding
    report = verify(str(shard), check_decode=False)
    assert report["ok"] and report["samples"] == 1


def test_an_appended_tar_streamed_from_s3_is_reported(tmp_path, s3_bucket):
    from seedance_tasks.storage import boto3_client

    shard = _two_tars(tmp_path / "cat-000000.tar")
    boto3_client("s3").put_object(Bucket=s3_bucket, Key="cat/cat-000000.tar", Body=shard.read_bytes())
    report = verify(f"s3://{s3_bucket}/cat", check_decode=False)
    assert [item["kind"] for item in report["problems"]] == ["trailing-data"]


def test_a_brace_list_names_its_shards_as_a_range_does(tmp_path):
    """`{a,b}` is a pattern to webdataset as much as `{0..1}`: verify and preprocess take it; a
    folder whose own name holds such braces is still that folder."""
    import numpy as np

    from seedance_tasks.preprocess.run import run
    from seedance_tasks.shards.sample import jpeg_bytes, photo_like

    image = jpeg_bytes(photo_like(np.random.default_rng(0), 32, 24))
    for name in ("train", "extra", "other"):
        write_tar(tmp_path / f"{name}.tar", [(f"{name}-k.jpg", image), (f"{name}-k.cls", b"1")])
    report = verify(f"{tmp_path}/{{train,extra}}.tar")
    assert report["ok"] and report["shards"] == 2 and report["samples"] == 2
    missing = verify(f"{tmp_path}/{{train,gone}}.tar")
    assert [(item["kind"], item["shard"]) for item in missing["problems"]] == [("missing", f"{tmp_path}/gone.tar")]
    result = run(f"{tmp_path}/{{train,extra}}.tar", str(tmp_path / "out"),
                 settings={"size": 16, "io_workers": 1, "cpu_workers": 1})
    assert result["samples_out"] == 2 and sorted(p.name for p in (tmp_path / "out").glob("*.tar")) == [
        "extra.tar", "train.tar"]
    literal = tmp_path / "set{a,b}"
    literal.mkdir()
    write_tar(literal / "s.tar", [("k.txt", b"x")])
    assert verify(str(literal))["samples"] == 1


def test_compressed_shards_are_named_as_such(tmp_path):
    import gzip

    from seedance_tasks.errors import InputError, UsageError
    from seedance_tasks.preprocess.run import run

    plain = write_tar(tmp_path / "plain.tar", [("k.txt", b"x")]).read_bytes()
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "s-000000.tar.gz").write_bytes(gzip.compress(plain))
    with pytest.raises(InputError, match="only 1 compressed tar"):
        verify(str(tmp_path / "gz"))
    with pytest.raises(UsageError, match="compressed tar"):
        verify(str(tmp_path / "gz" / "s-000000.tar.gz"))
    (tmp_path / "named").mkdir()
    (tmp_path / "named" / "s-000000.tar").write_bytes(gzip.compress(plain))  # compressed, named .tar
    report = verify(str(tmp_path / "named"))
    assert [item["kind"] for item in report["problems"]] == ["unreadable"]
    assert "gzip-compressed, not a plain tar" in report["problems"][0]["problem"]
    with pytest.raises(InputError, match="gzip-compressed") as raised:
        run(str(tmp_path / "named"), str(tmp_path / "out"), settings={"size": 16, "io_workers": 1, "cpu_workers": 1})
    assert "gunzip" in raised.value.hint or "quarantine" in raised.value.hint
