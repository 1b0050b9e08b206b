"""DAG `seedance_checkpoints`, run for real: inbox -> store (mapped per checkpoint) -> verify -> retire."""

from __future__ import annotations

import os
import pickle

import torch

from seedance_tasks import checkpoint
from seedance_tasks.checkpoint import store as ckstore
from tests.conftest import xcom_value

from .conftest import assert_same
from .test_integrity import _Exploit


def _drop(inbox, run, step, state):
    (inbox / run).mkdir(parents=True, exist_ok=True)
    path = inbox / run / f"step-{step:06d}.pt"
    torch.save(state, path)
    old = path.stat().st_mtime - 3600
    os.utime(path, (old, old))  # older than the inbox's minimum age
    return path


def test_dag_compresses_the_inbox_verifies_and_retires(tmp_path, run_dag, gpt_states, dagbag):
    ckstore._CACHE.clear()
    inbox, store = tmp_path / "inbox", tmp_path / "store"
    for step, state in gpt_states[:3]:
        _drop(inbox, "gpt", step, state)
    marker = tmp_path / "pwned"
    with open(inbox / "gpt" / "step-000099.pt", "wb") as handle:
        pickle.dump({"x": _Exploit(marker)}, handle)
    os.utime(inbox / "gpt" / "step-000099.pt", (0, 0))
    (inbox / "notes.txt").write_text("not a checkpoint")
    fresh = _drop(inbox, "gpt", 40, gpt_states[3][1])
    os.utime(fresh, None)  # just written: too young

    dag = dagbag.dags["seedance_checkpoints"]
    assert dag.params["codec"] is None and not dagbag.import_errors  # empty: checkpoint.codec from config
    conf = {"inbox": str(inbox), "store": str(store), "min_age": "10m"}
    run = run_dag("seedance_checkpoints", conf)
    assert run.state == "success"
    summary = xcom_value(run, "report")
    assert summary["by_status"] == {"stored": 3, "quarantined": 1}
    assert summary["ratio"] > 1.0 and summary["raw_bytes"] > 3_000_000
    assert [p["path"] for p in summary["problems"]] == ["gpt/step-000099.pt"]
    assert {s["path"] for s in summary["skipped"]} == {"notes.txt", "gpt/step-000040.pt"}
    assert not marker.exists()
    # stored, verified, and the raw files retired to the inbox trash (not deleted)
    rows = ckstore.list_checkpoints(str(store), "gpt")
    assert [(r["step"], r["base"]) for r in rows] == [(0, None), (10, 0), (20, 0)]  # in step order, whatever
    # order the mapped tasks ran in
    assert sorted(p.name for p in (inbox / "gpt").iterdir()) == ["step-000040.pt"]
    trashed = sorted(p.name for p in (inbox / "_seedance" / "trash").rglob("*.pt"))
    assert trashed == ["step-000000.pt", "step-000010.pt", "step-000020.pt"]
    assert list((inbox / "_seedance" / "quarantine").rglob("step-000099.pt"))
    ckstore._CACHE.clear()
    assert_same(gpt_states[2][1], checkpoint.load(str(store), "gpt", 20))
    # a second run finds nothing ready (an empty mapping) and changes nothing
    again = run_dag("seedance_checkpoints", conf)
    assert again.state == "success"
    assert xcom_value(again, "report")["files"] == 0
    assert [r["step"] for r in ckstore.list_checkpoints(str(store), "gpt")] == [0, 10, 20]


def test_dag_finishes_a_save_whose_raw_file_was_not_retired(tmp_path, run_dag, gpt_states):
    """A crash after commit and before retire: the next run sees the same content stored and retires."""
    ckstore._CACHE.clear()
    inbox, store = tmp_path / "inbox", tmp_path / "store"
    _drop(inbox, "r", 0, gpt_states[0][1])
    checkpoint.save(gpt_states[0][1], str(store), "r", 0)  # committed, raw file still in the inbox
    _drop(inbox, "r", 10, gpt_states[1][1])
    checkpoint.save(gpt_states[2][1], str(store), "r", 10)  # a different checkpoint under step 10: conflict
    run = run_dag("seedance_checkpoints", {"inbox": str(inbox), "store": str(store), "min_age": "0"})
    assert run.state == "success"
    summary = xcom_value(run, "report")
    assert summary["by_status"] == {"already stored": 1, "conflict": 1}
    assert sorted(p.name for p in (inbox / "r").iterdir()) == ["step-000010.pt"]  # conflict left for a person
    ckstore._CACHE.clear()
    assert_same(gpt_states[0][1], checkpoint.load(str(store), "r", 0))
