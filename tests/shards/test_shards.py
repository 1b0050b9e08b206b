"""Shard building (both source kinds, index, sizes, idempotence) and verify's refusals."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.errors import RefusedError
from seedance_tasks.shards.build import build
from seedance_tasks.shards.sample import make_sample_files, make_sample_parquet
from seedance_tasks.shards.settings import ShardSettings
from seedance_tasks.shards.tario import iter_members, iter_samples
from seedance_tasks.shards.verify import raise_for_problems, verify


def read_keys(directory: Path) -> list[str]:
    keys = []
    for tar in sorted(directory.glob("*.tar")):
        with open(tar, "rb") as stream:
            keys += [sample.key for sample in iter_samples(iter_members(stream, str(tar)), str(tar))]
    return keys


def write_tar(path: Path, members: list[tuple]) -> Path:
    """members: (name, data) for files, or a TarInfo for special entries."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                archive.addfile(member)
            else:
                name, data = member
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return path


def test_build_from_files_writes_sized_shards_and_a_wids_index(tmp_path):
    keys = make_sample_files(tmp_path / "src", 40)
    settings = ShardSettings(shard_size="64KiB")
    result = build(str(tmp_path / "src"), str(tmp_path / "shards"), settings=settings)
    out = tmp_path / "shards"
    assert result["samples"] == 40 and result["rejected"] == [] and result["shards"] >= 3
    assert sorted(read_keys(out)) == keys  # every sample exactly once
    index = json.loads((out / "shardindex.json").read_text())
    assert index["wids_version"] == 1
    sizes = []
    for entry in index["shardlist"]:
        data = (out / entry["url"]).read_bytes()
        assert entry["filesize"] == len(data) <= settings.shard_size
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        sizes.append(len(data))
    assert sum(entry["nsamples"] for entry in index["shardlist"]) == 40
    assert all(size >= 0.9 * settings.shard_size for size in sizes[:-1])  # full shards are near the target
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # nothing staged left behind

    import wids

    dataset = wids.ShardListDataset(str(out / "shardindex.json"), keep=True, transformations=[])
    assert len(dataset) == 40
    assert dataset[0]["__key__"] == keys[0]


def test_build_max_samples_and_shuffle_is_seeded(tmp_path):
    make_sample_files(tmp_path / "src", 20)
    first = build(str(tmp_path / "src"), str(tmp_path / "a"), settings=ShardSettings(max_samples=6),
                  shuffle=True, seed=7)
    build(str(tmp_path / "src"), str(tmp_path / "b"), settings=ShardSettings(max_samples=6), shuffle=True, seed=7)
    assert first["shards"] == 4
    assert read_keys(tmp_path / "a") == read_keys(tmp_path / "b") != sorted(read_keys(tmp_path / "a"))


def test_build_reports_incomplete_samples_instead_of_dropping_them(tmp_path):
    src = tmp_path / "src"
    keys = make_sample_files(src, 10)
    (src / f"{keys[3]}.jpg").unlink()
    (src / "README").write_text("no extension")
    result = build(str(src), str(tmp_path / "shards"))
    rejected = {(item["key"], item["reason"]) for item in result["rejected"]}
    assert (keys[3], "incomplete: no jpg member") in rejected
    assert any(item["source"] == "README" for item in result["rejected"])
    assert result["samples"] == 9 and keys[3] not in read_keys(tmp_path / "shards")
    report = json.loads(Path(result["report"]).read_text())
    assert len(report["rejected"]) == 2


def test_build_from_parquet_and_unreadable_files_are_reported(tmp_path):
    keys = make_sample_parquet(tmp_path / "src" / "part-0.parquet", 30, missing_image=(5,))
    (tmp_path / "src" / "part-1.parquet").write_bytes(b"PAR1 not really parquet")
    result = build(str(tmp_path / "src"), str(tmp_path / "shards"))
    assert result["source_kind"] == "parquet" and result["samples"] == 29
    assert sorted(read_keys(tmp_path / "shards")) == [k for k in keys if k != keys[5]]
    reasons = {item["source"]: item["reason"] for item in result["rejected"]}
    assert any(source.startswith("part-0.parquet") and "incomplete" in r for source, r in reasons.items())
    assert "unreadable Parquet file" in reasons["part-1.parquet"]
    with open(next((tmp_path / "shards").glob("*.tar")), "rb") as stream:
        sample = next(iter_samples(iter_members(stream, "x"), "x"))
    assert set(sample.members) == {"jpg", "cls", "txt"} and sample.members["cls"] == b"0"


