"""Whole shards per worker (`parallel: shards`): the same output bytes as the sample-batch
Pipeline, bad samples and bad shards handled alike, a dead worker's shards redone by the
Pipeline, any other error stopping the run with nothing published, and `auto`'s choice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seedance_tasks import journal, storage
from seedance_tasks.preprocess import shardwise
from seedance_tasks.preprocess.pipeline import WORKER_DIED
from seedance_tasks.preprocess.run import run
from seedance_tasks.preprocess.settings import PreprocessSettings
from seedance_tasks.shards.build import build
from seedance_tasks.shards.index import resolve_shards
from seedance_tasks.shards.sample import jpeg_bytes, make_sample_files, photo_like
from seedance_tasks.shards.settings import ShardSettings
from tests.preprocess.conftest import read_output, run_crashing, write_shard

REPO = Path(__file__).resolve().parents[2]
SIZE = 32


def settings(parallel: str, **more) -> PreprocessSettings:
    return PreprocessSettings(**{"size": SIZE, "io_workers": 1, "cpu_workers": 2, "batch_size": 3,
                                 "parallel": parallel, **more})


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Six shards of JPEGs and PNGs, two corrupt images and a sample with no image (a .webp only)."""
    root = tmp_path_factory.mktemp("shardwise")
    keys = make_sample_files(root / "src", 36, corrupt=(5, 22), png=(3, 30))
    (root / "src" / f"{keys[12]}.jpg").rename(root / "src" / f"{keys[12]}.webp")
    build(str(root / "src"), str(root / "shards"), settings=ShardSettings(max_samples=6, required_members=["cls"], check_decode=False))
    return root / "shards", keys


def outputs(out: Path) -> dict[str, bytes]:
    """The published output shards and done-records (without their run ids), by name."""
    found = {path.name: path.read_bytes() for path in out.glob("*.tar")}
    for path in (out / "_seedance" / "preprocess" / "done").glob("*.json"):
        record = json.loads(path.read_text())
        record.pop("run_id")
        found[path.name] = json.dumps(record, sort_keys=True).encode()
    return found


@pytest.mark.parametrize("draft", [True, False])
def test_whole_shards_write_the_same_bytes_as_sample_batches(tmp_path, mixed, draft):
    shards, keys = mixed
    by_samples = run(str(shards), str(tmp_path / "samples"), settings=settings("samples", draft=draft))
    by_shards = run(str(shards), str(tmp_path / "shards"), settings=settings("shards", draft=draft))
    assert by_samples["parallel"] == "samples" and by_shards["parallel"] == "shards"
    assert outputs(tmp_path / "shards") == outputs(tmp_path / "samples")
    assert len(outputs(tmp_path / "shards")) == 12  # six shards and their records
    assert by_shards["failed"] == by_samples["failed"]
    reasons = {failure["key"]: failure["reason"] for failure in by_shards["failed"]}
    assert set(reasons) == {keys[5], keys[22], keys[12]}
    assert reasons[keys[12]] == "no JPEG/PNG member (members: cls, json, webp)"
    assert reasons[keys[5]].startswith(f"{keys[5]}.jpg: ")
    assert by_shards["samples_in"] == 36 and by_shards["samples_out"] == 33
    assert sorted(read_output(tmp_path / "shards")) == sorted(set(keys) - set(reasons))
    assert set(by_shards["stage_shares"]) == {"read", "decode", "resize", "convert", "write"}
    assert by_shards["stage_seconds"]["decode"] > 0 and by_shards["cpu_seconds"]["workers"] > 0
    index = json.loads((tmp_path / "shards" / "shardindex.json").read_text())
    assert index["shardlist"] == json.loads((tmp_path / "samples" / "shardindex.json").read_text())["shardlist"]


def test_a_rerun_skips_the_shards_done_by_whole_shards(tmp_path, mixed):
    shards, _keys = mixed
    out = tmp_path / "out"
    first = run(str(shards), str(out), settings=settings("shards"))
    written = outputs(out)
    again = run(str(shards), str(out), settings=settings("shards"))
    assert first["shards"] == 6 and again["shards"] == 0 and len(again["skipped"]) == 6
    assert outputs(out) == written
    assert journal.pending(storage.resolve(str(out))) == []


