"""A hostile or unreadable input shard is quarantined and the rest of the run goes on.

One bad shard among good ones (a link, a `..` name, a member larger than the tar, a truncated
tar, a member without a sample key found only once its data is read, an S3 shard found bad as
it streams): the good shards' outputs are exactly those of a run without the bad shard, the bad
one is reported by name and member, recorded under the output's quarantine folder, left where it
is untouched, and never published; a rerun changes nothing. A run killed anywhere while it sets
the half-written bad shard aside is finished by the next one with the same outputs.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedance_tasks import journal, storage
from seedance_tasks.cli import app
from seedance_tasks.errors import RefusedError
from seedance_tasks.preprocess.run import QUARANTINE_DIR, run
from seedance_tasks.preprocess.settings import PreprocessSettings
from seedance_tasks.shards.build import build
from seedance_tasks.shards.sample import make_sample_files
from seedance_tasks.shards.settings import ShardSettings
from seedance_tasks.shards.tario import END_OF_ARCHIVE, iter_members, iter_samples
from tests.chaos.harness import points_hit, run_task
from tests.conftest import xcom_value
from tests.preprocess.conftest import read_output

SIZE = 16
SETTINGS = PreprocessSettings(size=SIZE, io_workers=2, cpu_workers=2, batch_size=4)
BAD = "shard-000002.tar"


def _end_of_members(data: bytes) -> int:
    """Where the end-of-archive marker of the tar `data` starts (after its last member)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        archive.getmembers()
        return archive.offset