def test_a_parquet_key_seen_before_is_rejected_not_written_twice(tmp_path):
    """Two rows with one key would come out as one sample with doubled members (or across shards,
    as the duplicates `verify` refuses): the later rows are rejected with their row and reason."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from seedance_tasks.shards.sample import jpeg_bytes, photo_like

    image = jpeg_bytes(photo_like(np.random.default_rng(0), 32, 32))
    (tmp_path / "src").mkdir()
    pq.write_table(pa.table({"__key__": ["a", "b", "a"], "jpg": [image] * 3, "cls": ["0", "1", "2"]}),
                   tmp_path / "src" / "part-0.parquet")
    pq.write_table(pa.table({"__key__": ["b", "c"], "jpg": [image] * 2, "cls": ["3", "4"]}),
                   tmp_path / "src" / "part-1.parquet")
    result = build(str(tmp_path / "src"), str(tmp_path / "shards"))
    assert sorted(read_keys(tmp_path / "shards")) == ["a", "b", "c"] and result["samples"] == 3
    duplicates = sorted(item["source"] for item in result["rejected"] if "duplicate key" in item["reason"])
    assert duplicates == ["part-0.parquet#row2", "part-1.parquet#row0"]
    assert verify(str(tmp_path / "shards"), check_decode=True)["problems"] == []


def test_rebuild_is_a_no_op_and_a_different_build_is_refused(tmp_path):
    make_sample_files(tmp_path / "src", 12)
    first = build(str(tmp_path / "src"), str(tmp_path / "shards"))
    shard = next((tmp_path / "shards").glob("*.tar"))
    before = shard.read_bytes()
    again = build(str(tmp_path / "src"), str(tmp_path / "shards"))
    assert again["up_to_date"] and again["samples"] == first["samples"] and shard.read_bytes() == before
    with pytest.raises(RefusedError):
        build(str(tmp_path / "src"), str(tmp_path / "shards"), settings=ShardSettings(max_samples=2))


def test_build_and_verify_on_s3(tmp_path, s3_bucket):
    make_sample_files(tmp_path / "src", 15)
    uri = f"s3://{s3_bucket}/shards"
    result = build(str(tmp_path / "src"), uri, settings=ShardSettings(shard_size="32KiB"))
    report = verify(uri)
    assert report["ok"] and report["index"] == f"{uri}/shardindex.json"
    assert report["samples"] == result["samples"] == 15 and report["shards"] == result["shards"]


@pytest.fixture
def good_shards(tmp_path):
    make_sample_files(tmp_path / "src", 12)
    build(str(tmp_path / "src"), str(tmp_path / "shards"), settings=ShardSettings(max_samples=4))
    return tmp_path / "shards"


def _special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


@pytest.mark.parametrize(
    "member, expected",
    [
        (("/etc/evil.jpg", b"x"), "absolute path"),
        (("../evil.jpg", b"x"), "'..'"),
        (("a/../../evil.jpg", b"x"), "'..'"),
        (_special("evil.jpg", tarfile.SYMTYPE, "/etc/passwd"), "symbolic link"),
        (_special("evil.jpg", tarfile.LNKTYPE, "sample-000000.jpg"), "hard link"),
        (_special("evil.jpg", tarfile.CHRTYPE), "device node"),
        (_special("evil.jpg", tarfile.FIFOTYPE), "FIFO"),
    ],
)
def test_verify_refuses_hostile_members(tmp_path, member, expected):
    shard = write_tar(tmp_path / "data-000000.tar", [("ok.txt", b"fine"), member])
    report = verify(str(shard))
    assert not report["ok"]
    assert [p["kind"] for p in report["problems"]] == ["refused"]
    assert expected in report["problems"][0]["problem"]
    with pytest.raises(RefusedError):
        raise_for_problems(report)


def test_verify_accepts_good_shards_by_dir_index_and_brace_pattern(good_shards):
    assert verify(str(good_shards))["ok"]
    pattern = verify(str(good_shards / "shard-{000000..000002}.tar"))
    assert pattern["ok"] and pattern["index"] is None and pattern["samples"] == 12


def test_verify_reports_truncated_tar_and_count_and_checksum_mismatch(good_shards):
    first, second, third = sorted(good_shards.glob("*.tar"))
    first.write_bytes(first.read_bytes()[:3000])  # cut in the middle of a member
    data = bytearray(second.read_bytes())
    data[600] ^= 0xFF  # a byte of the first member's data: tar still readable
    second.write_bytes(bytes(data))
    index = json.loads((good_shards / "shardindex.json").read_text())
    index["shardlist"][2]["nsamples"] = 5
    (good_shards / "shardindex.json").write_text(json.dumps(index))
    report = verify(str(good_shards))
    kinds = {(Path(p["shard"]).name, p["kind"]) for p in report["problems"]}
    assert (first.name, "unreadable") in kinds
    assert (second.name, "checksum") in kinds
    assert (third.name, "count") in kinds


def test_verify_reports_duplicate_keys_within_and_across_shards(tmp_path):
    write_tar(tmp_path / "d-000000.tar", [("a.jpg", b"1"), ("a.cls", b"1"), ("b.jpg", b"2"), ("a.txt", b"again")])
    write_tar(tmp_path / "d-000001.tar", [("c.jpg", b"3"), ("b.jpg", b"dup"), ("c2.jpg", b"4"), ("c2.jpg", b"4")])
    report = verify(str(tmp_path), check_decode=False)  # the members are not real images
    duplicates = sorted((Path(p["shard"]).name, p["key"]) for p in report["problems"] if p["kind"] == "duplicate")
    assert duplicates == [("d-000000.tar", "a"), ("d-000001.tar", "b"), ("d-000001.tar", "c2")]


def test_cli_build_and_verify(tmp_path, good_shards):
    runner = CliRunner()
    make_sample_files(tmp_path / "src2", 5)
    built = runner.invoke(app, ["shards", "build", str(tmp_path / "src2"), "--out", str(tmp_path / "o"), "--json"])
    assert built.exit_code == 0, built.output
    assert json.loads(built.stdout)["samples"] == 5
    ok = runner.invoke(app, ["shards", "verify", str(good_shards), "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["ok"]
    (tmp_path / "evil").mkdir()
    write_tar(tmp_path / "evil" / "x.tar", [("../x.jpg", b"1")])
    hostile = runner.invoke(app, ["shards", "verify", str(tmp_path / "evil")])
    assert hostile.exit_code == 3 and "refused" in hostile.output
