"""Sample keys and member names: what `shards build` accepts is read back by webdataset's own
reader as the same samples; a name no reader can take (extensions differing only in case, a
reader's own `__key__`, a refused member name, a name that is not UTF-8, an S3 key pyarrow cannot
open, Parquet columns named so or twice) rejects its sample or row group, never the whole build;
rows without a key column get valid, distinct keys from any file path; rows with no member are
rejected; required members ignore case; index URLs no path can carry are index problems; and
shard sizes count long (PAX) names exactly."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seedance_tasks.shards.build import build
from seedance_tasks.shards.settings import ShardSettings
from seedance_tasks.shards.tario import TarShardWriter, member_bytes
from seedance_tasks.shards.verify import verify
from tests.shards.test_shards import write_tar

PLAIN = ShardSettings(check_decode=False)


def webdataset_samples(directory: Path) -> dict[str, list[str]]:
    """Every sample of every shard as webdataset.WebDataset reads it (it raises on what it cannot take)."""
    import webdataset as wds

    samples = {}
    for tar in sorted(directory.glob("*.tar")):
        for sample in wds.WebDataset(str(tar), shardshuffle=False, empty_check=False):
            samples[sample["__key__"]] = sorted(name for name in sample if not name.startswith("__"))
    return samples


def write_files(root: Path, names: dict) -> Path:
    for name, data in names.items():
        path = os.path.join(os.fsencode(root), name) if isinstance(name, bytes) else root / name
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
    return root


def reasons(result: dict) -> dict:
    return {item["key"] or item["source"]: item["reason"] for item in result["rejected"]}


def test_sample_files_readers_would_misread_are_rejected_and_the_rest_reads_back(tmp_path):
    src = write_files(tmp_path / "src", {
        "good.cls": b"1", "good.txt": b"a",
        "case.cls": b"2", "case.txt": b"b", "case.TXT": b"c",  # webdataset lowercases: a duplicate
        "reserved.cls": b"3", "reserved.__key__": b"x",  # webdataset's own field
        "\\lead.cls": b"4",  # an absolute Windows path: the writer refuses it
        "ok.cls": b"5",
    })
    result = build(str(src), str(tmp_path / "out"), settings=PLAIN.model_copy(update={"required_members": ["cls"]}))
    assert webdataset_samples(tmp_path / "out") == {"good": ["cls", "txt"], "ok": ["cls"]}
    why = reasons(result)
    assert set(why) == {"case", "reserved", "\\lead"} and result["samples"] == 2
    assert "differ only in case" in why["case"] and "'__key__'" in why["reserved"]
    assert "absolute path" in why["\\lead"]
    assert verify(str(tmp_path / "out"), check_decode=False)["ok"]


def test_a_file_name_that_is_not_utf8_is_reported_and_the_build_goes_on(tmp_path):
    src = write_files(tmp_path / "src", {b"caf\xe9.cls": b"1", b"ok.cls": b"2"})
    try:
        result = build(str(src), str(tmp_path / "out"), settings=PLAIN)
    except OSError:  # pragma: no cover - a file system that refuses such names
        pytest.skip("this file system cannot hold a non-UTF-8 name")
    assert webdataset_samples(tmp_path / "out") == {"ok": ["cls"]}
    assert [(item["source"], "not UTF-8" in item["reason"]) for item in result["rejected"]] == [("caf\\xe9.cls", True)]
    json.dumps(result, ensure_ascii=False)  # the report is printable text


def test_verify_reports_extensions_that_differ_only_in_case_and_reserved_ones(tmp_path):
    write_tar(tmp_path / "a.tar", [("x.jpg", b"1"), ("x.JPG", b"2"), ("y.__url__", b"u"), ("y.cls", b"3")])
    report = verify(str(tmp_path / "a.tar"), check_decode=False)
    found = {(item["key"], item["kind"]) for item in report["problems"]}
    assert found == {("x", "duplicate"), ("y", "bad-name")}


def write_parquet(path: Path, columns: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def test_parquet_keys_and_columns_that_cannot_name_members_reject_rows_not_the_build(tmp_path):
    src = tmp_path / "src"
    write_parquet(src / "a.parquet", {"__key__": ["\\lead", "nul\0byte", "good"], "cls": [1, 2, 3]})
    write_parquet(src / "b.parquet", {"__key__": pa.array([b"raw", b"\xff"]), "cls": [4, 5]})  # binary keys
    write_parquet(src / "c.parquet", {"__key__": ["c1"], "jpg": [b"1"], "JPG": [b"2"]})
    write_parquet(src / "d.parquet", {"__key__": ["d1"], "a/b": [b"1"]})
    write_parquet(src / "e.parquet", {"__key__": ["e1"], "../../x": [b"1"]})
    write_parquet(src / "f.parquet", {"__key__": ["f1"], "__url__": ["u"], "cls": [6]})
    result = build(str(src), str(tmp_path / "out"), settings=PLAIN)
    assert webdataset_samples(tmp_path / "out") == {"good": ["cls"], "raw": ["cls"]}
    why = {item["source"]: item["reason"] for item in result["rejected"]}
    assert set(why) == {"a.parquet#row0", "a.parquet#row1", "b.parquet#row1", "c.parquet#rowgroup0",
                        "d.parquet#rowgroup0", "e.parquet#rowgroup0", "f.parquet#rowgroup0"}
    assert "absolute path" in why["a.parquet#row0"] and "NUL" in why["a.parquet#row1"]
    assert "not UTF-8" in why["b.parquet#row1"] and "differ only in case" in why["c.parquet#rowgroup0"]
    assert "'a/b'" in why["d.parquet#rowgroup0"] and "'__url__'" in why["f.parquet#rowgroup0"]
    assert verify(str(tmp_path / "out"), check_decode=False)["ok"]


def test_rows_without_a_key_column_get_valid_distinct_keys_from_any_file_path(tmp_path):
    src = tmp_path / "src"
    for name in ("part-00000-1f2e.c000.snappy.parquet", "v1.2/a.parquet", "a/b.parquet", "a_b.parquet"):
        write_parquet(src / name, {"jpg": [b"1", b"2"]})
    result = build(str(src), str(tmp_path / "out"), settings=PLAIN)
    assert result["rejected"] == [] and result["samples"] == 8
    keys = webdataset_samples(tmp_path / "out")
    assert len(keys) == 8 and "part-00000-1f2e%2Ec000%2Esnappy-0000-00000001" in keys
    assert {"a%2Fb-0000-00000000", "a_b-0000-00000000"} <= set(keys)  # two files, two keys

    write_parquet(tmp_path / "one.v2.parquet", {"jpg": [b"1", None]})  # SRC is the file itself
    single = build(str(tmp_path / "one.v2.parquet"), str(tmp_path / "single"), settings=PLAIN)
    assert list(webdataset_samples(tmp_path / "single")) == ["one%2Ev2-0000-00000000"]
    assert [item["source"] for item in single["rejected"]] == ["one.v2.parquet#row1"]


def test_a_row_with_no_member_is_rejected_so_the_index_counts_what_the_tar_holds(tmp_path):
    write_parquet(tmp_path / "src" / "a.parquet", {"__key__": ["a", "b"], "txt": pa.array(["x", None], pa.string())})
    result = build(str(tmp_path / "src"), str(tmp_path / "out"), settings=PLAIN)
    assert result["samples"] == 1 and [item["key"] for item in result["rejected"]] == ["b"]
    assert verify(str(tmp_path / "out"), check_decode=False)["ok"]


@pytest.mark.parametrize("mtime", [0, 8**11])  # 8**11: beyond ustar's mtime field, so a PAX header
@pytest.mark.parametrize("letter", ["k", "é"])
@pytest.mark.parametrize("length", [1, 95, 96, 97, 255, 256, 600, 1100, 3000])
def test_member_bytes_is_exactly_what_the_writer_writes(length, letter, mtime):
    stream = io.BytesIO()
    writer = TarShardWriter(stream, mtime=mtime)
    name = ("d" * 200 + "/") * (length // 201) + letter * (length % 201 or 1) + ".cls"
    writer.add_member(name, b"x" * 700)
    assert len(stream.getvalue()) == member_bytes(name, 700, mtime)


def test_shards_of_samples_with_long_paths_stay_within_the_shard_size(tmp_path):
    deep = "/".join(["d" * 250] * 12)  # member names of about 3 KB: each needs a PAX header of 6 blocks
    write_files(tmp_path / "src", {f"{deep}/s{i:03d}.{ext}": b"x" * 1000 for i in range(40) for ext in ("cls", "txt")})
    settings = PLAIN.model_copy(update={"shard_size": 60 * 1024})
    build(str(tmp_path / "src"), str(tmp_path / "out"), settings=settings)
    index = json.loads((tmp_path / "out" / "shardindex.json").read_text())
    assert max(entry["filesize"] for entry in index["shardlist"]) <= 60 * 1024
    assert len(webdataset_samples(tmp_path / "out")) == 40


def test_an_s3_key_pyarrow_cannot_open_rejects_its_sample_and_the_build_goes_on(tmp_path, s3_bucket):
    from seedance_tasks.storage import boto3_client

    client = boto3_client("s3")
    for key, body in {"src/a//b.cls": b"1", "src/ok.cls": b"2", "src/sub/k.cls": b"3"}.items():
        client.put_object(Bucket=s3_bucket, Key=key, Body=body)
    result = build(f"s3://{s3_bucket}/src", str(tmp_path / "out"), settings=PLAIN)
    assert webdataset_samples(tmp_path / "out") == {"ok": ["cls"], "sub/k": ["cls"]}
    assert [(item["key"], "unreadable member b.cls" in item["reason"]) for item in result["rejected"]] == [("a//b", True)]


def test_s3_keys_with_dot_components_are_rejected_with_the_reason_not_skipped_as_hidden(tmp_path, s3_bucket):
    from seedance_tasks.storage import boto3_client

    client = boto3_client("s3")
    for key in ("src/../evil.cls", "src/./x.cls", "src/a/../b.cls", "src/ok.cls", "src/_hidden.cls", "src/.dot/y.cls"):
        client.put_object(Bucket=s3_bucket, Key=key, Body=b"1")
    result = build(f"s3://{s3_bucket}/src", str(tmp_path / "out"), settings=PLAIN)
    assert webdataset_samples(tmp_path / "out") == {"ok": ["cls"]}
    why = {item["source"]: item["reason"] for item in result["rejected"]}
    dots = ["../evil.cls", "./x.cls", "a/../b.cls"]
    assert set(why) == {".dot/", *dots, "_hidden.cls"}  # truly hidden names: not packed, reported as hidden
    assert all("`.` or `..` component" in why[name] for name in dots)
    assert "hidden name" in why["_hidden.cls"] and "hidden folder" in why[".dot/"]


def test_a_parquet_file_with_a_column_name_twice_rejects_its_row_groups_and_the_build_goes_on(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    twice = pa.Table.from_arrays([pa.array(["a"]), pa.array([b"1"]), pa.array([b"2"])], names=["__key__", "jpg", "jpg"])
    pq.write_table(twice, src / "a.parquet")
    keys = pa.Table.from_arrays([pa.array(["b"]), pa.array(["c"]), pa.array([b"3"])], names=["__key__", "__key__", "jpg"])
    pq.write_table(keys, src / "b.parquet")
    write_parquet(src / "c.parquet", {"__key__": ["good"], "jpg": [b"4"]})
    result = build(str(src), str(tmp_path / "out"), settings=PLAIN)
    assert webdataset_samples(tmp_path / "out") == {"good": ["jpg"]}
    why = {item["source"]: item["reason"] for item in result["rejected"]}
    assert "'jpg' appears twice" in why["a.parquet#rowgroup0"]
    assert "'__key__' appears 2 times" in why["b.parquet#rowgroup0"] and len(why) == 2


def test_index_urls_no_path_can_carry_are_index_problems_and_the_other_shards_are_checked(tmp_path):
    from typer.testing import CliRunner

    from seedance_tasks.cli import app

    write_tar(tmp_path / "s-0.tar", [("a.cls", b"1")])
    # a NUL, and a lone surrogate (valid JSON, no valid path): each crashed the listing before
    (tmp_path / "shardindex.json").write_text(
        '{"wids_version": 1, "shardlist": [{"url": "a\\u0000.tar"}, {"url": "\\udce9.tar"}, {"url": "s-0.tar"}]}'
    )
    result = CliRunner().invoke(app, ["shards", "verify", str(tmp_path), "--json", "--no-check-decode"])
    assert result.exit_code == 4, result.output
    report = json.loads(result.stdout)
    assert [item["kind"] for item in report["problems"]] == ["index", "index"]
    assert report["shards"] == 1 and report["samples"] == 1


def test_required_members_count_extensions_as_readers_see_them_ignoring_case(tmp_path):
    # a camera's `.JPG` beside `.jpg`: both are `jpg` to a reader, so neither half is incomplete
    files = {f"s{i}.{'JPG' if i % 2 else 'jpg'}": b"x" for i in range(6)}
    src = write_files(tmp_path / "src", {**files, **{f"s{i}.cls": b"1" for i in range(6)}})
    result = build(str(src), str(tmp_path / "out"), settings=PLAIN)
    assert result["rejected"] == [] and result["required_members"] == ["cls", "jpg"]
    assert webdataset_samples(tmp_path / "out") == {f"s{i}": ["cls", "jpg"] for i in range(6)}


@pytest.mark.parametrize("mtime", [0, 1_700_000_000, 8**11 - 1, 8**11])
def test_member_headers_are_the_bytes_tarfile_writes(mtime):
    from seedance_tasks.shards.tario import _header, _template

    template = _template(mtime)
    names = ["a.jpg", "k" * 95 + ".npy", "d" * 100, "d" * 101, "dir/sub/key.cls", "é.txt", "x" * 60 + "/" + "y" * 60]
    for name in names:
        for size in (0, 1, 511, 512, 150_656, 8**11 - 1, 8**11):
            expected = template.replace(name=name, deep=False)
            expected.size = size
            try:
                want = expected.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")
            except ValueError:
                want = expected.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")
            assert _header(template, name, size) == want, (name, size)