def _with_member(data: bytes, info: tarfile.TarInfo, payload: bytes = b"") -> bytes:
    """The tar `data` with one more member (its header as given, then `payload`) before the end marker."""
    end = _end_of_members(data)
    block = -(-len(payload) // 512) * 512
    return data[:end] + info.tobuf(format=tarfile.USTAR_FORMAT) + payload.ljust(block, b"\0") + END_OF_ARCHIVE


def _link() -> tarfile.TarInfo:
    info = tarfile.TarInfo("zz-0.jpg")
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return info


def _sized(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def _oversize(data: bytes) -> bytes:
    """A member declaring 100 MB in a tar of a few KB: refused before a byte of it is read."""
    end = _end_of_members(data)
    return data[:end] + _sized("zz-0.jpg", 100_000_000).tobuf(format=tarfile.USTAR_FORMAT) + END_OF_ARCHIVE


DAMAGE = {  # kind of damage -> (damaged bytes, the member the error names, the problem's kind)
    "symlink": (lambda data: _with_member(data, _link()), "zz-0.jpg", "refused"),
    "traversal": (lambda data: _with_member(data, _sized("../../escape.jpg", 3), b"abc"), "../../escape.jpg",
                  "refused"),
    "oversize": (_oversize, "zz-0.jpg", "too-large"),
    "truncated": (lambda data: data[: len(data) // 2 + 100], None, "unreadable"),  # "truncated or corrupt tar"
    # headers all fine (no pre-run check finds it); its samples before it are written, then set aside
    "no-key": (lambda data: _with_member(data, _sized("zz", 1), b"x"), "zz", "unreadable"),
    # a second tar appended: readers stop at the first end marker, so its samples would be lost unseen
    "appended": (lambda data: data + data, None, "trailing-data"),
}


def visible(out: Path) -> dict[str, str]:
    """The output a reader sees: each visible file's sha256 (the index without its run-dependent parts)."""
    found = {}
    for path in sorted(out.iterdir()):
        if path.is_file() and not path.name.startswith((".", "_")):
            data = path.read_bytes()
            if path.name == "shardindex.json":
                index = json.loads(data)
                index["seedance"].pop("quarantined", None)
                index["seedance"].pop("quarantine_records", None)
                index["seedance"].pop("failed_records")
                data = json.dumps(index, sort_keys=True).encode()
            found[path.name] = hashlib.sha256(data).hexdigest()
    return found


def settled(out: Path) -> None:
    assert journal.pending(storage.resolve(str(out))) == []
    assert not [path.name for path in out.iterdir() if path.name.startswith(".")]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """Four good shards, and what a run over only the three that stay good writes."""
    root = tmp_path_factory.mktemp("quarantine")
    keys = make_sample_files(root / "src", 16, corrupt=(2,))
    build(str(root / "src"), str(root / "shards"), settings=ShardSettings(max_samples=4, check_decode=False))
    (root / "shards" / "shardindex.json").unlink()  # the shards as a plain folder of tars (as foreign ones come)
    reference_in = root / "without-bad"
    reference_in.mkdir()
    for tar in (root / "shards").glob("*.tar"):
        if tar.name != BAD:
            shutil.copy(tar, reference_in / tar.name)
    bad_keys = {sample.key for sample in iter_samples(iter_members(open(root / "shards" / BAD, "rb"), BAD), BAD)}
    reference = run(str(reference_in), str(root / "reference"), settings=SETTINGS)
    return root, reference, [key for key in keys if key not in bad_keys]


def _damaged_copy(root: Path, where: Path, damage: str) -> Path:
    shutil.copytree(root / "shards", where)
    (where / BAD).write_bytes(DAMAGE[damage][0]((where / BAD).read_bytes()))
    return where


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_one_bad_shard_is_quarantined_and_the_others_are_published(tmp_path, good, damage):
    root, reference, good_keys = good
    shards = _damaged_copy(root, tmp_path / "shards", damage)
    bad_before = (shards / BAD).read_bytes()
    out = tmp_path / "out"
    result = run(str(shards), str(out), settings=SETTINGS)

    (item,) = result["quarantined"]
    _, member, kind = DAMAGE[damage]
    assert item["name"] == BAD and item["shard"] == str(shards / BAD) and item["kind"] == kind, item
    assert item["member"] == member and BAD in item["error"] and item["hint"], item
    if member:
        assert repr(member) in item["error"]
    # the good shards: exactly what a run without the bad one writes, every good sample once
    assert visible(out) == visible(root / "reference")
    assert sorted(read_output(out)) == sorted(read_output(root / "reference"))
    assert sorted(list(read_output(out)) + [f["key"] for f in result["failed"]]) == sorted(good_keys)
    assert result["samples_out"] == reference["samples_out"] and result["failed"] == [
        {**f, "shard": f["shard"].replace(str(root / "without-bad"), str(shards))} for f in reference["failed"]]
    assert result["shards"] == 3 and not (out / BAD).exists()
    # recorded under Seedance's own outputs; the input shard left where it was, as it was
    record = json.loads((out / QUARANTINE_DIR / f"{BAD}.json").read_text())
    assert record["shard"] == str(shards / BAD) and record["kind"] == kind and record["member"] == member
    assert (shards / BAD).read_bytes() == bad_before
    index = json.loads((out / "shardindex.json").read_text())
    assert [q["name"] for q in index["seedance"]["quarantined"]] == [BAD]
    assert BAD not in {entry["url"] for entry in index["shardlist"]}
    settled(out)

    # a rerun is idempotent: nothing redone, the same outputs, the same record, reported again
    files = {path: path.read_bytes() for path in out.rglob("*") if path.is_file() and "leases" not in path.parts}
    again = run(str(shards), str(out), settings=SETTINGS)
    assert again["shards"] == 0 and len(again["skipped"]) == 3
    assert [q["name"] for q in again["quarantined"]] == [BAD] and again["quarantined"][0]["error"] == item["error"]
    after = {path: path.read_bytes() for path in out.rglob("*") if path.is_file() and "leases" not in path.parts}
    assert after == files
    settled(out)


def test_a_fixed_shard_is_processed_by_the_next_run_and_its_record_retired(tmp_path, good):
    root, _reference, _keys = good
    shards = _damaged_copy(root, tmp_path / "shards", "symlink")
    out = tmp_path / "out"
    run(str(shards), str(out), settings=SETTINGS)
    shutil.copy(root / "shards" / BAD, shards / BAD)  # the user replaces it with a good copy
    again = run(str(shards), str(out), settings=SETTINGS)
    assert again["shards"] == 1 and again["quarantined"] == [] and (out / BAD).is_file()
    assert not (out / QUARANTINE_DIR / f"{BAD}.json").exists()  # retired to the trash, not deleted
    assert list((out / "_seedance" / "trash").rglob(f"{BAD}.json"))
    assert "quarantined" not in json.loads((out / "shardindex.json").read_text())["seedance"]
    settled(out)


def test_the_cli_prints_an_error_and_a_hint_per_quarantined_shard_and_exits_0(tmp_path, good):
    root, _reference, _keys = good
    shards = _damaged_copy(root, tmp_path / "shards", "traversal")
    result = CliRunner().invoke(app, ["preprocess", "run", "--shards", str(shards), "--out", str(tmp_path / "o"),
                                      "--size", str(SIZE), "--io-workers", "1", "--cpu-workers", "1", "--json"],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [q["name"] for q in report["quarantined"]] == [BAD] and report["shards"] == 3
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and BAD in errors[0] and "'../../escape.jpg'" in errors[0], result.stderr
    assert "hint:" in result.stderr and "Traceback" not in result.stderr


def test_a_run_with_nothing_but_bad_shards_fails_naming_them(tmp_path, good):
    root, _reference, _keys = good
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / BAD).write_bytes(DAMAGE["symlink"][0]((root / "shards" / BAD).read_bytes()))
    out = tmp_path / "out"
    with pytest.raises(RefusedError, match=f"every shard .* quarantined .*{BAD}") as raised:
        run(str(shards), str(out), settings=SETTINGS)
    assert raised.value.hint
    assert (out / QUARANTINE_DIR / f"{BAD}.json").is_file()  # recorded all the same
    assert not list(out.glob("*.tar")) and not (out / "shardindex.json").exists()
    result = CliRunner().invoke(app, ["preprocess", "run", "--shards", str(shards), "--out", str(out),
                                      "--size", str(SIZE), "--io-workers", "1", "--cpu-workers", "1"])
    assert result.exit_code == 3 and "error:" in result.stderr and BAD in result.stderr and "hint:" in result.stderr


def test_an_s3_shard_found_hostile_as_it_streams_is_quarantined(tmp_path, good, s3_bucket):
    from seedance_tasks.storage import boto3_client

    root, _reference, _keys = good
    client = boto3_client("s3")
    for tar in sorted((root / "shards").glob("*.tar")):
        data = tar.read_bytes()
        if tar.name == BAD:
            data = DAMAGE["symlink"][0](data)  # at its end: its samples are written before the link is met
        client.put_object(Bucket=s3_bucket, Key=f"shards/{tar.name}", Body=data)
    result = run(f"s3://{s3_bucket}/shards", f"s3://{s3_bucket}/out", settings=SETTINGS)
    assert [(q["name"], q["member"], q["kind"]) for q in result["quarantined"]] == [(BAD, "zz-0.jpg", "refused")]
    listed = {item["Key"] for item in client.list_objects_v2(Bucket=s3_bucket, Prefix="out/")["Contents"]}
    published = sorted(key.removeprefix("out/") for key in listed if key.count("/") == 1 and key != "out/")
    assert published == ["shard-000000.tar", "shard-000001.tar", "shard-000003.tar", "shardindex.json"]
    assert not [key for key in listed if "/." in key and "/_seedance/" not in key]  # nothing staged left visible
    got = {}
    for name in published[:-1]:
        got[name] = client.get_object(Bucket=s3_bucket, Key=f"out/{name}")["Body"].read()
    assert got == {name: (root / "reference" / name).read_bytes() for name in got}


def test_a_first_shard_broken_where_the_pool_sizing_reads_is_quarantined_too(tmp_path, good):
    """With the I/O threads measured (not given), the measurement reads the first shard's first
    samples: a problem there (no pre-run check finds a keyless member) is the shard's, not the run's."""
    root, _reference, _keys = good
    shards = tmp_path / "shards"
    shards.mkdir()
    first = (root / "shards" / "shard-000000.tar").read_bytes()
    (shards / "shard-000000.tar").write_bytes(_sized("zz", 1).tobuf(format=tarfile.USTAR_FORMAT) + b"x".ljust(512, b"\0")
                                              + first)
    shutil.copy(root / "shards" / "shard-000001.tar", shards / "shard-000001.tar")
    result = run(str(shards), str(tmp_path / "out"), settings=PreprocessSettings(size=SIZE, cpu_workers=1, batch_size=4))
    assert [(q["name"], q["member"]) for q in result["quarantined"]] == [("shard-000000.tar", "zz")]
    assert sorted(path.name for path in (tmp_path / "out").glob("*.tar")) == ["shard-000001.tar"]
    assert "read" in result["pools_basis"]  # the pools were measured


# --------------------------------------------------------------------------- crash safety

TARGET = "seedance_tasks.preprocess.run:run"
HOLDER = "airflow:seedance_preprocess:scheduled__1"


@pytest.fixture(scope="module")
def two_shards(good, tmp_path_factory):
    """One good shard and one whose problem shows only once its samples are being written."""
    root, _reference, _keys = good
    shards = tmp_path_factory.mktemp("crash") / "shards"
    shards.mkdir()
    shutil.copy(root / "shards" / "shard-000000.tar", shards / "shard-000000.tar")
    (shards / BAD).write_bytes(DAMAGE["no-key"][0]((root / "shards" / BAD).read_bytes()))
    return shards


def _kwargs(shards: Path, out: Path) -> dict:
    return {"shards_uri": str(shards), "out_uri": str(out), "holder": HOLDER,
            "settings": {"size": SIZE, "io_workers": 1, "cpu_workers": 1, "batch_size": 2}}


def test_a_run_killed_while_it_sets_a_half_written_shard_aside_is_finished_by_the_next(tmp_path, two_shards):
    clean = tmp_path / "clean"
    points = points_hit(TARGET, _kwargs(two_shards, clean))
    first = points.index("journal.begun")  # every shard's journal
    second = points.index("journal.begun", first + 1)  # the journal of the good shard only
    publishing = points.index("journal.publishing", second)
    expected = visible(clean)
    assert set(expected) == {"shard-000000.tar", "shardindex.json"}
    # from the quarantine record's write to the point of no return (the commit after it is the
    # usual one, killed at each of its points by tests/chaos/test_shards_chaos.py)
    for index in range(first + 2, publishing + 2):
        out = tmp_path / f"kill-{index:02d}"
        where = f"killed at point {index} ({points[index - 1]})"
        killed = run_task(TARGET, _kwargs(two_shards, out), fault_at=index, mode="kill")
        assert killed.returncode == -9, f"{where}: {killed.stderr[-2000:]}"
        assert not (out / BAD).exists(), where  # never published, killed anywhere
        retry = run(**_kwargs(two_shards, out))
        assert [q["name"] for q in retry["quarantined"]] == [BAD], where
        assert visible(out) == expected, where
        settled(out)


# --------------------------------------------------------------------------- the DAG


def test_the_dag_quarantines_a_hostile_shard_and_publishes_the_others(tmp_path, good, run_dag):
    root, _reference, good_keys = good
    shards = _damaged_copy(root, tmp_path / "foreign", "traversal")
    dag_run = run_dag("seedance_preprocess", {"source": str(shards), "source_kind": "shards",
                                              "out": str(tmp_path / "out"), "image_size": SIZE, "io_workers": 1,
                                              "cpu_workers": 1, "shards_per_group": 2, "check_decode": False})
    assert dag_run.state == "success"
    states = {(ti.task_id, ti.map_index): ti.state for ti in dag_run.get_task_instances()}
    assert set(states.values()) == {"success"}, states
    verified = xcom_value(dag_run, "verify_shards")
    assert verified["shards_to_quarantine"] == [str(shards / BAD)]
    groups = [xcom_value(dag_run, "preprocess", map_index=i) for i in range(2)]
    assert [q["name"] for g in groups for q in g["quarantined"]] == [BAD]
    summary = xcom_value(dag_run, "finalize")
    assert summary["quarantined_count"] == 1 and summary["quarantined"][0]["name"] == BAD
    assert summary["output_shards"] == 3
    assert visible(tmp_path / "out") == visible(root / "reference")


@pytest.mark.parametrize("parallel", ["shards", "samples"])
@pytest.mark.parametrize("damage", ["symlink", "oversize", "no-key"])
def test_the_record_names_the_member_the_reader_found_whatever_the_path_says(tmp_path, good, damage, parallel):
    """The member comes from the reader's error itself, not from its text: a folder whose name reads
    like a member (`: member 'decoy.jpg'`) does not stand in for it, in either way of running."""
    root, _reference, _keys = good
    shards = _damaged_copy(root, tmp_path / "in: member 'decoy.jpg' x", damage)
    settings = PreprocessSettings(size=SIZE, io_workers=1, cpu_workers=1, batch_size=4, parallel=parallel)
    result = run(str(shards), str(tmp_path / "out"), settings=settings)
    (item,) = result["quarantined"]
    assert item["member"] == DAMAGE[damage][1] and item["kind"] == DAMAGE[damage][2], item
    record = json.loads((tmp_path / "out" / QUARANTINE_DIR / f"{BAD}.json").read_text())
    assert record["member"] == DAMAGE[damage][1]
