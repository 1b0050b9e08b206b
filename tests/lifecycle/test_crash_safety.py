"""kill -9 at random moments of `gc --apply` and of tiering: every kept checkpoint stays restorable
bit-exact right after the crash, and after the next run the job is finished (garbage gone, files on
their tier, no journal pending, no orphan copies)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from seedance_tasks import storage
from seedance_tasks.checkpoint.store import committed_steps, list_checkpoints
from seedance_tasks.lifecycle import journaled

from .conftest import assert_restorable, make_store

TRIALS = 6

# The child slows every file operation a little (test-side only) so random kills land at every
# point of the run: between manifest and data moves, mid-copy, between switch and retire.
CHILD = """
import json, sys, time
from datetime import UTC, datetime, timedelta
from seedance_tasks import storage
from seedance_tasks.lifecycle import tiering
PAUSE = float(sys.argv[5])
def slow(fn):
    def wrapper(*args, **kwargs):
        time.sleep(PAUSE)
        return fn(*args, **kwargs)
    return wrapper
storage.move = slow(storage.move)
storage.write_json_atomic = slow(storage.write_json_atomic)
tiering.copy_verified = slow(tiering.copy_verified)
from seedance_tasks.config import load_settings
from seedance_tasks.lifecycle import gc
mode, store, warm, cold = sys.argv[1:5]
settings = load_settings().lifecycle  # tier folders from the environment (trusted roots come from config)
assert (settings.tiers.warm.uri, settings.tiers.cold.uri) == (warm, cold)
settings.tiers.keep_latest_hot = False
HOLDER = "crash-test"  # a retry takes its own lease back, as a retried Airflow task does
print("ready", flush=True)
if mode == "gc":
    out = gc.collect(store, settings=settings, apply=True, keep_last=2, keep_every=40, holder=HOLDER)
    print(json.dumps({"deleted": out["checkpoints_deleted"]}), flush=True)
else:
    now = datetime.now(UTC)
    first = tiering.tier(store, settings=settings, apply=True, now=now + timedelta(hours=2), holder=HOLDER)
    second = tiering.tier(store, settings=settings, apply=True, now=now + timedelta(days=2), holder=HOLDER)
    print(json.dumps({"moved": first["moved"] + second["moved"]}), flush=True)
"""


def _start(mode, work):
    pause = "0.012" if mode == "gc" else "0.004"  # GC touches fewer files: slower steps, a similar span
    args = [sys.executable, "-c", CHILD, mode, str(work / "s"), str(work / "warm"), str(work / "cold"), pause]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert child.stdout.readline().strip() == "ready"
    return child


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    digests = make_store(root / "s", steps=range(0, 160, 10), keyframe_every=4)
    return root, digests


def _orphans(work):
    """Data files in tier folders that no manifest refers to (trash excluded)."""
    referenced = set()
    for row in list_checkpoints(str(work / "s")):
        from seedance_tasks.checkpoint.store import read_manifest

        manifest = read_manifest(storage.resolve(work / "s"), row["run"], row["step"])
        referenced.update(entry["uri"] for entry in manifest["files"].values() if entry.get("uri"))
    found = []
    for tier in ("warm", "cold"):
        for path in (work / tier).rglob("*"):
            if path.is_file() and "_seedance" not in path.parts and str(path) not in referenced:
                found.append(str(path))
    return found


@pytest.mark.parametrize("mode", ["gc", "tier"])
def test_kill_9_at_random_points_keeps_every_kept_checkpoint_restorable(tmp_path, pristine, mode, monkeypatch):
    source, digests = pristine
    kept = {0, 40, 80, 120, 140, 150} if mode == "gc" else set(digests)
    kept |= {b for s in list(kept) for b in _chain(source / "s", s)}
    expected = {s: digests[s] for s in kept}

    spans = []  # calibration: how long the run takes here (the faster of two, the first warms caches)
    for attempt in range(2):
        calibrate = tmp_path / f"calibrate-{attempt}"
        shutil.copytree(source, calibrate)
        monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__WARM__URI", str(calibrate / "warm"))
        monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__COLD__URI", str(calibrate / "cold"))
        child = _start(mode, calibrate)
        started = time.monotonic()
        child.wait(120)
        spans.append(time.monotonic() - started)
        assert child.returncode == 0
        assert set(committed_steps(storage.resolve(calibrate / "s"), "r")) == kept
    span = min(spans)

    rng = random.Random(20261129 + (mode == "tier"))
    outcomes = {"killed": 0, "finished": 0}
    for trial in range(TRIALS):
        work = tmp_path / f"trial-{trial}"
        shutil.copytree(source, work)
        monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__WARM__URI", str(work / "warm"))
        monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__COLD__URI", str(work / "cold"))
        child = _start(mode, work)
        time.sleep(rng.uniform(trial, trial + 1) / TRIALS * span * 1.05)  # stratified: every part of the run
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            outcomes["killed"] += 1
        else:
            outcomes["finished"] += 1
        child.wait(30)

        # right after the crash: every kept checkpoint restores bit-exact
        assert set(committed_steps(storage.resolve(work / "s"), "r")) >= kept, f"trial {trial}: kept step lost"
        assert_restorable(work / "s", "r", expected)

        # the next run finishes the job
        rerun = _start(mode, work)
        rerun.wait(120)
        assert rerun.returncode == 0, f"trial {trial}: recovery run failed"
        assert set(committed_steps(storage.resolve(work / "s"), "r")) == kept, f"trial {trial}: garbage left"
        assert_restorable(work / "s", "r", expected)
        store = storage.resolve(work / "s")
        assert journaled.pending(store, journaled.GC_KIND) == [] and journaled.pending(store, journaled.TIER_KIND) == []
        if mode == "tier":
            assert {row["tier"] for row in list_checkpoints(str(work / "s"))} == {"cold"}
            assert _orphans(work) == [], f"trial {trial}: orphan copies"
            assert not list((work / "s" / "r").rglob("*.bin")), f"trial {trial}: hot sources not retired"
    assert outcomes["killed"] >= 4, outcomes


def _chain(store, step):
    from seedance_tasks.checkpoint.store import read_manifest

    return [int(b) for b in read_manifest(storage.resolve(store), "r", step).get("chain", [])]
