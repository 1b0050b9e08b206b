"""kill -9 at every file operation of `gc --apply` and of tiering: every kept checkpoint stays
restorable bit-exact right after the crash, and after the next run the job is finished (garbage
gone, files on their tier, no journal pending, no orphan copies).

Deterministic, whatever the machine's load: the job runs in a child that counts its file
operations (before and after each move, JSON write and tier copy, and between a copy being
written and being verified/renamed). Told to stop at operation N, the child says so on its pipe
and waits there; the parent then kills it with SIGKILL. A clean run first counts the operations,
then N sweeps every one of them. The children are forked from one prepared process (a "zygote"
that has imported Seedance once), so a sweep costs a fork per kill, not an interpreter start.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from seedance_tasks import storage
from seedance_tasks.checkpoint.store import committed_steps, list_checkpoints, read_manifest
from seedance_tasks.lifecycle import journaled

from .conftest import assert_restorable, make_store

HOLDER = "crash-test"  # a rerun takes its own lease back, as a retried Airflow task does
GUARD_S = 120  # only against a hung child: no assertion depends on how long anything takes

# The zygote reads one job per line ({"mode", "store", "warm", "cold", "stop_at", "holder"}), forks a child
# for it, and reports `pid P`, then `exit CODE` once the child is gone. The child prints
# `at N NAME` when it reaches operation N (`stop_at`) and waits there for its kill, or
# `done {json}` (with the number of operations it made) when it finishes.
ZYGOTE = r"""
import json, os, sys, threading, time, traceback
from datetime import UTC, datetime, timedelta
from seedance_tasks import storage
from seedance_tasks.config import load_settings
from seedance_tasks.lifecycle import gc, tiering

STATE = {"stop_at": 0, "count": 0}
GUARD_S = float(sys.argv[1])

def say(line):
    os.write(1, (line + "\n").encode())  # one write of a short line: never interleaved with another process's

def point(name):
    STATE["count"] += 1
    if STATE["count"] == STATE["stop_at"]:
        say(f"at {STATE['count']} {name}")
        time.sleep(GUARD_S)  # the parent kills -9 this process here, at once
        os._exit(3)  # not killed (the test failed): never outlive it

def counted(name, fn):
    def wrapper(*args, **kwargs):
        point(name + ".before")
        result = fn(*args, **kwargs)
        point(name + ".after")
        return result
    return wrapper

storage.move = counted("move", storage.move)  # renames: publish, retire, journal close
storage.write_json_atomic = counted("write_json", storage.write_json_atomic)  # manifests, journals
tiering.copy_verified = counted("copy", tiering.copy_verified)
tiering._sha256_of = counted("copy.verify", tiering._sha256_of)  # the copy written, not yet renamed

def configure(spec):
    # the tier folders through the environment (trusted roots come from config), parsed here
    # once: each child forked after this finds the parsed config cached
    os.environ["SEEDANCE__LIFECYCLE__TIERS__WARM__URI"] = spec["warm"]
    os.environ["SEEDANCE__LIFECYCLE__TIERS__COLD__URI"] = spec["cold"]
    load_settings()

def job(spec):
    STATE["stop_at"] = spec["stop_at"]
    settings = load_settings().lifecycle
    assert (settings.tiers.warm.uri, settings.tiers.cold.uri) == (spec["warm"], spec["cold"])
    settings.tiers.keep_latest_hot = False
    if spec["mode"] == "gc":
        out = gc.collect(spec["store"], settings=settings, apply=True, keep_last=2, keep_every=40, holder=spec["holder"])
        return {"deleted": out["checkpoints_deleted"]}
    now = datetime.now(UTC)
    first = tiering.tier(spec["store"], settings=settings, apply=True, now=now + timedelta(hours=2), holder=spec["holder"])
    second = tiering.tier(spec["store"], settings=settings, apply=True, now=now + timedelta(days=2), holder=spec["holder"])
    return {"moved": first["moved"] + second["moved"]}

