"""Chaos: checkpoint ingest (inbox -> store -> verify -> retire) killed -9 at each journal step and
manifest commit, and hit by a transient storage error at every fault point, then run again with
the same item (Airflow's retry, same lease holder), then the next scheduled run: the checkpoint
restores bit-exact, the raw file is retired exactly once, no journal is pending, no stray files."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from seedance_tasks import faults, journal, storage
from seedance_tasks.checkpoint import catalog, ingest
from seedance_tasks.checkpoint import store as ckstore
from tests.chaos.harness import points_hit, result_of, run_task
from tests.checkpoint.conftest import assert_same

TARGET = "seedance_tasks.checkpoint.ingest:ingest_one"
HOLDER = "airflow:seedance_checkpoints:chaos"
ENV = {"SEEDANCE__CHECKPOINT__INBOX_MIN_AGE": "0", "SEEDANCE__CHECKPOINT__WORKERS": "1"}
STATE = {"model": {"w": torch.arange(3000, dtype=torch.float32) / 7, "b": torch.ones(8)}, "step": 10}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("ingest")
    (root / "inbox" / "r").mkdir(parents=True)
    torch.save(STATE, root / "inbox" / "r" / "step-000010.pt")
    os.utime(root / "inbox" / "r" / "step-000010.pt", (0, 0))
    return root


def _work(tmp_path, pristine, name, monkeypatch):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    work = tmp_path / name
    shutil.copytree(pristine, work)
    item = {"path": "r/step-000010.pt", "run": "r", "step": 10, "size": 1}
    return work, {"item": item, "inbox_uri": str(work / "inbox"), "store_uri": str(work / "store"), "holder": HOLDER}


def _check(work):
    ckstore._CACHE.clear()
    assert catalog.committed_steps(storage.resolve(work / "store"), "r") == [10]
    assert_same(STATE, ckstore.load_state(str(work / "store"), "r", 10)[0])
    manifest = ckstore.read_manifest(storage.resolve(work / "store"), "r", 10)
    assert sorted(p.name for p in (work / "store" / "r" / "step-10").iterdir()) == sorted(["manifest.json",
                                                                                           *manifest["files"]])
    assert not (work / "inbox" / "r" / "step-000010.pt").exists()
    assert len(list((work / "inbox" / "_seedance" / "trash").rglob("step-000010.pt"))) == 1
    assert journal.pending(storage.resolve(work / "inbox")) == []


def retry_then_next(kwargs: dict) -> dict:
    """The same item again (Airflow's retry), then once more (a next run finding it done)."""
    ingest.ingest_one(**kwargs)
    return ingest.ingest_one(**kwargs)


@pytest.mark.parametrize("match", ["journal.", "ckpt.commit"])
def test_kill_9_at_each_journal_step_and_commit(tmp_path, pristine, monkeypatch, match):
    clean, kwargs = _work(tmp_path, pristine, "clean", monkeypatch)
    names = points_hit(TARGET, kwargs, match=match, env=ENV)
    assert names, match
    for index in range(1, len(names) + 1):
        work, kwargs = _work(tmp_path, pristine, f"{match}-{index}", monkeypatch)
        killed = run_task(TARGET, kwargs, fault_at=index, match=match, env=ENV)
        assert killed.returncode == -9, (names[index - 1], killed.stderr[-2000:])
        again = result_of(run_task("tests.chaos.test_checkpoint_chaos:retry_then_next", {"kwargs": kwargs}, env=ENV))
        assert again["status"] == "stored" and again["verified"], (names[index - 1], again)
        _check(work)


def test_a_transient_error_at_every_fault_point_is_fixed_by_the_retry(tmp_path, pristine, monkeypatch):
    clean, kwargs = _work(tmp_path, pristine, "clean", monkeypatch)
    with faults.tracing() as names:
        ingest.ingest_one(**kwargs)
    _check(clean)
    assert len(names) > 5
    for index in range(1, len(names) + 1):
        work, kwargs = _work(tmp_path, pristine, f"raise-{index}", monkeypatch)
        with faults.armed(at=index, mode="raise"), pytest.raises(faults.InjectedFault):
            ingest.ingest_one(**kwargs)
        again = retry_then_next(kwargs)
        assert again["status"] == "stored", (names[index - 1], again)
        _check(work)
