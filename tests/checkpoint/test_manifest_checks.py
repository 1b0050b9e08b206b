"""What a manifest must hold for a restore, checked at parse: unique tensor names, sizes that fit,
the seal over what a restore reads, the int limit and steps the writer refuses up front, and
passes over a store that go on past one damaged manifest (and refuse a store that is not there)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from seedance_tasks import checkpoint
from seedance_tasks.checkpoint import store as ckstore
from seedance_tasks.checkpoint.manifest import MAX_INT_DIGITS
from seedance_tasks.cli import app
from seedance_tasks.config import load_settings
from seedance_tasks.errors import IntegrityError, UsageError
from seedance_tasks.lifecycle import gc, report, tiering

from . import format1


def _path(store, run="r", step=0):
    return store / run / f"step-{step}" / "manifest.json"


def _edit(store, change, run="r", step=0, unseal=False):
    path = _path(store, run, step)
    manifest = json.loads(path.read_text())
    if unseal:  # as a manifest from before the seal: the check of its own comes into play
        manifest.pop("manifest_blake3")
    change(manifest)
    path.write_text(json.dumps(manifest))
    return str(path)


def _saved(tmp_path, state=None):
    store = tmp_path / "s"
    checkpoint.save(state or {"w": torch.randn(1000), "b": torch.randn(10)}, str(store), "r", 0, codec="zstd")
    return store


# --------------------------------------------------------------------------- what get relies on


def _dup(manifest):
    manifest["tensors"][1]["name"] = manifest["tensors"][0]["name"]


def _past_end(manifest):
    chunk = manifest["tensors"][0]["chunks"][0]
    chunk["offset"] = manifest["files"][chunk["file"]]["size"]


def _overlap(manifest):
    first, second = manifest["tensors"][0]["chunks"][0], manifest["tensors"][1]["chunks"][0]
    second["file"], second["offset"] = first["file"], first["offset"]


def _shape(manifest):
    manifest["tensors"][0]["shape"] = [999]


def _depth(manifest):
    manifest["depth"] = 3


@pytest.mark.parametrize(("change", "field", "words"), [
    (_dup, "tensors[1].name", "is also the name of tensors[0]"),
    (_past_end, "chunks[0]", "past the end"),
    (_overlap, "chunks[0]", "overlap"),
    (_shape, ".shape", "does not hold its nbytes"),
    (_depth, "depth", "is not the length of its chain"),
])
def test_verify_refuses_what_get_would_fail_on_naming_manifest_and_key(tmp_path, change, field, words):
    store = _saved(tmp_path)
    where = _edit(store, change, unseal=True)
    result = ckstore.verify_run(str(store), "r")
    assert not result["ok"] and result["checked"] == []
    message = result["damaged"][0]["error"]
    assert where in message and field in message and words in message
    with pytest.raises(IntegrityError) as caught:
        checkpoint.load(str(store), "r", 0)
    assert where in caught.value.message and caught.value.hint


def test_duplicate_name_is_refused_with_the_name(tmp_path):
    store = _saved(tmp_path)
    _edit(store, _dup, unseal=True)
    with pytest.raises(IntegrityError, match=r"tensors\[1\]\.name: 'w' is also the name of tensors\[0\]"):
        checkpoint.load(str(store), "r", 0)


# --------------------------------------------------------------------------- the seal


def _retype(manifest):
    manifest["tensors"][0].update(dtype="int32", stored_dtype="int32")


def _reshape(manifest):
    manifest["tensors"][0]["shape"] = [2, 1]


@pytest.mark.parametrize("change", [_retype, _reshape])
def test_a_hand_edit_with_the_same_byte_count_is_detected(tmp_path, change):
    store = _saved(tmp_path, {"w": torch.tensor([1.0, 2.0])})
    where = _edit(store, change)
    result = ckstore.verify_run(str(store), "r")
    assert not result["ok"] and "manifest_blake3" in result["damaged"][0]["error"]
    assert where in result["damaged"][0]["error"]
    with pytest.raises(IntegrityError, match="changed after the save"):
        checkpoint.load(str(store), "r", 0)


def test_a_sealed_field_edited_is_detected(tmp_path):
    store = _saved(tmp_path, {"w": torch.tensor([1.0, 2.0]), "n": 5})
    _edit(store, lambda m: m.update(tree=json.loads(json.dumps(m["tree"]).replace('"5"', '"6"'))))
    with pytest.raises(IntegrityError, match=r"tree: does not match its digest"):
        checkpoint.load(str(store), "r", 0)


def test_a_manifest_without_the_seal_stays_readable(tmp_path):
    store = _saved(tmp_path, {"w": torch.tensor([1.0, 2.0])})
    assert "manifest_blake3" in json.loads(_path(store).read_text())
    _edit(store, lambda m: None, unseal=True)
    assert ckstore.verify_run(str(store), "r")["ok"]
    assert torch.equal(checkpoint.load(str(store), "r", 0)["w"], torch.tensor([1.0, 2.0]))


def test_format1_fixture_still_verifies_and_restores(tmp_path):
    store = format1.copy_store(tmp_path / "f1")
    for step, expected in format1.expected().items():
        assert ckstore.verify_run(str(store), format1.RUN, step)["ok"]
        assert format1.fingerprint(checkpoint.load(str(store), format1.RUN, step)) == expected


# --------------------------------------------------------------------------- what save refuses up front


@pytest.mark.parametrize(("state", "path"), [
    ({"w": torch.ones(1), "n": 10**4100}, "n"),
    ({"w": torch.ones(1), "opt": {"state": [1, {"count": -(10**4200)}]}}, "opt/state/1/count"),
    ({"w": torch.ones(1), "huge": 10**5000}, "huge"),  # past Python's own int/str limit too
    ({"w": torch.ones(1), "keys": {10**4100: 1}}, "(a key)"),
])
def test_save_refuses_an_int_the_reader_would_refuse(tmp_path, state, path):
    with pytest.raises(UsageError) as caught:
        checkpoint.save(state, str(tmp_path / "s"), "r", 0)
    assert path in caught.value.message and str(MAX_INT_DIGITS) in caught.value.message
    assert not (tmp_path / "s" / "r" / "step-0").exists()


def test_an_int_at_the_limit_round_trips(tmp_path):
    big = -(10**MAX_INT_DIGITS - 1)  # MAX_INT_DIGITS digits
    checkpoint.save({"w": torch.ones(1), "n": big}, str(tmp_path / "s"), "r", 0)
    assert checkpoint.load(str(tmp_path / "s"), "r", 0)["n"] == big


@pytest.mark.parametrize(("digits", "readable"), [(MAX_INT_DIGITS, True), (MAX_INT_DIGITS + 1, False)])
def test_the_reader_takes_ints_up_to_the_same_limit(tmp_path, digits, readable):
    store = _saved(tmp_path, {"w": torch.ones(1), "n": 5})
    _edit(store, lambda m: m.update(tree=json.loads(json.dumps(m["tree"]).replace('"5"', f'"{"7" * digits}"'))),
          unseal=True)
    if readable:
        assert checkpoint.load(str(store), "r", 0)["n"] == int("7" * digits)
    else:
        with pytest.raises(IntegrityError, match="int node"):
            checkpoint.load(str(store), "r", 0)


@pytest.mark.parametrize("step", [1.5, 2.0, True, -1, "3", np.float64(4), 2**63])
def test_save_refuses_a_step_that_is_not_a_whole_number(tmp_path, step):
    with pytest.raises(UsageError, match="step must be"):
        checkpoint.save({"w": torch.ones(1)}, str(tmp_path / "s"), "r", step)
    assert not (tmp_path / "s" / "r").exists()


def test_save_takes_a_numpy_integer_step(tmp_path):
    assert checkpoint.save({"w": torch.ones(1)}, str(tmp_path / "s"), "r", np.int64(7))["step"] == 7


# --------------------------------------------------------------------------- one damaged manifest in a store


def _two_runs(root):
    for run in ("r", "r2"):
        for step in range(5):
            checkpoint.save({"w": torch.ones(10) * step}, str(root), run, step, codec="zstd")
    (root / "r2" / "step-2" / "manifest.json").write_text("{")
    return str(root / "r2" / "step-2" / "manifest.json")


def _files(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def test_ls_lists_the_other_runs_and_fails_at_the_end(tmp_path):
    where = _two_runs(tmp_path / "s")
    result = CliRunner().invoke(app, ["ckpt", "ls", "--store", str(tmp_path / "s"), "--json"])
    assert result.exit_code == 4
    assert where in result.output and "hint:" in result.output
    damaged = []
    rows = ckstore.list_checkpoints(str(tmp_path / "s"), damaged=damaged)
    assert [(r["run"], r["step"]) for r in rows] == [("r", s) for s in range(5)] + [("r2", s) for s in (0, 1, 3, 4)]
    assert [d["manifest"] for d in damaged] == [where] and damaged[0]["hint"]
    with pytest.raises(IntegrityError):
        ckstore.list_checkpoints(str(tmp_path / "s"))


def test_gc_collects_the_other_runs_and_leaves_the_damaged_run_alone(tmp_path):
    root = tmp_path / "s"
    where = _two_runs(root)
    before = {k: v for k, v in _files(root).items() if k.startswith("r2/")}
    result = gc.collect(str(root), apply=True, keep_last=1, keep_every=None, keep_best=None)
    assert [d["manifest"] for d in result["damaged"]] == [where]
    by_run = {p["run"]: p for p in result["runs"]}
    assert by_run["r"]["delete"] and by_run["r2"]["delete"] == [] and by_run["r2"]["strays"] == []
    assert not (root / "r" / "step-1").exists()
    assert {k: v for k, v in _files(root).items() if k.startswith("r2/")} == before
    cli = CliRunner().invoke(app, ["ckpt", "gc", "--store", str(root), "--keep-last", "1"])
    assert cli.exit_code == 4 and where in cli.output and "nothing of their runs was collected" in cli.output


def test_tier_moves_the_other_runs_and_leaves_the_damaged_run_alone(tmp_path, monkeypatch):
    root = tmp_path / "s"
    where = _two_runs(root)
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__WARM__URI", str(tmp_path / "warm"))
    settings = load_settings().lifecycle.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    before = {k: v for k, v in _files(root).items() if k.startswith("r2/")}
    result = tiering.tier(str(root), settings=settings, now=datetime.now(UTC) + timedelta(hours=2), apply=True)
    assert [d["manifest"] for d in result["damaged"]] == [where]
    assert {m["run"] for m in result["moves"]} == {"r"} and result["moved"] == 5
    assert {k: v for k, v in _files(root).items() if k.startswith("r2/")} == before
    cli = CliRunner().invoke(app, ["ckpt", "tier", "--store", str(root)])
    assert cli.exit_code == 4 and where in cli.output


def test_cost_counts_the_other_runs_and_fails_at_the_end(tmp_path):
    where = _two_runs(tmp_path / "s")
    result = report.store_report(str(tmp_path / "s"))
    assert result["checkpoints"] == 9 and [d["manifest"] for d in result["damaged"]] == [where]
    cli = CliRunner().invoke(app, ["ckpt", "cost", "--store", str(tmp_path / "s")])
    assert cli.exit_code == 4 and where in cli.output


# --------------------------------------------------------------------------- a store that is not there


@pytest.mark.parametrize("args", [
    ["ls"], ["get", "--run", "r", "--out", "OUT"], ["verify", "--run", "r"], ["gc"], ["tier"], ["cost"],
])
def test_a_missing_store_is_an_error_with_a_hint(tmp_path, args):
    missing = str(tmp_path / "no" / "such")
    args = [a.replace("OUT", str(tmp_path / "x.pt")) for a in args]
    result = CliRunner().invoke(app, ["ckpt", args[0], "--store", missing, *args[1:]])
    assert result.exit_code != 0
    assert f"checkpoint store {missing} does not exist" in result.output and "hint:" in result.output
    assert not (tmp_path / "no").exists()


def test_an_empty_store_lists_empty(tmp_path):
    (tmp_path / "s").mkdir()
    result = CliRunner().invoke(app, ["ckpt", "ls", "--store", str(tmp_path / "s"), "--json"])
    assert result.exit_code == 0 and json.loads(result.output) == []


def test_the_dag_task_of_a_run_with_a_damaged_manifest_fails(tmp_path, monkeypatch):
    from seedance_tasks import dag_support
    from seedance_tasks.lifecycle import airflow_tasks

    monkeypatch.setattr(dag_support, "airflow_lease_holder", lambda: "airflow-test")

    where = _two_runs(tmp_path / "s")
    item = {"store": str(tmp_path / "s"), "apply": False, "overrides": {}}
    assert airflow_tasks.gc_task({**item, "run": "r"})["kept"] >= 1
    with pytest.raises(Exception, match="damaged manifest") as caught:
        airflow_tasks.gc_task({**item, "run": "r2"})
    assert where in str(caught.value)
    with pytest.raises(Exception, match="damaged manifest"):
        airflow_tasks.tier_task({**item, "run": "r2", "cost": {}})
