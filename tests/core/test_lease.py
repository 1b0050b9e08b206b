"""Leases: one writer per dataset, on local disk and on a real S3 server, through the same code."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from seedance_tasks import lease, storage
from seedance_tasks.errors import IntegrityError


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    if request.param == "local":
        return storage.resolve(tmp_path / "lake")
    bucket = request.getfixturevalue("s3_bucket")
    return storage.resolve(f"s3://{bucket}/lake")


def test_a_second_holder_is_refused_with_the_holder_named(root):
    first = lease.acquire(root, "dataset", holder="run-A", purpose="compaction", ttl_s=60)
    with pytest.raises(lease.LeaseHeldError) as refused:
        lease.acquire(root, "dataset", holder="run-B", purpose="compaction", ttl_s=60)
    message = refused.value.message
    assert "run-A" in message and "compaction" in message and f"pid {os.getpid()}" in message and "since" in message
    assert refused.value.hint and "--wait" in refused.value.hint
    first.release()
    second = lease.acquire(root, "dataset", holder="run-B", purpose="compaction", ttl_s=60)
    assert lease.current(root, "dataset").holder == "run-B"
    second.release()
    assert lease.current(root, "dataset") is None


def test_the_same_holder_takes_its_lease_back(root):
    """A retried Airflow task (same DAG run, same holder) gets the lease its first attempt held."""
    first = lease.acquire(root, "dataset", holder="airflow:d:r1", purpose="plan", ttl_s=60)
    again = lease.acquire(root, "dataset", holder="airflow:d:r1", purpose="compact", ttl_s=60)
    assert again.record.acquired_at == first.record.acquired_at
    again.check()
    first.check()  # both attempts of one holder still own it
    again.release()
    assert lease.current(root, "dataset") is None


def test_a_stale_lease_is_taken_over_and_its_old_holder_knows(root):
    old = lease.acquire(root, "dataset", holder="run-dead", purpose="x", ttl_s=0.5)
    with pytest.raises(lease.LeaseHeldError):
        lease.acquire(root, "dataset", holder="run-new", purpose="x", ttl_s=30)
    time.sleep(0.8)
    new = lease.acquire(root, "dataset", holder="run-new", purpose="x", ttl_s=30)
    assert lease.current(root, "dataset").holder == "run-new"
    with pytest.raises(lease.LeaseLostError):
        old.check()
    old.release()  # releasing a lost lease must not remove the new holder's
    assert lease.current(root, "dataset").holder == "run-new"
    new.release()


def test_a_heartbeat_keeps_the_lease_past_its_ttl(root):
    with lease.holding(root, "dataset", holder="run-A", purpose="x", ttl_s=0.6) as held:
        time.sleep(1.5)
        with pytest.raises(lease.LeaseHeldError):
            lease.acquire(root, "dataset", holder="run-B", purpose="x", ttl_s=30)
        held.check()
    assert lease.current(root, "dataset") is None


def test_wait_gets_the_lease_when_the_holder_finishes(root):
    held = lease.acquire(root, "dataset", holder="run-A", purpose="x", ttl_s=60)
    threading.Timer(0.7, held.release).start()
    got = lease.acquire(root, "dataset", holder="run-B", purpose="x", ttl_s=60, wait_s=10)
    assert got.record.holder == "run-B"
    got.release()


def test_a_damaged_lease_record_is_named(tmp_path):
    root = storage.resolve(tmp_path)
    path = tmp_path / "_seedance" / "leases" / "dataset.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"name": "dataset", "holder": "x"}))
    with pytest.raises(IntegrityError, match="dataset.json"):
        lease.acquire(root, "dataset", holder="run-B", purpose="x", ttl_s=60)


def test_a_lease_name_cannot_leave_the_root(tmp_path):
    with pytest.raises(IntegrityError):
        lease.acquire(storage.resolve(tmp_path), "../../etc/x", holder="a", purpose="x", ttl_s=60)


def _race(uri: str, holder: str, barrier, done, queue) -> None:
    barrier.wait(120)  # every racer spawned (slow under load) before any tries
    try:
        lease.acquire(storage.resolve(uri), "dataset", holder=holder, purpose="race", ttl_s=60)
        queue.put(("won", holder))
        done.wait(120)  # a lease dies with its process: the winner lives until every racer has tried
    except lease.LeaseHeldError:
        queue.put(("lost", holder))


@pytest.mark.parametrize("stale_first", [False, True])
def test_of_many_racing_writers_exactly_one_wins(root, stale_first):
    """Eight processes acquire (or take over one stale lease) at the same instant: one winner."""
    if stale_first:
        lease.acquire(root, "dataset", holder="run-dead", purpose="x", ttl_s=0.2)
        time.sleep(0.4)
    context = multiprocessing.get_context("spawn")
    queue, barrier, done = context.Queue(), context.Barrier(8), context.Event()
    workers = [context.Process(target=_race, args=(root.uri, f"run-{i}", barrier, done, queue)) for i in range(8)]
    for worker in workers:
        worker.start()
    try:
        outcomes = [queue.get(timeout=120) for _ in workers]
        winners = [holder for verdict, holder in outcomes if verdict == "won"]
        assert len(winners) == 1, outcomes
        assert lease.current(root, "dataset").holder == winners[0]
    finally:
        done.set()
        for worker in workers:
            worker.join(30)


def test_a_holder_killed_mid_run_is_taken_over_after_its_ttl(tmp_path):
    root = storage.resolve(tmp_path)
    code = (
        "import time; from seedance_tasks import lease, storage\n"
        f"with lease.holding(storage.resolve({str(tmp_path)!r}), 'dataset', holder='run-killed', purpose='x', ttl_s=0.6):\n"
        "    print('held', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    time.sleep(1.0)  # the heartbeat keeps it fresh while the holder lives
    with pytest.raises(lease.LeaseHeldError, match="run-killed"):
        lease.acquire(root, "dataset", holder="run-next", purpose="x", ttl_s=30)
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    time.sleep(1.0)
    taken = lease.acquire(root, "dataset", holder="run-next", purpose="x", ttl_s=30)
    assert lease.current(root, "dataset").holder == "run-next"
    taken.release()


def test_a_killed_cli_run_blocks_nobody_but_a_detached_lease_waits_for_its_ttl(tmp_path):
    """A lease bound to a dead process on this host is stale at once; a detached one lasts its TTL."""
    root = storage.resolve(tmp_path)
    code = (
        "import sys; from seedance_tasks import lease, storage\n"
        f"lease.acquire(storage.resolve({str(tmp_path)!r}), sys.argv[1], holder='gone', purpose='x', ttl_s=600,"
        " detached=sys.argv[2] == 'detached')\n"
    )
    subprocess.run([sys.executable, "-c", code, "bound", "bound"], check=True)
    subprocess.run([sys.executable, "-c", code, "kept", "detached"], check=True)
    lease.acquire(root, "bound", holder="next", purpose="x", ttl_s=60).release()
    with pytest.raises(lease.LeaseHeldError, match="gone"):
        lease.acquire(root, "kept", holder="next", purpose="x", ttl_s=60)
    lease.acquire(root, "kept", holder="gone", purpose="x", ttl_s=60).release()  # its own DAG run takes it back


def test_holding_without_release_hands_the_lease_on(tmp_path):
    root = storage.resolve(tmp_path)
    with lease.holding(root, "dataset", holder="airflow:d:r", purpose="plan", ttl_s=60, release=False):
        pass
    assert lease.current(root, "dataset").pid_bound is False