say("ready")
for line in sys.stdin:
    spec = json.loads(line)
    configure(spec)
    assert threading.active_count() == 1  # forking is safe: no other thread holds a lock
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setsid()  # its own group: the parent kills the whole of it
            result = job(spec)
            say("done " + json.dumps({**result, "operations": STATE["count"]}))
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code)
    say(f"pid {pid}")
    _, status = os.waitpid(pid, 0)
    say(f"exit {os.waitstatus_to_exitcode(status)}")
"""


class Zygote:
    """The prepared process that forks one child per job; its lines arrive through a queue."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, "-c", ZYGOTE, str(GUARD_S)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.broken = False  # a job went wrong mid-way: its child may still wait, so close() kills
        threading.Thread(target=self._pump, daemon=True).start()
        assert self._next() == "ready"

    def _pump(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def _next(self) -> str:
        line = self.lines.get(timeout=GUARD_S)
        assert line is not None, "the zygote died (its traceback is in the captured stderr)"
        return line

    def run(self, mode: str, work, stop_at: int = 0) -> dict:
        """Run the job on `work`; with `stop_at` N, kill -9 it at its N-th file operation.

        Returns {"exit": code, "at": "N NAME" or None, "done": the job's result or None}."""
        spec = {"mode": mode, "store": str(work / "s"), "warm": str(work / "warm"), "cold": str(work / "cold"),
                "stop_at": stop_at, "holder": HOLDER}
        self.process.stdin.write(json.dumps(spec) + "\n")
        self.process.stdin.flush()
        pid, at, done, killed, lines = None, None, None, False, []
        try:
            while True:
                line = self._next()
                lines.append(line)
                kind, _, rest = line.partition(" ")
                if kind == "pid":
                    pid = int(rest)
                elif kind == "at":
                    at = rest
                elif kind == "done":
                    done = json.loads(rest)
                elif kind == "exit":
                    return {"exit": int(rest), "at": at, "done": done}
                else:
                    raise AssertionError(f"unexpected line from the zygote: {line!r} (after {lines[:-1]})")
                if pid is not None and at is not None and not killed:
                    os.killpg(pid, signal.SIGKILL)  # exactly there: the child is waiting at that operation
                    killed = True
        except BaseException:
            self.broken = True
            if pid is not None and not killed:  # never leave a child waiting (the zygote waits for it)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            raise

    def close(self) -> None:
        """End the zygote (at once if a job went wrong: a child of it may still be waiting)."""
        if not self.broken:
            self.process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(GUARD_S)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(GUARD_S)


@pytest.fixture(scope="module")
def zygote():
    started = Zygote()
    yield started
    started.close()


@pytest.fixture
def scratch(tmp_path):
    """Where the sweep's stores live: a folder in RAM (/dev/shm) where there is one, else
    `tmp_path`. A kill -9 ends the process, not the machine, so the disk adds nothing to what is
    checked, only seconds (a removal of a just-written folder can wait on the journal of ext4)."""
    shm = "/dev/shm"
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    folder = tempfile.mkdtemp(prefix="seedance-crash-", dir=shm)
    try:
        yield Path(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """The stores the jobs start from: GC prunes 16 steps (delta chains of 4); tiering moves 4
    steps (a keyframe and its 3 deltas) through warm to cold. Tiering repeats the same operations
    for every checkpoint, so 4 cover each of them on a keyframe and on deltas, in both passes."""
    stores = {}
    for mode, steps in (("gc", range(0, 160, 10)), ("tier", range(0, 40, 10))):
        root = tmp_path_factory.mktemp(f"pristine-{mode}")
        stores[mode] = (root, make_store(root / "s", steps=steps, keyframe_every=4))
    return stores


def _orphans(work):
    """Data files in tier folders that no manifest refers to (trash excluded)."""
    referenced = set()
    for row in list_checkpoints(str(work / "s")):
        manifest = read_manifest(storage.resolve(work / "s"), row["run"], row["step"])
        referenced.update(entry["uri"] for entry in manifest["files"].values() if entry.get("uri"))
    found = []
    for tier in ("warm", "cold"):
        for path in (work / tier).rglob("*"):
            if path.is_file() and "_seedance" not in path.parts and str(path) not in referenced:
                found.append(str(path))
    return found


def _trust(monkeypatch, work) -> None:
    """Point this process's config at `work`'s tiers: a restore reads files only under trusted roots."""
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__WARM__URI", str(work / "warm"))
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__COLD__URI", str(work / "cold"))


def _check_finished(work, mode, kept, expected, what):
    """After a complete run: exactly `kept` remain, restorable, no journal pending, all on cold."""
    assert set(committed_steps(storage.resolve(work / "s"), "r")) == kept, f"{what}: garbage left"
    assert_restorable(work / "s", "r", expected)
    store = storage.resolve(work / "s")
    assert journaled.pending(store, journaled.GC_KIND) == [] and journaled.pending(store, journaled.TIER_KIND) == []
    if mode == "tier":
        assert {row["tier"] for row in list_checkpoints(str(work / "s"))} == {"cold"}, what
        assert _orphans(work) == [], f"{what}: orphan copies"
        assert not list((work / "s" / "r").rglob("*.bin")), f"{what}: hot sources not retired"


@pytest.mark.parametrize("mode", ["gc", "tier"])
def test_kill_9_at_every_file_operation_keeps_every_kept_checkpoint_restorable(scratch, pristine, zygote, mode,
                                                                           monkeypatch):
    source, digests = pristine[mode]
    kept = {0, 40, 80, 120, 140, 150} if mode == "gc" else set(digests)
    kept |= {b for s in list(kept) for b in _chain(source / "s", s)}
    expected = {s: digests[s] for s in kept}

    clean = scratch / "clean"  # a run without a kill counts the operations there are to kill at
    shutil.copytree(source, clean)
    _trust(monkeypatch, clean)
    result = zygote.run(mode, clean)
    assert result["exit"] == 0 and result["at"] is None and result["done"], result
    _check_finished(clean, mode, kept, expected, "clean run")
    operations = result["done"]["operations"]
    assert operations >= (40 if mode == "gc" else 100), result  # the sweep below is not trivially short

    reached = []
    work = scratch / "work"  # one place for every kill: the config (tier folders) stays the same
    _trust(monkeypatch, work)
    for stop_at in range(1, operations + 1):
        shutil.copytree(source, work)
        killed = zygote.run(mode, work, stop_at=stop_at)
        assert killed["exit"] == -signal.SIGKILL and killed["at"] is not None and killed["done"] is None, killed
        number, _, name = killed["at"].partition(" ")
        assert int(number) == stop_at, killed
        reached.append(name)
        what = f"killed at operation {stop_at} ({name})"

        # right after the crash: every kept checkpoint restores bit-exact
        assert set(committed_steps(storage.resolve(work / "s"), "r")) >= kept, f"{what}: kept step lost"
        assert_restorable(work / "s", "r", expected)

        # the next run finishes the job
        rerun = zygote.run(mode, work)
        assert rerun["exit"] == 0 and rerun["done"] is not None, f"{what}: recovery run failed: {rerun}"
        _check_finished(work, mode, kept, expected, what)
        shutil.rmtree(work)
    kinds = {"move.before", "move.after", "write_json.before", "write_json.after"}
    if mode == "tier":
        kinds |= {"copy.before", "copy.verify.before", "copy.verify.after", "copy.after"}
    assert set(reached) == kinds  # every kind of operation was killed at, before and after


def _chain(store, step):
    return [int(b) for b in read_manifest(storage.resolve(store), "r", step).get("chain", [])]
