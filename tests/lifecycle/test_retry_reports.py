"""A GC attempt that fails past its point of no return, then Airflow's retry: the work is reported once."""

from __future__ import annotations

import pytest

from seedance_tasks import faults, journal, storage
from seedance_tasks.checkpoint import catalog
from seedance_tasks.lifecycle.gc import collect

from .conftest import make_store

HOLDER = "airflow:seedance_checkpoint_lifecycle:manual__retry"
NEXT = "airflow:seedance_checkpoint_lifecycle:scheduled__next"
POLICY = {"keep_last": 1, "keep_every": 1000}


@pytest.mark.parametrize("point", ["journal.publishing", "journal.closed"])
def test_a_retry_reports_what_the_failed_attempt_collected(tmp_path, point):
    """The retry used to find nothing left to collect and report 0 deleted, 0 bytes: the
    checkpoints the failed attempt retired were never reported at all."""
    clean, store = tmp_path / "clean", tmp_path / "store"
    make_store(clean, run="r", steps=range(0, 40, 10), keyframe_every=1)
    make_store(store, run="r", steps=range(0, 40, 10), keyframe_every=1)
    expected = collect(str(clean), ["r"], apply=True, holder=HOLDER, **POLICY)
    kept = catalog.committed_steps(storage.resolve(clean), "r")
    assert expected["checkpoints_deleted"] == 4 - len(kept) >= 2 and expected["bytes_freed"] > 0

    # past the point of no return (the retry's recovery rolls the journal forward), or after the work
    with faults.armed(at=1, mode="raise", match=point), pytest.raises(faults.InjectedFault):
        collect(str(store), ["r"], apply=True, holder=HOLDER, **POLICY)
    retried = collect(str(store), ["r"], apply=True, holder=HOLDER, **POLICY)
    assert catalog.committed_steps(storage.resolve(store), "r") == kept
    assert (retried["checkpoints_deleted"], retried["bytes_freed"]) == \
        (expected["checkpoints_deleted"], expected["bytes_freed"])
    assert not journal.pending(storage.resolve(store))
    again = collect(str(store), ["r"], apply=True, holder=NEXT, **POLICY)  # the next DAG run: reported once only
    assert (again["checkpoints_deleted"], again["bytes_freed"]) == (0, 0)


@pytest.mark.parametrize("point", ["journal.publishing", "ckpt.manifest.replace.after", "journal.closed"])
def test_a_tiering_retry_reports_what_the_failed_attempt_moved(tmp_path, monkeypatch, point):
    """Failed after a manifest switched (the failing attempt finishes that move itself) or after its
    work: the retry found nothing left to move and reported 0 moved."""
    from datetime import UTC, datetime, timedelta

    from seedance_tasks.lifecycle.tiering import TieringFailedError, tier

    later = datetime.now(UTC) + timedelta(hours=2)
    for name in ("clean", "store"):
        make_store(tmp_path / name, run="r", steps=[0, 10], keyframe_every=4)
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__WARM_AFTER", "0")
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__KEEP_LATEST_HOT", "false")
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__WARM__URI", str(tmp_path / "warm-clean"))
    expected = tier(str(tmp_path / "clean"), apply=True, holder=HOLDER, now=later)
    assert expected["moved"] == 2
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__WARM__URI", str(tmp_path / "warm"))
    with faults.armed(at=1, mode="raise", match=point), pytest.raises((faults.InjectedFault, TieringFailedError)):
        tier(str(tmp_path / "store"), apply=True, holder=HOLDER, now=later)
    retried = tier(str(tmp_path / "store"), apply=True, holder=HOLDER, now=later)
    assert (retried["moved"], retried["bytes_moved"]) == (expected["moved"], expected["bytes_moved"])
    again = tier(str(tmp_path / "store"), apply=True, holder=NEXT, now=later)
    assert again["moved"] == 0
