"""Chaos: `gc --apply` and `tier --apply` killed -9 (or hit by one transient storage error) at
every fault point, then run again with the same inputs (Airflow's retry: same lease holder),
then the next scheduled run: the kept checkpoints are exactly the clean run's, each restores
bit-exact, no journal is left pending, and nothing outside the store and its tiers is touched."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from seedance_tasks import faults, journal, storage
from seedance_tasks.checkpoint import catalog
from seedance_tasks.lifecycle.tiering import TieringFailedError
from tests.chaos.harness import points_hit, result_of, run_task
from tests.lifecycle.conftest import assert_restorable, make_store

GC = "seedance_tasks.lifecycle.gc:collect"
TIER = "seedance_tasks.lifecycle.tiering:tier"
HOLDER = "airflow:seedance_checkpoint_lifecycle:chaos"


def _files(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


STEPS = {"gc": (0, 10, 20), "tier": (0,)}  # tiny: a test kills every one of some 15-30 points


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    found = {}
    for task, steps in STEPS.items():
        root = tmp_path_factory.mktemp(f"pristine-{task}")
        digests = make_store(root / "s", steps=steps, keyframe_every=3)
        (root / "outside").mkdir()
        (root / "outside" / "precious.bin").write_bytes(b"not the store's")
        found[task] = (root, digests)
    return found


def retry_then_next(target: str, kwargs: dict) -> dict:
    """Run the task again with the same inputs (Airflow's retry), then once more (the next
    scheduled run), in one process; the second run's result."""
    import importlib

    module, _, name = target.partition(":")
    function = getattr(importlib.import_module(module), name)
    function(**kwargs)
    return function(**next_run(kwargs))


def next_run(kwargs: dict) -> dict:
    """The inputs of the next scheduled run: another DAG run, so another lease holder (a retry
    reports what earlier attempts of its own holder did; the next run reports only its own work)."""
    return {**kwargs, "holder": f"{kwargs['holder']}-next"}


def _setup(tmp_path, pristine, name, monkeypatch):
    source, digests = pristine
    work = tmp_path / name
    shutil.copytree(source, work)
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__WARM__URI", str(work / "warm"))
    env = {"SEEDANCE__LIFECYCLE__TIERS__WARM__URI": str(work / "warm"),
           "SEEDANCE__LIFECYCLE__TIERS__WARM_AFTER": "0", "SEEDANCE__LIFECYCLE__TIERS__COLD_AFTER": "30d",
           "SEEDANCE__LIFECYCLE__TIERS__KEEP_LATEST_HOT": "false"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return work, digests, env


def _cases(work):
    store = str(work / "s")
    return {
        "gc": (GC, {"store_uri": store, "runs": ["r"], "apply": True, "keep_last": 1, "keep_every": 20,
                    "holder": HOLDER}),
        "tier": (TIER, {"store_uri": store, "apply": True, "holder": HOLDER}),
    }


def _check(work, digests, kept, outside, mode):
    location = storage.resolve(work / "s")
    assert catalog.committed_steps(location, "r") == kept
    assert_restorable(work / "s", "r", {step: digests[step] for step in kept})
    assert journal.pending(location) == []
    assert _files(work / "outside") == outside
    if mode == "tier":
        assert {catalog.read_manifest(location, "r", s)["files"][n]["tier"]
                for s in kept for n in catalog.read_manifest(location, "r", s)["files"]} == {"warm"}
        assert not list((work / "s" / "r").rglob("*.bin"))  # every source retired


@pytest.mark.parametrize("task", ["gc", "tier"])
def test_kill_9_at_every_fault_point_then_retry_then_next_run(tmp_path, stores, task, monkeypatch):
    pristine = stores[task]
    clean, digests, env = _setup(tmp_path, pristine, "clean", monkeypatch)
    target, kwargs = _cases(clean)[task]
    names = points_hit(target, kwargs, env=env)
    assert 5 <= len(names) < 40, names
    expected = catalog.committed_steps(storage.resolve(clean / "s"), "r")
    outside = _files(clean / "outside")
    for index in range(1, len(names) + 1):
        work, _, env = _setup(tmp_path, pristine, f"kill-{index}", monkeypatch)
        target, kwargs = _cases(work)[task]
        killed = run_task(target, kwargs, fault_at=index, env=env)
        assert killed.returncode == -9, (index, names[index - 1], killed.stderr[-2000:])
        # Airflow's retry (same inputs, same holder), then the next scheduled run: nothing left to do
        again = result_of(run_task("tests.chaos.test_lifecycle_chaos:retry_then_next",
                                   {"target": target, "kwargs": kwargs}, env=env))
        assert again.get("checkpoints_deleted", again.get("moved")) == 0, (index, names[index - 1])
        _check(work, digests, expected, outside, task)


@pytest.mark.parametrize("task", ["gc", "tier"])
def test_a_transient_error_at_every_fault_point_is_fixed_by_the_retry(tmp_path, stores, task, monkeypatch):
    pristine = stores[task]
    import importlib

    clean, digests, _env = _setup(tmp_path, pristine, "clean", monkeypatch)
    target, kwargs = _cases(clean)[task]
    module, _, name = target.partition(":")
    function = getattr(importlib.import_module(module), name)
    with faults.tracing() as names:
        function(**kwargs)
    expected = catalog.committed_steps(storage.resolve(clean / "s"), "r")
    outside = _files(clean / "outside")
    for index in range(1, len(names) + 1):
        work, _, _env = _setup(tmp_path, pristine, f"raise-{index}", monkeypatch)
        _target, kwargs = _cases(work)[task]
        with faults.armed(at=index, mode="raise"), pytest.raises(Exception) as raised:
            function(**kwargs)
        # tiering rolls a failed run back and reports it once the other runs are done, the fault as the cause
        assert isinstance(raised.value, faults.InjectedFault) or (
            isinstance(raised.value, TieringFailedError) and isinstance(raised.value.__cause__, faults.InjectedFault))
        function(**kwargs)  # the retry
        again = function(**next_run(kwargs))
        assert again.get("checkpoints_deleted", again.get("moved")) == 0, (index, names[index - 1])
        _check(work, digests, expected, outside, task)
