"""Compaction under kill -9 and transient storage errors at every fault point it passes.

The DAG's mapped `compact` task is `run.compact_group_attempt(group, holder=...)`: each case kills
(or fails) it at one point, runs it again with the same inputs (Airflow's retry), finishes the DAG
run (sibling group, report, purge), then runs the next scheduled run (`compact_dataset`), and
checks that the lake holds exactly the original rows. The CLI run (`compact_dataset`) too.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from seedance_tasks import faults, journal, lease, storage
from seedance_tasks.compaction import airflow_tasks
from seedance_tasks.compaction.run import (
    LEASE_NAME,
    compact_dataset,
    compact_group_attempt,
    plan_for_dag,
    purge_for_dag,
)
from seedance_tasks.compaction.sample import make_sample_lake
from seedance_tasks.config import load_settings, settings_with
from tests.chaos.harness import points_hit, run_task
from tests.compaction.conftest import lake_digest

GROUP_TASK = "seedance_tasks.compaction.run:compact_group_attempt"
CLI_TASK = "tests.chaos.test_compaction_chaos:cli_compact"
HOLDER = "airflow:seedance_compaction:manual__chaos"
SHORT_TTL = {"SEEDANCE__STORAGE__LEASE_TTL": "1s"}  # a killed CLI run's lease expires fast


def _settings():
    return settings_with(load_settings(), "compaction", target_file_size="512KiB", row_group_size="64KiB",
                         min_age="0", workers=1)


def cli_compact(uri: str, wait_s: float = 0.0) -> dict:
    """What `seedance compact URI --min-age 0 --target-file-size 512KiB` runs (JSON-able for the harness)."""
    report = compact_dataset(uri, _settings(), wait_s=wait_s)
    return {"rows": report["rows"], "partitions_compacted": report["partitions_compacted"]}


@pytest.fixture
def tmp_path(tmp_path):
    """A scratch directory in memory where the machine has one: these tests fsync a lot, and
    /dev/shm makes an fsync free (the code under test is the same)."""
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="seedance-chaos-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("chaos") / "pristine"
    make_sample_lake(str(path), partitions=2, files_per_partition=3, rows_per_file=300)
    return path, lake_digest(path)


def _fresh(pristine, tmp_path, name: str):
    work = tmp_path / name
    shutil.copytree(pristine[0], work)
    return work


def _assert_original(work, digest):
    root = storage.resolve(work)
    assert lake_digest(work) == digest, "rows lost or duplicated"
    assert journal.pending(root) == []
    assert lease.current(root, LEASE_NAME) is None


def _finish_dag_run(work, planned, first: dict, rest: list[dict]) -> dict:
    """The retried group's siblings, the report and the purge of the same DAG run."""
    results = [first] + [compact_group_attempt(group, holder=HOLDER) for group in rest]
    report = airflow_tasks.report_task(planned, results)
    purge_for_dag(str(work), 7 * 86400, holder=HOLDER)  # releases the DAG run's lease
    return report


def _after_crash_every_row_is_readable(work, digest):
    assert lake_digest(work, distinct=True) == digest, "rows were lost right after the crash"


def test_dag_compact_task_killed_at_every_point_then_retried(pristine, tmp_path):
    settings, digest = _settings(), pristine[1]
    probe = _fresh(pristine, tmp_path, "probe")
    planned = plan_for_dag(str(probe), settings, holder=HOLDER)
    assert len(planned["groups"]) == 2  # one mapped task per partition, as the DAG maps them
    points = points_hit(GROUP_TASK, {"group": planned["groups"][0], "holder": HOLDER})
    assert "journal.publishing" in points and points.count("storage.retire.before") == 3
    for at in range(1, len(points) + 1):
        work = _fresh(pristine, tmp_path, f"kill-{at}")
        planned = plan_for_dag(str(work), settings, holder=HOLDER)
        first, *rest = planned["groups"]
        killed = run_task(GROUP_TASK, {"group": first, "holder": HOLDER}, fault_at=at)
        assert killed.returncode == -9, f"point {at} ({points[at - 1]}): {killed.stderr[-2000:]}"
        _after_crash_every_row_is_readable(work, digest)
        retried = compact_group_attempt(first, holder=HOLDER)  # Airflow's retry: same inputs
        report = _finish_dag_run(work, planned, retried, rest)
        assert report["partitions_compacted"] == 2 and report["rows"] == digest[0], (at, points[at - 1], report)
        assert compact_dataset(str(work), settings)["partitions_compacted"] == 0  # the next scheduled run
        _assert_original(work, digest)


