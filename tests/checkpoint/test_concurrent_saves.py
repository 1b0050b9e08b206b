"""Two saves of one run+step at once: exactly one commits, the loser fails clearly and leaves
nothing behind, and the step restores bit-exact to the winner's state (local disk and S3)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import torch

from seedance_tasks import checkpoint, storage
from seedance_tasks.checkpoint import store as ckstore
from seedance_tasks.checkpoint.store import StepCommittedError
from tests.chaos.harness import REPO, _environment

from .conftest import assert_same

TRIALS = 4

# Each child saves its own state of steps 0..TRIALS-1, meeting the other child at a file barrier
# before each save, so both saves of a step run at the same moment.
CHILD = """
import json, os, sys, time, torch
from seedance_tasks import checkpoint
from seedance_tasks.checkpoint.store import StepCommittedError
store, me, other, barrier, trials = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
for step in range(trials):
    state = {"w": torch.full((20000,), float(me * 1000 + step)), "who": me, "step": step}
    open(f"{barrier}/{step}-{me}", "w").close()
    while not os.path.exists(f"{barrier}/{step}-{other}"):
        time.sleep(0.001)
    try:
        checkpoint.save(state, store, "r", step, cache_base=False, chunk_size="16KiB", workers=2)
        outcome = "won"
    except StepCommittedError as exc:
        outcome = "lost: " + exc.message
    print(json.dumps({"step": step, "outcome": outcome}), flush=True)
"""


def _state(who: int, step: int):
    return {"w": torch.full((20000,), float(who * 1000 + step)), "who": who, "step": step}


def _only_the_winners_files(step_dir, manifest):
    return sorted(p.name for p in step_dir.iterdir()) == sorted(["manifest.json", *manifest["files"]])


def test_two_processes_saving_one_step_at_once_exactly_one_wins(tmp_path):
    store, barrier = tmp_path / "store", tmp_path / "barrier"
    barrier.mkdir()
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(store), str(me), str(1 - me), str(barrier), str(TRIALS)],
                         cwd=REPO, env=_environment(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for me in (0, 1)
    ]
    outcomes = {}
    for me, child in enumerate(children):
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
        outcomes[me] = {row["step"]: row["outcome"] for row in map(json.loads, out.splitlines())}
    location = storage.resolve(store)
    for step in range(TRIALS):
        won = [me for me in (0, 1) if outcomes[me][step] == "won"]
        assert len(won) == 1, (step, outcomes)
        loser = outcomes[1 - won[0]][step]
        assert loser.startswith("lost:") and f"r/step-{step}" in loser and "left nothing behind" in loser
        ckstore._CACHE.clear()
        assert_same(_state(won[0], step), checkpoint.load(str(store), "r", step), f"step {step}")
        manifest = ckstore.read_manifest(location, "r", step)
        assert _only_the_winners_files(store / "r" / f"step-{step}", manifest), step


def test_concurrent_saves_on_s3_commit_once(s3_bucket):
    store = f"s3://{s3_bucket}/race"
    barrier = threading.Barrier(2)
    results: dict[int, object] = {}

    def save(who: int) -> None:
        barrier.wait()
        try:
            results[who] = checkpoint.save(_state(who, 5), store, "r", 5, cache_base=False)
        except StepCommittedError as exc:
            results[who] = exc

    threads = [threading.Thread(target=save, args=(who,)) for who in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [who for who, value in results.items() if isinstance(value, dict)]
    assert len(winners) == 1 and isinstance(results[1 - winners[0]], StepCommittedError), results
    ckstore._CACHE.clear()
    assert_same(_state(winners[0], 5), checkpoint.load(store, "r", 5))
    client = storage.boto3_client("s3")
    keys = {item["Key"].rsplit("/", 1)[-1] for item in client.list_objects_v2(Bucket=s3_bucket, Prefix="race/r/")
            .get("Contents", []) if not item["Key"].endswith("/")}
    manifest = ckstore.read_manifest(storage.resolve(store), "r", 5)
    assert keys == {"manifest.json", *manifest["files"]}


def test_commit_is_an_exclusive_create(tmp_path, s3_bucket):
    for uri in (str(tmp_path / "s"), f"s3://{s3_bucket}/excl"):
        checkpoint.save(_state(0, 1), uri, "r", 1, cache_base=False)
        location = storage.resolve(uri)
        manifest = ckstore.read_manifest(location, "r", 1)
        assert ckstore.commit_manifest(location, {**manifest, "id": "0" * 32}) is False
        assert ckstore.read_manifest(location, "r", 1)["id"] == manifest["id"]
        with pytest.raises(StepCommittedError, match="already stored"):
            checkpoint.save(_state(1, 1), uri, "r", 1, cache_base=False)
