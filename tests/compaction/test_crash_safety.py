"""kill -9 at random moments of a compaction run: no row is ever lost, and after the next run no
row is duplicated and nothing staged is left visible."""

import os
import random
import shutil
import signal
import subprocess
import sys
import time

from seedance_tasks import journal, storage

from .conftest import read_lake, visible_data_files

CHILD = """
import json, sys
from seedance_tasks.compaction.run import compact_dataset
from seedance_tasks.config import load_settings, settings_with
settings = settings_with(load_settings(), "compaction", target_file_size="512KiB", row_group_size="64KiB",
                         min_age="0", workers=1)
print("ready", flush=True)
report = compact_dataset(sys.argv[1], settings, wait_s=60)  # a killed run's lease expires by its TTL
print(json.dumps({"rows": report["rows"]}), flush=True)
"""


def _start(lake):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(lake)], stdout=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "SEEDANCE__STORAGE__LEASE_TTL": "1s"},  # a killed holder's lease expires fast
    )
    assert child.stdout.readline().strip() == "ready"
    return child


def _calibrate(pristine, tmp_path) -> float:
    """How long the compaction itself takes here: the faster of two runs (the first warms caches)."""
    spans = []
    for attempt in range(2):
        work = tmp_path / f"calibrate-{attempt}"
        shutil.copytree(pristine, work)
        child = _start(work)
        started = time.monotonic()
        child.wait(120)
        spans.append(time.monotonic() - started)
    return min(spans)


def test_kill_9_at_random_points_never_loses_or_duplicates_rows(tmp_path, lake):
    original = read_lake(lake)
    pristine = tmp_path / "pristine"
    shutil.copytree(lake, pristine)
    span = _calibrate(pristine, tmp_path)

    rng = random.Random(20261129)
    killed = trials = 0
    while killed < 8 and trials < 30:
        work = tmp_path / f"trial-{trials}"
        trials += 1
        shutil.copytree(pristine, work)
        child = _start(work)
        time.sleep(rng.uniform(0, span))
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            killed += 1
        else:
            span *= 0.8  # finished before the kill: aim earlier next time
        child.wait(30)

        # right after the crash: every row still readable; duplicates allowed only transiently
        crashed = read_lake(work)
        ids = set(crashed.column("event_id").to_pylist())
        assert ids == set(original.column("event_id").to_pylist()), f"trial {trials}: rows lost"

        # the next run finishes or undoes the interrupted one: exactly the original rows
        rerun = _start(work)
        rerun.wait(120)
        assert rerun.returncode == 0, f"trial {trials}: recovery run failed"
        assert read_lake(work).equals(original), f"trial {trials}: rows differ after recovery"
        assert journal.pending(storage.resolve(work)) == []
        assert not [f for f in visible_data_files(work) if "staging" in f]
    assert killed >= 8, f"only {killed} of {trials} runs were killed mid-way"


def test_staged_files_reach_the_disk_before_the_journal_commits(lake, small_settings, monkeypatch):
    """A power loss after the commit must not find empty outputs while the sources sit in the trash:
    each staged file and its folder are fsynced before its partition's journal passes the point of
    no return (the journal does it for every pipeline that publishes through it)."""
    import os

    from seedance_tasks import journal as journals
    from seedance_tasks import storage as storage_module
    from seedance_tasks.compaction.run import compact_dataset

    events: list[tuple[str, str]] = []
    real_fsync, real_save = os.fsync, journals.Journal._save

    def fsync(descriptor):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        return real_fsync(descriptor)

    def save(self, *args, **kwargs):  # the point of no return: the journal saved as publishing
        if self.state == journals.PUBLISHING:
            events.append(("commit", self.path))
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(storage_module.os, "fsync", fsync)
    monkeypatch.setattr(journals.Journal, "_save", save)
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 3
    commits = [index for index, (kind, _) in enumerate(events) if kind == "commit"]
    for output in (lake / name for name in report_outputs(report)):
        token, number = output.stem.split("-")[-2:]  # part-<run>-<token>-<n>: staged as .seedance-<token>-<n>
        staged = [index for index, (kind, path) in enumerate(events)
                  if kind == "fsync" and os.path.basename(path) == f".seedance-{token}-{number}.parquet"]
        folder = [index for index, (kind, path) in enumerate(events) if kind == "fsync" and path == str(output.parent)]
        assert staged and folder, (output, events)
        assert any(staged[0] < commit and folder[0] < commit for commit in commits)


def report_outputs(report) -> list[str]:
    return [name for partition in report["partitions"] for name in partition.get("outputs", [])]