def test_auto_takes_whole_shards_only_where_they_keep_every_worker_busy(tmp_path, mixed):
    shards, _keys = mixed
    refs = resolve_shards(str(shards)).shards
    local = storage.resolve(str(tmp_path)).fs
    assert shardwise.applies(refs, local, 2) is None  # six shards, two workers
    assert shardwise.applies(refs, local, 4) == "6 shard(s) for 4 worker(s)"
    assert shardwise.applies(refs, local, 4, forced=True) is None
    few = run(str(shards), str(tmp_path / "few"), settings=settings("auto", cpu_workers=4))
    assert few["parallel"] == "samples" and "6 shard(s) for 4 worker(s)" in few["pools_basis"]
    many = run(str(shards), str(tmp_path / "many"), settings=settings("auto"))
    assert many["parallel"] == "shards" and outputs(tmp_path / "many") == outputs(tmp_path / "few")


def test_an_s3_output_goes_sample_by_sample_even_when_shards_are_asked(tmp_path, mixed, s3_bucket):
    shards, _keys = mixed
    result = run(str(shards), f"s3://{s3_bucket}/out", settings=settings("shards"))
    assert result["parallel"] == "samples" and "the output is not on local disk" in result["pools_basis"]
    assert result["samples_out"] == 33


def test_a_shard_found_bad_while_a_worker_writes_it_is_quarantined(tmp_path, mixed):
    shards, _keys = mixed
    copy = tmp_path / "in"
    copy.mkdir()
    for tar in shards.glob("*.tar"):
        (copy / tar.name).write_bytes(tar.read_bytes())
    bad = sorted(copy.glob("*.tar"))[2]
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])  # cut inside a member: found once its data is read
    result = run(str(copy), str(tmp_path / "out"), settings=settings("shards"))
    assert result["parallel"] == "shards"
    (item,) = result["quarantined"]
    assert item["name"] == bad.name and item["kind"] in ("truncated", "unreadable") and item["hint"], item
    assert not (tmp_path / "out" / bad.name).exists() and result["shards"] == 5
    assert bad.read_bytes() == data[: len(data) // 2]  # the input is left as it was
    assert journal.pending(storage.resolve(str(tmp_path / "out"))) == []
    assert not [path.name for path in (tmp_path / "out").iterdir() if path.name.startswith(".")]


def full_disk(*args, **kwargs):
    """Stands in for `preprocess_shard` on a full disk (module level: the worker imports it)."""
    raise OSError(28, "No space left on device")


def test_an_error_that_is_not_the_shards_stops_the_run_and_publishes_nothing(tmp_path, mixed, monkeypatch):
    shards, _keys = mixed
    out = tmp_path / "out"

    monkeypatch.setattr(shardwise, "preprocess_shard", full_disk)
    with pytest.raises(OSError, match="No space left"):
        run(str(shards), str(out), settings=settings("shards"))
    assert not list(out.glob("*.tar")) and journal.pending(storage.resolve(str(out))) == []


def test_a_worker_that_dies_loses_only_time_its_shards_are_redone_sample_by_sample(tmp_path):
    import numpy as np

    picture = jpeg_bytes(photo_like(np.random.default_rng(1), 48, 40))
    for number in range(4):
        members = [(f"s{number}k{k}.jpg", b"KILLS ITS WORKER" if (number, k) == (1, 4) else picture)
                   for k in range(8)]
        write_shard(tmp_path / "shards" / f"shard-{number:06d}.tar", members)
    result = run_crashing(tmp_path, tmp_path / "shards", tmp_path / "out", size=32, io_workers=1, cpu_workers=2,
                          batch_size=3, parallel="shards")
    assert result["parallel"] == "shards" and result["shards"] == 4 and result["out"] == 31
    assert result["failed"] == [{"shard": str(tmp_path / "shards" / "shard-000001.tar"), "key": "s1k4",
                                 "reason": f"s1k4.jpg: {WORKER_DIED.removeprefix('error: ')}"}]
    assert sorted(read_output(tmp_path / "out")) == sorted(f"s{n}k{k}" for n in range(4) for k in range(8)
                                                           if (n, k) != (1, 4))
    assert journal.pending(storage.resolve(str(tmp_path / "out"))) == []


ORPHAN = """
import subprocess, sys
import seedance_tasks.preprocess.pipeline as pipeline
from seedance_tasks.preprocess.shardwise import preprocess_shard
from seedance_tasks.shards.index import resolve_shards

gone = subprocess.Popen([sys.executable, "-c", "pass"])
gone.wait()
pipeline._pool_parent = gone.pid  # as in a worker whose run was killed while this shard was queued
preprocess_shard(resolve_shards(sys.argv[1]).shards[0], sys.argv[2], 32, True)
print("wrote")
"""


def test_a_worker_whose_run_died_starts_no_queued_shard(tmp_path, mixed):
    shards, _keys = mixed
    staged = tmp_path / "out" / ".staged.tar"
    done = subprocess.run([sys.executable, "-c", ORPHAN, str(shards), str(staged)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1 and "wrote" not in done.stdout, done.stderr
    assert not staged.exists()
