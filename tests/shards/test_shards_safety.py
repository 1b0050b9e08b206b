"""Shards under bad input and concurrent writers: incomplete tars, huge sparse members, images that
do not decode, symlinks in sources, a publish interrupted half way, and the output's lease."""

from __future__ import annotations

import io
import json
import os
import tarfile
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedance_tasks import faults, lease, storage
from seedance_tasks.cli import app
from seedance_tasks.lease import LeaseHeldError
from seedance_tasks.shards.build import build
from seedance_tasks.shards.sample import jpeg_bytes, make_sample_files, make_sample_parquet, photo_like
from seedance_tasks.shards.settings import ShardSettings
from seedance_tasks.shards.tario import iter_members, iter_samples
from seedance_tasks.shards.verify import verify
from tests.shards.test_shards import read_keys, write_tar

TIB = 1 << 40


def kinds(report: dict) -> set[tuple[str, str]]:
    return {(Path(item["shard"]).name, item["kind"]) for item in report["problems"]}


# --------------------------------------------------------------------------- incomplete tars


def test_a_tar_cut_exactly_at_a_member_boundary_is_truncated(tmp_path):
    make_sample_files(tmp_path / "src", 8)
    build(str(tmp_path / "src"), str(tmp_path / "shards"), settings=ShardSettings(max_samples=4))
    shard = tmp_path / "shards" / "shard-000000.tar"
    data = shard.read_bytes()
    with tarfile.open(shard) as archive:
        members = archive.getmembers()
    boundary = members[6].offset  # the header of the 7th member: the cut leaves 6 whole members
    shard.write_bytes(data[:boundary])
    (tmp_path / "shards" / "shardindex.json").unlink()  # no index to compare sizes with

    report = verify(str(tmp_path / "shards"))
    assert not report["ok"]
    assert kinds(report) == {("shard-000000.tar", "truncated")}
    assert members[5].name in report["problems"][0]["problem"]  # names the last whole member
    result = CliRunner().invoke(app, ["shards", "verify", str(tmp_path / "shards")])
    assert result.exit_code == 4 and "error:" in result.output and "end-of-archive" in result.output
    assert "Traceback" not in result.output


def test_a_damaged_header_after_a_member_is_reported_not_taken_for_the_end(tmp_path):
    shard = write_tar(tmp_path / "d-000000.tar", [("a.txt", b"1"), ("b.txt", b"2"), ("c.txt", b"3")])
    data = bytearray(shard.read_bytes())
    data[1024:1024 + 100] = b"\xff" * 100  # b.txt's header: tarfile alone would stop quietly here
    shard.write_bytes(bytes(data))
    report = verify(str(shard))
    assert kinds(report) == {("d-000000.tar", "truncated")}
    assert "damaged header" in report["problems"][0]["problem"]


def test_a_complete_tar_of_another_writer_still_passes(tmp_path):
    import webdataset as wds

    with wds.TarWriter(str(tmp_path / "w-000000.tar")) as writer:
        for number in range(3):
            writer.write({"__key__": f"k{number}", "txt": "hello", "cls": str(number)})
    report = verify(str(tmp_path / "w-000000.tar"))
    assert report["ok"] and report["samples"] == 3


# --------------------------------------------------------------------------- huge declared members


