"""The preprocessing pipeline: exactly-once output, bad samples reported, hostile tars quarantined
(more in test_quarantine.py), foreign shards and S3, the iterable dataset, tuning, and the DAG run."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from seedance_tasks import storage
from seedance_tasks.cli import app
from seedance_tasks.preprocess.run import QUARANTINE_DIR, run
from seedance_tasks.preprocess.settings import PreprocessSettings
from seedance_tasks.shards.build import build
from seedance_tasks.shards.sample import make_sample_files
from seedance_tasks.shards.settings import ShardSettings
from tests.conftest import xcom_value
from tests.preprocess.conftest import read_output

SIZE = 32
SETTINGS = PreprocessSettings(size=SIZE, io_workers=2, cpu_workers=2, batch_size=4)


@pytest.fixture
def shards(tmp_path):
    src = tmp_path / "src"
    keys = make_sample_files(src, 30, corrupt=(4, 17), png=(9,))
    Image.new("RGB", (80, 40), (200, 10, 30)).save(src / f"{keys[0]}.jpg", format="JPEG", quality=95)
    # check_decode off: the corrupt JPEGs must reach the pipeline, which reports them itself
    build(str(src), str(tmp_path / "shards"),
          settings=ShardSettings(max_samples=7, required_members=["cls"], check_decode=False))
    return tmp_path / "shards", keys


def test_every_sample_comes_out_exactly_once_and_bad_ones_are_reported(tmp_path, shards):
    shard_dir, keys = shards
    result = run(str(shard_dir), str(tmp_path / "out"), settings=SETTINGS)
    output = read_output(tmp_path / "out")
    failed = {(Path(f["shard"]).name, f["key"]) for f in result["failed"]}
    assert {key for _shard, key in failed} == {keys[4], keys[17]}
    assert sorted(list(output) + [key for _shard, key in failed]) == keys  # exactly once
    assert ("shard-000000.tar", keys[4]) in failed and ("shard-000002.tar", keys[17]) in failed
    assert result["samples_in"] == 30 and result["samples_out"] == 28
    for key, members in output.items():
        array = np.load(io.BytesIO(members["npy"]))
        assert array.dtype == np.uint8 and array.shape == (3, SIZE, SIZE)
        assert set(members) == {"npy", "cls", "json"}
        assert int(members["cls"]) == int(key[-6:]) % 10
    red = np.load(io.BytesIO(output[keys[0]]["npy"]))  # really decoded: a red picture stays red
    assert abs(int(red[0].mean()) - 200) < 8 and red[1].mean() < 25 and red[2].mean() < 45
    shares = result["stage_shares"]
    assert set(shares) == {"read", "decode", "resize", "convert", "write"}
    assert abs(sum(shares.values()) - 1) < 0.01 and result["samples_per_s"] > 0
    index = json.loads((tmp_path / "out" / "shardindex.json").read_text())
    assert sum(entry["nsamples"] for entry in index["shardlist"]) == 28 and index["seedance"]["failed"] == 2


def test_rerun_skips_finished_shards(tmp_path, shards):
    shard_dir, _keys = shards
    first = run(str(shard_dir), str(tmp_path / "out"), settings=SETTINGS)
    again = run(str(shard_dir), str(tmp_path / "out"), settings=SETTINGS)
    assert first["shards"] == 5 and again["shards"] == 0 and len(again["skipped"]) == 5
    assert len(read_output(tmp_path / "out")) == 28


def test_a_hostile_tar_is_quarantined_and_the_other_shards_published(tmp_path, shards):
    shard_dir, _keys = shards
    with tarfile.open(shard_dir / "shard-000003.tar", "a") as archive:  # append a link to a good shard
        info = tarfile.TarInfo("zz.jpg")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        archive.addfile(info)
    out = tmp_path / "out"
    result = run(str(shard_dir), str(out), settings=SETTINGS)
    (item,) = result["quarantined"]
    assert item["name"] == "shard-000003.tar" and item["member"] == "zz.jpg" and "symbolic link" in item["error"]
    assert sorted(path.name for path in out.glob("*.tar")) == [f"shard-00000{n}.tar" for n in (0, 1, 2, 4)]
    assert (out / QUARANTINE_DIR / "shard-000003.tar.json").is_file() and (shard_dir / "shard-000003.tar").is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_foreign_shards_by_brace_pattern(tmp_path):
    import webdataset as wds

    from seedance_tasks.shards.sample import jpeg_bytes, photo_like

    rng = np.random.default_rng(1)
    for shard in range(2):
        with wds.TarWriter(str(tmp_path / f"data-{shard:06d}.tar")) as writer:
            for number in range(5):
                writer.write({"__key__": f"s{shard}/k{number}", "jpeg": jpeg_bytes(photo_like(rng, 50, 70)),
                              "txt": "hello"})
    result = run(str(tmp_path / "data-{000000..000001}.tar"), str(tmp_path / "out"), settings=SETTINGS)
    assert result["samples_out"] == 10 and not result["failed"]
    assert sorted(read_output(tmp_path / "out")) == sorted(f"s{s}/k{n}" for s in range(2) for n in range(5))


def test_s3_shards_in_and_out(tmp_path, s3_bucket):
    make_sample_files(tmp_path / "src", 12, corrupt=(3,))
    shards_uri, out_uri = f"s3://{s3_bucket}/shards", f"s3://{s3_bucket}/out"
    build(str(tmp_path / "src"), shards_uri, settings=ShardSettings(max_samples=5, check_decode=False))
    result = run(shards_uri, out_uri, settings=SETTINGS)
    assert result["samples_out"] == 11 and [f["key"] for f in result["failed"]] == ["sample-000003"]
    from seedance_tasks.shards.verify import verify

    report = verify(out_uri)
    assert report["ok"] and report["samples"] == 11 and report["shards"] == 3


def test_dataset_splits_shards_across_ranks_and_yields_arrays(shards):
    from seedance_tasks.preprocess import ShardDataset

    shard_dir, keys = shards
    seen = []
    for rank in range(2):
        dataset = ShardDataset(str(shard_dir), size=SIZE, io_workers=1, cpu_workers=1, rank=rank, world_size=2)
        samples = list(dataset)
        assert len(samples) + len(dataset.failed) == len(dataset)
        seen += [sample["__key__"] for sample in samples] + [f["key"] for f in dataset.failed]
        for sample in samples:
            assert sample["image"].shape == (3, SIZE, SIZE) and sample["image"].dtype == np.uint8
            assert sample["cls"] == int(sample["__key__"][-6:]) % 10 and sample["json"]["number"] >= 0
    assert sorted(seen) == keys


def test_tune_prints_the_table_it_chose_from(shards):
    shard_dir, _keys = shards
    result = CliRunner().invoke(app, ["preprocess", "tune", "--shards", str(shard_dir), "--samples", "12",
                                      "--size", str(SIZE), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["table"]) >= 4 and all(row["samples"] == 12 for row in report["table"])
    best = max(report["table"], key=lambda row: row["samples_per_s"])
    assert report["chosen"] == {"io_workers": best["io_workers"], "cpu_workers": best["cpu_workers"]}


@pytest.mark.parametrize("parallel", ["samples", "shards"])
def test_cli_run_json(tmp_path, shards, parallel):
    shard_dir, _keys = shards
    result = CliRunner().invoke(app, ["preprocess", "run", "--shards", str(shard_dir), "--out", str(tmp_path / "o"),
                                      "--size", str(SIZE), "--io-workers", "1", "--cpu-workers", "1",
                                      "--parallel", parallel, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["samples_out"] == 28 and len(report["failed"]) == 2
    assert report["parallel"] == parallel and report["io_workers"] == (1 if parallel == "samples" else 0)


def test_cli_run_names_a_bad_parallel_value(tmp_path, shards):
    shard_dir, _keys = shards
    result = CliRunner().invoke(app, ["preprocess", "run", "--shards", str(shard_dir), "--out", str(tmp_path / "o"),
                                      "--parallel", "threads"])
    assert result.exit_code != 0 and "parallel" in result.output and "Traceback" not in result.output


def test_preprocess_dag_builds_verifies_and_preprocesses(tmp_path, run_dag):
    src = tmp_path / "src"
    keys = make_sample_files(src, 20, corrupt=(6,))
    (src / f"{keys[11]}.cls").unlink()  # incomplete: rejected at build time, reported
    dag_run = run_dag("seedance_preprocess", {
        "source": str(src), "shard_size": "16KiB", "image_size": SIZE, "io_workers": 1, "cpu_workers": 1,
        "shards_per_group": 2,
    })
    assert dag_run.state == "success"
    built = xcom_value(dag_run, "build_shards")  # the corrupt JPEG is rejected at build (check_decode)
    assert built["rejected"] == 2 and built["samples"] == 18 and built["shard_count"] >= 3
    summary = xcom_value(dag_run, "finalize")
    assert summary["samples_out"] == 18 and summary["failed"] == 0 and summary["rejected_at_build"] == 2
    mapped = [ti for ti in dag_run.get_task_instances() if ti.task_id == "preprocess"]
    assert len(mapped) == -(-built["shard_count"] // 2) and all(ti.state == "success" for ti in mapped)
    output = read_output(Path(summary["out"]))
    assert sorted(output) == sorted(set(keys) - {keys[6], keys[11]})


def test_preprocess_dag_fails_at_finalize_when_its_only_shard_is_hostile(tmp_path, run_dag):
    shards_dir = tmp_path / "foreign"
    shards_dir.mkdir()
    with tarfile.open(shards_dir / "data-000000.tar", "w") as archive:
        info = tarfile.TarInfo("../../escape.jpg")
        info.size = 3
        archive.addfile(info, io.BytesIO(b"abc"))
    dag_run = run_dag("seedance_preprocess", {"source": str(shards_dir), "source_kind": "shards",
                                              "out": str(tmp_path / "out")})
    assert dag_run.state == "failed"
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert states["build_shards"] == "success" and states["verify_shards"] == "success"
    assert states["preprocess"] == "success" and states["finalize"] == "failed"  # nothing left to announce
    out = tmp_path / "out"
    assert (out / QUARANTINE_DIR / "data-000000.tar.json").is_file()
    assert not (out / "shardindex.json").exists() and not list(out.glob("*.tar"))


def test_an_output_another_run_is_writing_is_refused_naming_the_holder(tmp_path, shards):
    from seedance_tasks import lease
    from seedance_tasks.lease import LeaseHeldError

    shard_dir, _keys = shards
    out = storage.resolve(str(tmp_path / "out"))
    held = lease.acquire(out, "dataset", holder="airflow:seedance_preprocess:manual__9", purpose="preprocess")
    try:
        with pytest.raises(LeaseHeldError, match="airflow:seedance_preprocess:manual__9"):
            run(str(shard_dir), str(tmp_path / "out"), settings=SETTINGS)
        result = CliRunner().invoke(app, ["preprocess", "run", "--shards", str(shard_dir), "--out", str(tmp_path / "out"),
                                          "--size", str(SIZE), "--io-workers", "1", "--cpu-workers", "1"])
        assert result.exit_code == 5 and "manual__9" in result.output and "hint:" in result.output
        assert not list((tmp_path / "out").glob("*.tar"))
    finally:
        held.release()


def test_a_tampered_done_record_is_refused_by_finalize(tmp_path, shards):
    from seedance_tasks.errors import IntegrityError
    from seedance_tasks.preprocess.run import DONE_DIR, finalize

    shard_dir, _keys = shards
    run(str(shard_dir), str(tmp_path / "out"), settings=SETTINGS)
    record_path = tmp_path / "out" / DONE_DIR / "shard-000000.tar.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "name": "../../etc/passwd"}))
    with pytest.raises(IntegrityError, match="shard-000000.tar.json"):
        finalize(str(tmp_path / "out"))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="zombies are told apart through /proc (Linux)")
def test_a_dead_parent_not_reaped_yet_counts_as_gone_for_the_workers():
    """Killed while whoever started it still reads its output, a run is a zombie: its CPU workers
    must still see it gone (else they keep that output open and both wait for ever)."""
    import os
    import subprocess
    import sys
    import time

    from seedance_tasks.preprocess.pipeline import parent_gone

    assert not parent_gone(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = Path(f"/proc/{child.pid}/stat")
    try:
        for _ in range(3000):  # until it has exited (not reaped: a zombie); a guard, not a timing
            if stat.read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z":
                break
            time.sleep(0.01)
        assert stat.read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z"
        assert parent_gone(child.pid)
    finally:
        child.wait()
    assert parent_gone(child.pid)  # reaped: no such process


def test_a_group_failed_for_good_frees_the_output_for_the_next_run(tmp_path, shards, run_dag, monkeypatch):
    """One mapped `preprocess` task fails for good (finalize never runs): the teardown releases
    the output's lease, the run stays `failed`, and the next run (or the CLI) is not refused
    for the lease's TTL: it publishes the groups left and writes the index."""
    from seedance_tasks import lease
    from seedance_tasks.errors import RefusedError
    from seedance_tasks.preprocess import run as preprocess_run

    shard_dir, _keys = shards
    out = tmp_path / "out"
    conf = {"source": str(shard_dir), "source_kind": "shards", "out": str(out), "image_size": SIZE,
            "io_workers": 1, "cpu_workers": 1, "shards_per_group": 2, "check_decode": False}
    doomed: list = []

    def first_group_fails(shards_uri, out_uri, **kwargs):
        doomed[:] = doomed or [kwargs["only"]]
        if kwargs["only"] == doomed[0]:
            raise RefusedError("injected: this group cannot be preprocessed", hint="a test")
        return run(shards_uri, out_uri, **kwargs)

    monkeypatch.setattr(preprocess_run, "run", first_group_fails)
    failed = run_dag("seedance_preprocess", conf)
    monkeypatch.setattr(preprocess_run, "run", run)
    assert failed.state == "failed"
    states = {(ti.task_id, ti.map_index): ti.state for ti in failed.get_task_instances()}
    assert "failed" in {state for (task, _), state in states.items() if task == "preprocess"}
    assert states[("finalize", -1)] == "upstream_failed" and states[("release_leases", -1)] == "success"
    assert lease.current(storage.resolve(str(out)), "dataset") is None
    again = run_dag("seedance_preprocess", conf)
    assert again.state == "success"
    assert xcom_value(again, "finalize")["output_shards"] == len(list(shard_dir.glob("*.tar")))
