"""Shard builds and preprocess runs killed -9 (or hit by one transient storage error) at every fault
point, then retried with the same inputs (Airflow's retry: same DAG run, so the same lease holder)
and run again (the next DAG run). Afterwards the output is exactly what one clean run writes:
the same shard bytes, the same index, every sample once. Two builds into one output at once: the
loser is refused naming the holder, or waits for it.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from seedance_tasks import faults, journal, storage
from seedance_tasks.lease import LeaseHeldError
from seedance_tasks.preprocess.run import finalize, run
from seedance_tasks.shards.build import build
from seedance_tasks.shards.sample import make_sample_files
from tests.chaos.harness import points_hit, run_task
from tests.shards.test_shards import read_keys

BUILD = "seedance_tasks.shards.build:build"
PREPROCESS = "seedance_tasks.preprocess.run:run"
SETTINGS = {"max_samples": 3}
RETRY_HOLDER = "airflow:seedance_preprocess:scheduled__1"  # the killed attempt and its retry
NEXT_HOLDER = "airflow:seedance_preprocess:scheduled__2"  # the next DAG run
PP_SETTINGS = {"size": 16, "io_workers": 1, "cpu_workers": 1, "batch_size": 4}


def state(out: Path) -> dict:
    """What a reader of `out` sees, minus what differs between two clean runs (run ids, timings, paths)."""
    files = {path.name: path.read_bytes() for path in sorted(out.iterdir()) if not path.name.startswith(("_", "."))}
    index = json.loads(files.pop("shardindex.json"))
    meta = index.pop("seedance")
    stable = {key: meta[key] for key in ("fingerprint", "kind", "sizes", "failed") if key in meta}
    if "summary" in meta:
        stable["samples"] = meta["summary"]["samples"]
        stable["rejected"] = [(item["key"], item["reason"]) for item in meta["summary"]["rejected"]]
    return {"files": files, "index": index, "meta": stable}


def settled(out: Path) -> None:
    """No attempt left unfinished, nothing staged left visible or pending."""
    root = storage.resolve(str(out))
    assert journal.pending(root) == []
    assert not [path.name for path in out.iterdir() if path.name.startswith(".")]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = tmp_path_factory.mktemp("chaos-src") / "samples"
    keys = make_sample_files(src, 7, corrupt=(5,))  # one rejected sample: its report is written too
    return src, [key for number, key in enumerate(keys) if number != 5]


@pytest.fixture(scope="module")
def clean(source, tmp_path_factory):
    src, _keys = source
    out = tmp_path_factory.mktemp("chaos-clean") / "shards"
    build(str(src), str(out), settings=SETTINGS, holder="clean")
    return state(out)


def _build_kwargs(src: Path, out: Path) -> dict:
    return {"src": str(src), "out": str(out), "settings": SETTINGS, "holder": RETRY_HOLDER}


def _check_build(src: Path, out: Path, clean: dict, keys: list[str], where: str) -> None:
    """The retried build left exactly the clean output; the next DAG run finds it up to date."""
    assert state(out) == clean, where
    assert read_keys(out) == sorted(keys), where  # every sample once, in order
    settled(out)
    assert build(str(src), str(out), settings=SETTINGS, holder=NEXT_HOLDER)["up_to_date"], where
    assert state(out) == clean, where


def test_a_build_killed_at_every_point_is_finished_by_its_retry(tmp_path, source, clean):
    src, keys = source
    points = points_hit(BUILD, _build_kwargs(src, tmp_path / "traced"))
    assert state(tmp_path / "traced") == clean
    for name in ("journal.begun", "shards.index.before", "shards.index.after", "journal.publishing",
                 "storage.publish.before", "storage.publish.after", "journal.closed"):
        assert name in points
    assert 20 <= len(points) <= 40, points
    for index in range(1, len(points) + 1):
        out = tmp_path / f"kill-{index:02d}"
        where = f"killed at point {index} ({points[index - 1]})"
        killed = run_task(BUILD, _build_kwargs(src, out), fault_at=index, mode="kill")
        assert killed.returncode == -9, f"{where}: {killed.stderr[-2000:]}"
        build(**_build_kwargs(src, out))  # Airflow's retry: same inputs, same DAG run
        _check_build(src, out, clean, keys, where)


def test_a_build_failing_once_at_every_point_is_finished_by_its_retry(tmp_path, source, clean):
    src, keys = source
    with faults.tracing() as points:
        build(**_build_kwargs(src, tmp_path / "traced"))
    for index in range(1, len(points) + 1):
        out = tmp_path / f"raise-{index:02d}"
        where = f"transient error at point {index} ({points[index - 1]})"
        with faults.armed(at=index, mode="raise"), pytest.raises(faults.InjectedFault):
            build(**_build_kwargs(src, out))
        build(**_build_kwargs(src, out))
        _check_build(src, out, clean, keys, where)


def test_two_builds_into_one_output_at_once(tmp_path, source, clean):
    src, keys = source
    out = tmp_path / "shared"
    inside, go_on = threading.Event(), threading.Event()

    def slow(_n: float) -> None:
        inside.set()
        go_on.wait(60)

    results: dict[str, dict] = {}
    first = threading.Thread(target=lambda: results.update(
        first=build(str(src), str(out), settings=SETTINGS, holder="airflow:seedance_preprocess:manual__a",
                    advance=slow)))
    first.start()
    try:
        assert inside.wait(60)
        with pytest.raises(LeaseHeldError, match="airflow:seedance_preprocess:manual__a") as refused:
            build(str(src), str(out), settings=SETTINGS, holder="20260101T000000Z-cli001")
        assert "hint" not in refused.value.message and refused.value.hint  # what to do: wait or --wait
        waiter = threading.Thread(target=lambda: results.update(
            waited=build(str(src), str(out), settings=SETTINGS, holder="20260101T000000Z-cli002", wait_s=120)))
        waiter.start()
    finally:
        go_on.set()
        first.join(120)
    waiter.join(180)
    assert not results["first"]["up_to_date"] and results["waited"]["up_to_date"]
    assert state(out) == clean and sorted(read_keys(out)) == sorted(keys)
    settled(out)


# --------------------------------------------------------------------------- preprocess


@pytest.fixture(scope="module")
def shards(source, tmp_path_factory):
    src, _keys = source
    out = tmp_path_factory.mktemp("chaos-shards") / "shards"
    build(str(src), str(out), settings={"max_samples": 4})  # two input shards
    return out


def _group_kwargs(shards: Path, out: Path) -> dict:
    """One mapped preprocess task of the DAG, as `preprocess_group_task` calls it."""
    return {"shards_uri": str(shards), "out_uri": str(out), "settings": PP_SETTINGS, "only": ["shard-000001.tar"],
            "recover": False, "finalize_index": False, "holder": RETRY_HOLDER, "release_lease": False}


@pytest.fixture(scope="module")
def clean_preprocessed(shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("chaos-pp") / "out"
    run(**_group_kwargs(shards, out))
    finalize(str(out), holder=RETRY_HOLDER)  # the DAG's last task: releases the output's lease
    return state(out)


def test_a_preprocess_task_killed_at_every_point_is_finished_by_its_retry(tmp_path, shards, clean_preprocessed):
    points = points_hit(PREPROCESS, _group_kwargs(shards, tmp_path / "traced"))
    assert "preprocess.records.before" in points and "storage.publish.before" in points
    for index in range(1, len(points) + 1):
        out = tmp_path / f"kill-{index:02d}"
        where = f"killed at point {index} ({points[index - 1]})"
        killed = run_task(PREPROCESS, _group_kwargs(shards, out), fault_at=index, mode="kill")
        assert killed.returncode == -9, f"{where}: {killed.stderr[-2000:]}"
        retry = run(**_group_kwargs(shards, out))
        finalize(str(out), holder=RETRY_HOLDER)
        assert state(out) == clean_preprocessed, where
        settled(out)
        again = run(**{**_group_kwargs(shards, out), "holder": NEXT_HOLDER, "release_lease": True})  # next DAG run
        assert again["shards"] == 0 and again["skipped"] == ["shard-000001.tar"], where
        # killed once its journal said "publishing" (the point of no return): rolled forward, not redone
        assert retry["shards"] == (0 if index >= points.index("journal.publishing") else 1), where
        assert state(out) == clean_preprocessed, where


def test_a_preprocess_publish_failing_once_is_finished_by_its_retry(tmp_path, shards, clean_preprocessed):
    with faults.tracing(match="storage.publish") as points:
        run(**_group_kwargs(shards, tmp_path / "traced"))
    assert len(points) == 4  # before/after the output shard and its done-record
    for index in range(1, len(points) + 1):
        out = tmp_path / f"raise-{index}"
        with faults.armed(at=index, mode="raise", match="storage.publish"), pytest.raises(faults.InjectedFault):
            run(**_group_kwargs(shards, out))
        run(**_group_kwargs(shards, out))
        finalize(str(out), holder=RETRY_HOLDER)
        assert state(out) == clean_preprocessed, f"transient error at publish point {index}"
        settled(out)