def test_dag_compact_task_failing_at_every_point_then_retried(pristine, tmp_path):
    """A transient storage error (InjectedFault, an OSError) in place of the kill; one group of
    both partitions, as a DAG with fewer workers maps it."""
    settings, digest = _settings(), pristine[1]
    probe = _fresh(pristine, tmp_path, "probe")
    planned = plan_for_dag(str(probe), settings, holder=HOLDER, max_groups=1)
    with faults.tracing() as points:
        compact_group_attempt(planned["groups"][0], holder=HOLDER)
    assert points.count("journal.publishing") == 2
    for at in range(1, len(points) + 1):
        work = _fresh(pristine, tmp_path, f"raise-{at}")
        planned = plan_for_dag(str(work), settings, holder=HOLDER, max_groups=1)
        with faults.armed(at=at, mode="raise"), pytest.raises(faults.InjectedFault):
            compact_group_attempt(planned["groups"][0], holder=HOLDER)
        _after_crash_every_row_is_readable(work, digest)
        retried = compact_group_attempt(planned["groups"][0], holder=HOLDER)
        report = _finish_dag_run(work, planned, retried, [])
        assert report["partitions_compacted"] == 2 and report["rows"] == digest[0], (at, points[at - 1], report)
        assert compact_dataset(str(work), settings)["partitions_compacted"] == 0
        _assert_original(work, digest)


def test_cli_run_failing_at_every_point_then_rerun(pristine, tmp_path):
    settings, digest = _settings(), pristine[1]
    probe = _fresh(pristine, tmp_path, "probe")
    with faults.tracing() as points:
        compact_dataset(str(probe), settings)
    for at in range(1, len(points) + 1):
        work = _fresh(pristine, tmp_path, f"cli-raise-{at}")
        with faults.armed(at=at, mode="raise"), pytest.raises(faults.InjectedFault):
            compact_dataset(str(work), settings)
        _after_crash_every_row_is_readable(work, digest)
        compact_dataset(str(work), settings)  # its lease was released on the way out: no wait
        assert compact_dataset(str(work), settings)["partitions_compacted"] == 0
        _assert_original(work, digest)


@pytest.mark.slow
def test_cli_run_killed_at_every_point_then_rerun(tmp_path):
    pristine = tmp_path / "pristine"
    make_sample_lake(str(pristine), partitions=1, files_per_partition=3, rows_per_file=300)
    digest = lake_digest(pristine)
    probe = tmp_path / "probe"
    shutil.copytree(pristine, probe)
    points = points_hit(CLI_TASK, {"uri": str(probe)}, env=SHORT_TTL)
    for at in range(1, len(points) + 1):
        work = tmp_path / f"cli-kill-{at}"
        shutil.copytree(pristine, work)
        killed = run_task(CLI_TASK, {"uri": str(work)}, fault_at=at, env=SHORT_TTL)
        assert killed.returncode == -9, f"point {at} ({points[at - 1]}): {killed.stderr[-2000:]}"
        _after_crash_every_row_is_readable(work, digest)
        # the killed run's lease stays until its TTL passes; the rerun waits for that, then takes over
        rerun = cli_compact(str(work), wait_s=30)
        assert rerun["partitions_compacted"] in (0, 1)
        assert cli_compact(str(work))["partitions_compacted"] == 0
        _assert_original(work, digest)


def test_retry_on_s3_after_a_transient_error_mid_retire(s3_bucket):
    """The same code on S3 (moto_server): a retire fails, the retry reports the partition, no row
    is lost or duplicated, and the lease (a conditional PUT) is released at the end."""
    from pyarrow import fs as pafs

    uri = f"s3://{s3_bucket}/lake"
    make_sample_lake(uri, partitions=2, files_per_partition=3, rows_per_file=300)
    root = storage.resolve(uri)
    digest = lake_digest(root.path, filesystem=root.fs)
    settings = _settings()
    planned = plan_for_dag(uri, settings, holder=HOLDER, max_groups=1)
    assert lease.current(root, LEASE_NAME).holder == HOLDER
    with faults.armed(at=2, mode="raise", match="storage.retire"), pytest.raises(faults.InjectedFault):
        compact_group_attempt(planned["groups"][0], holder=HOLDER)
    retried = compact_group_attempt(planned["groups"][0], holder=HOLDER)
    report = _finish_dag_run(uri, planned, retried, [])
    assert report["partitions_compacted"] == 2 and report["rows"] == digest[0]
    assert lake_digest(root.path, filesystem=root.fs) == digest
    assert journal.pending(root) == [] and lease.current(root, LEASE_NAME) is None
    assert isinstance(root.fs, pafs.S3FileSystem)