def _pax_sparse(path: Path, real_size: int) -> Path:
    """A PAX tar whose one member is a GNU sparse file (format 0.1): no data, `real_size` bytes declared."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo("huge.bin")
        info.size = 0
        info.pax_headers = {"GNU.sparse.map": "0,0", "GNU.sparse.size": str(real_size)}
        archive.addfile(info, io.BytesIO(b""))
    return path


def _gnu_sparse(path: Path, real_size: int) -> Path:
    """An old-GNU sparse member ('S'), header made by hand: one empty data region, `real_size` declared."""
    info = tarfile.TarInfo("huge.bin")
    info.type = tarfile.GNUTYPE_SPARSE
    info.size = 0
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    header[386:398] = b"%011o\0" % 0  # sparse map entry 0: offset 0 ...
    header[398:410] = b"%011o\0" % 0  # ... 0 bytes of data
    header[482] = 0  # no extension blocks
    header[483:495] = b"\x80" + real_size.to_bytes(11, "big")  # the real size, base-256
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % (sum(header) & 0o777777)
    path.write_bytes(bytes(header) + b"\0" * 1024)
    return path


@pytest.mark.parametrize("make", [_pax_sparse, _gnu_sparse], ids=["pax-0.1", "old-gnu"])
def test_a_sparse_member_declaring_a_terabyte_is_refused_without_allocating(tmp_path, make):
    shard = make(tmp_path / "s-000000.tar", TIB)
    with tarfile.open(shard) as archive:  # the tar really declares it
        assert archive.getmembers()[0].size == TIB
    tracemalloc.start()
    try:
        report = verify(str(shard))
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not report["ok"] and kinds(report) == {("s-000000.tar", "too-large")}
    assert "huge.bin" in report["problems"][0]["problem"] and "more than the whole tar" in report["problems"][0]["problem"]
    assert peak < 16 * 1024 * 1024
    result = CliRunner().invoke(app, ["shards", "verify", str(shard)])
    assert result.exit_code == 4 and "huge.bin" in result.output and "Traceback" not in result.output


def test_a_member_above_the_configured_limit_is_refused_by_its_declared_size(tmp_path):
    shard = write_tar(tmp_path / "m-000000.tar", [("a.txt", b"x" * 5000), ("b.txt", b"small")])
    report = verify(str(shard), max_member_size=4096)
    assert kinds(report) == {("m-000000.tar", "too-large")}
    assert "above the limit of 4,096" in report["problems"][0]["problem"]
    with open(shard, "rb") as stream:  # the readers (preprocess) apply the same limit
        with pytest.raises(Exception, match="above the limit"):
            list(iter_members(stream, str(shard), max_member_size=4096))
    assert verify(str(shard), max_member_size=8192)["ok"]


# --------------------------------------------------------------------------- images that do not decode


@pytest.fixture
def bad_images(tmp_path):
    """12 samples: number 4 is not a JPEG at all, number 7 a real JPEG cut in half."""
    src = tmp_path / "src"
    keys = make_sample_files(src, 12, corrupt=(4,))
    good = (src / f"{keys[7]}.jpg").read_bytes()
    (src / f"{keys[7]}.jpg").write_bytes(good[: len(good) // 2])
    return src, keys


def test_build_rejects_samples_whose_images_do_not_decode(tmp_path, bad_images):
    import webdataset as wds

    src, keys = bad_images
    result = build(str(src), str(tmp_path / "shards"), settings=ShardSettings(max_samples=5))
    rejected = {item["key"]: item["reason"] for item in result["rejected"]}
    assert set(rejected) == {keys[4], keys[7]}
    assert f"{keys[4]}.jpg" in rejected[keys[4]] and "does not decode" in rejected[keys[4]]
    assert f"{keys[7]}.jpg" in rejected[keys[7]]
    assert result["samples"] == 10 and sorted(read_keys(tmp_path / "shards")) == sorted(set(keys) - {keys[4], keys[7]})
    assert json.loads(Path(result["report"]).read_text())["rejected"] == result["rejected"]
    # the first reader now gets through every sample
    dataset = wds.WebDataset(str(tmp_path / "shards" / "shard-{000000..000001}.tar"), shardshuffle=False).decode("pil")
    assert len(list(dataset)) == 10
    assert verify(str(tmp_path / "shards"))["ok"]


def test_verify_names_the_member_that_does_not_decode_and_can_be_told_not_to(tmp_path, bad_images):
    src, keys = bad_images
    runner = CliRunner()
    built = runner.invoke(app, ["shards", "build", str(src), "--out", str(tmp_path / "shards"), "--max-samples", "5",
                                "--no-check-decode", "--json"])
    assert built.exit_code == 0, built.output
    assert json.loads(built.stdout)["rejected"] == []
    report = verify(str(tmp_path / "shards"))
    bad = sorted((Path(item["shard"]).name, item["key"]) for item in report["problems"])
    assert [item["kind"] for item in report["problems"]] == ["undecodable", "undecodable"]
    assert bad == [("shard-000000.tar", keys[4]), ("shard-000001.tar", keys[7])]
    assert f"{keys[4]}.jpg" in report["problems"][0]["problem"]
    failed = runner.invoke(app, ["shards", "verify", str(tmp_path / "shards")])
    assert failed.exit_code == 4 and f"{keys[4]}.jpg" in failed.output
    unchecked = runner.invoke(app, ["shards", "verify", str(tmp_path / "shards"), "--no-check-decode", "--json"])
    assert unchecked.exit_code == 0 and json.loads(unchecked.stdout)["ok"]


def test_build_checks_images_in_parquet_sources_too(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    make_sample_parquet(tmp_path / "src" / "part-0.parquet", 6)
    table = pq.read_table(tmp_path / "src" / "part-0.parquet")
    images = table.column("jpg").to_pylist()
    images[2] = b"\xff\xd8 not really"
    table = table.set_column(table.column_names.index("jpg"), "jpg", pa.array(images, pa.binary()))
    pq.write_table(table, tmp_path / "src" / "part-0.parquet")
    result = build(str(tmp_path / "src"), str(tmp_path / "shards"))
    assert [item["key"] for item in result["rejected"]] == ["row-000002"] and result["samples"] == 5
    assert result["rejected"][0]["source"] == "part-0.parquet#row2"


# --------------------------------------------------------------------------- symlinks in sources


def test_symlinks_in_a_source_are_not_followed_and_reported_once(tmp_path):
    src = tmp_path / "src"
    keys = make_sample_files(src, 4)
    outside = tmp_path / "outside"
    outside_keys = make_sample_files(outside / "more", 3, seed=5)
    (tmp_path / "secret.jpg").write_bytes(jpeg_bytes(photo_like(__import__("numpy").random.default_rng(0), 8, 8)))
    os.symlink(tmp_path / "secret.jpg", src / "sample-000009.jpg")  # a file outside the root
    os.symlink(outside / "more", src / "more")  # a directory outside the root
    result = build(str(src), str(tmp_path / "shards"))
    links = sorted((item["source"], item["reason"]) for item in result["rejected"] if "symbolic link" in item["reason"])
    assert [source for source, _ in links] == ["more", "sample-000009.jpg"]
    assert sorted(read_keys(tmp_path / "shards")) == keys  # nothing from outside
    assert not set(read_keys(tmp_path / "shards")) & {f"more/{key}" for key in outside_keys}


def test_a_symlinked_parquet_file_is_not_read(tmp_path):
    keys = make_sample_parquet(tmp_path / "src" / "part-0.parquet", 5)
    make_sample_parquet(tmp_path / "elsewhere.parquet", 5, seed=3)
    os.symlink(tmp_path / "elsewhere.parquet", tmp_path / "src" / "part-1.parquet")
    result = build(str(tmp_path / "src"), str(tmp_path / "shards"))
    assert result["samples"] == 5 and sorted(read_keys(tmp_path / "shards")) == keys
    assert [item["source"] for item in result["rejected"]] == ["part-1.parquet"]


def test_fifos_sockets_and_devices_in_a_source_are_reported_and_never_opened(tmp_path, monkeypatch):
    import socket

    src = tmp_path / "src"
    keys = make_sample_files(src, 3)
    (src / "sub").mkdir()
    os.mkfifo(src / "sample-000009.jpg")  # opening it for reading would block the build forever
    os.mkfifo(src / "sub" / "pipe.cls")
    monkeypatch.chdir(src)  # a socket's path must be short
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("sock.cls")
        result = build(str(src), str(tmp_path / "shards"))
    why = {item["source"]: item["reason"] for item in result["rejected"]}
    assert why == {
        "sample-000009.jpg": "FIFO (named pipe), not a regular file: never opened (reading a FIFO or a device can "
                             "block or never end)",
        "sub/pipe.cls": why["sub/pipe.cls"], "sock.cls": why["sock.cls"],
    }
    assert why["sub/pipe.cls"].startswith("FIFO") and why["sock.cls"].startswith("socket, not a regular file")
    assert sorted(read_keys(tmp_path / "shards")) == keys
    report = json.loads((tmp_path / "shards" / "_seedance" / "reports" / f"build-{result['run_id']}.json").read_text())
    assert {item["source"] for item in report["rejected"]} == set(why)


@pytest.mark.parametrize("make", ["fifo", "file"])
def test_a_source_or_output_that_is_a_fifo_is_a_usage_error_from_the_library_too(tmp_path, make):
    from seedance_tasks.errors import UsageError

    make_sample_files(tmp_path / "src", 2)
    odd = tmp_path / "odd"
    os.mkfifo(odd) if make == "fifo" else odd.write_bytes(b"x")
    if make == "fifo":
        with pytest.raises(UsageError, match="is a FIFO .named pipe., not a dataset directory"):
            build(str(odd), str(tmp_path / "out"))
    with pytest.raises(UsageError, match=r"--out .*odd: it is a (FIFO|file)"):
        build(str(tmp_path / "src"), str(odd))
    with pytest.raises(UsageError, match=r"its parent .*odd is a (FIFO|file)"):
        build(str(tmp_path / "src"), str(odd / "deeper" / "out"))
    result = CliRunner().invoke(app, ["shards", "build", str(tmp_path / "src"), "--out", str(odd / "out")])
    assert result.exit_code != 0 and "error:" in result.output and "Traceback" not in result.output


# --------------------------------------------------------------------------- publish interrupted, lease


def _visible(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if not path.name.startswith(("_", "."))}


def test_a_build_interrupted_during_its_publish_is_finished_by_the_rerun(tmp_path):
    make_sample_files(tmp_path / "src", 9)
    settings = ShardSettings(max_samples=3)
    clean = build(str(tmp_path / "src"), str(tmp_path / "clean"), settings=settings)
    # the first shard is published, then storage fails: shards visible, no index
    with faults.armed(at=1, mode="raise", match="storage.publish.after"):
        with pytest.raises(faults.InjectedFault):
            build(str(tmp_path / "src"), str(tmp_path / "out"), settings=settings, holder="airflow:d:r1")
    assert (tmp_path / "out" / "shard-000000.tar").exists() and not (tmp_path / "out" / "shardindex.json").exists()
    again = build(str(tmp_path / "src"), str(tmp_path / "out"), settings=settings, holder="airflow:d:r1")
    assert again["up_to_date"] and [item["action"] for item in again["recovered"]] == ["rolled forward"]
    out, reference = _visible(tmp_path / "out"), _visible(tmp_path / "clean")
    assert out.keys() == reference.keys() == {"shard-000000.tar", "shard-000001.tar", "shard-000002.tar",
                                              "shardindex.json"}
    assert all(out[name] == reference[name] for name in out if name.endswith(".tar"))
    index = json.loads(out["shardindex.json"])
    assert index["shardlist"] == json.loads(reference["shardindex.json"])["shardlist"]
    assert again["samples"] == clean["samples"] == 9 and verify(str(tmp_path / "out"))["ok"]


def test_a_build_into_an_output_another_run_holds_is_refused_naming_the_holder(tmp_path):
    make_sample_files(tmp_path / "src", 4)
    out = storage.resolve(str(tmp_path / "out"))
    held = lease.acquire(out, "dataset", holder="airflow:seedance_preprocess:manual__1", purpose="shards build")
    try:
        with pytest.raises(LeaseHeldError, match="airflow:seedance_preprocess:manual__1"):
            build(str(tmp_path / "src"), str(tmp_path / "out"))
        result = CliRunner().invoke(app, ["shards", "build", str(tmp_path / "src"), "--out", str(tmp_path / "out"),
                                          "--wait", "1s"])
        assert result.exit_code == 5 and "airflow:seedance_preprocess:manual__1" in result.output
        assert "error:" in result.output and "hint:" in result.output
        assert not (tmp_path / "out" / "shardindex.json").exists()
        # the same holder (a retried task of that DAG run) takes its own lease back
        assert build(str(tmp_path / "src"), str(tmp_path / "out"),
                     holder="airflow:seedance_preprocess:manual__1")["samples"] == 4
    finally:
        held.release()
    assert lease.current(out, "dataset") is None  # released by whoever took it last


def test_written_shards_read_back_with_the_readers_size_limit(tmp_path):
    make_sample_files(tmp_path / "src", 3)
    build(str(tmp_path / "src"), str(tmp_path / "shards"))
    shard = tmp_path / "shards" / "shard-000000.tar"
    with open(shard, "rb") as stream:
        samples = list(iter_samples(iter_members(stream, str(shard), file_size=shard.stat().st_size), str(shard)))
    assert [sample.key for sample in samples] == ["sample-000000", "sample-000001", "sample-000002"]


def test_build_rejects_members_above_the_limit_and_still_writes_an_index(tmp_path):
    keys = make_sample_files(tmp_path / "src", 3)
    result = build(str(tmp_path / "src"), str(tmp_path / "shards"), settings=ShardSettings(max_member_size=200))
    assert [item["key"] for item in result["rejected"]] == keys and result["samples"] == 0
    assert all("above shards.max_member_size" in item["reason"] for item in result["rejected"])
    index = json.loads((tmp_path / "shards" / "shardindex.json").read_text())
    assert index["shardlist"] == [] and not list((tmp_path / "shards").glob("*.tar"))


def test_a_sample_file_above_the_limit_is_rejected_by_its_listed_size_without_reading_it(tmp_path):
    (tmp_path / "src").mkdir()
    with open(tmp_path / "src" / "huge.cls", "wb") as handle:
        handle.truncate(256 * 1024 * 1024)  # sparse: a stray 256 MiB file that costs no disk
    (tmp_path / "src" / "ok.cls").write_bytes(b"1")
    tracemalloc.start()
    try:
        result = build(str(tmp_path / "src"), str(tmp_path / "shards"),
                       settings=ShardSettings(check_decode=False, max_member_size="1MiB"))
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result["samples"] == 1 and [item["key"] for item in result["rejected"]] == ["huge"]
    assert "above shards.max_member_size" in result["rejected"][0]["reason"]
    assert peak < 32 * 1024 * 1024


# --------------------------------------------------------------------------- arguments that cannot work


@pytest.mark.parametrize("name", ["lone.cls", "shard-000000.tar"])
def test_build_from_a_single_file_that_is_not_parquet_is_a_usage_error(tmp_path, name):
    (tmp_path / name).write_bytes(b"1")
    result = CliRunner().invoke(app, ["shards", "build", str(tmp_path / name), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "is a file, not a dataset directory" in result.output
    assert "hint:" in result.output and not (tmp_path / "o").exists()


@pytest.mark.parametrize("out", ["src", "src/shards", "src/a/../shards"])
def test_build_into_the_source_or_below_it_is_refused_up_front(tmp_path, out):
    make_sample_files(tmp_path / "src", 3)
    result = CliRunner().invoke(app, ["shards", "build", str(tmp_path / "src"), "--out", str(tmp_path / out)])
    assert result.exit_code == 2 and "inside the source" in result.output and "hint:" in result.output
    assert not list((tmp_path / "src").rglob("*.tar"))
