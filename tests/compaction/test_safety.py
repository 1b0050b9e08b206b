"""One writer per lake (leases), symlinks never followed, and a trash purge between a crash and
its recovery: never a lost or duplicated row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from typer.testing import CliRunner

from seedance_tasks import journal, lease, storage
from seedance_tasks.cli import app
from seedance_tasks.compaction.plan import SYMLINK_REASON, UNDECODABLE_REASON
from seedance_tasks.compaction.run import LEASE_NAME, compact_dataset
from seedance_tasks.compaction.sample import make_sample_lake
from seedance_tasks.lease import LeaseHeldError
from tests.chaos.harness import run_task

from .conftest import lake_digest

runner = CliRunner()
SEEDANCE = os.path.join(os.path.dirname(sys.executable), "seedance")
CLI_ARGS = ["--target-file-size", "512KiB", "--min-age", "0", "--workers", "1", "--json"]


def test_a_second_run_is_refused_naming_the_holder(lake):
    root = storage.resolve(lake)
    digest = lake_digest(lake)
    other = lease.acquire(root, LEASE_NAME, holder="airflow:seedance_compaction:nightly", purpose="test")
    try:
        result = runner.invoke(app, ["compact", str(lake), *CLI_ARGS])
    finally:
        other.release()
    assert result.exit_code == 5, result.output
    assert "airflow:seedance_compaction:nightly" in result.output and "hint:" in result.output
    assert lake_digest(lake) == digest and not (lake / "_seedance" / "journal").exists()


def test_wait_takes_the_lease_once_the_holder_is_done(lake):
    root = storage.resolve(lake)
    other = lease.acquire(root, LEASE_NAME, holder="another-run", purpose="test")
    releaser = threading.Timer(1.0, other.release)
    releaser.start()
    try:
        result = runner.invoke(app, ["compact", str(lake), *CLI_ARGS, "--wait", "60s"])
    finally:
        releaser.join()
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["partitions_compacted"] == 3
    assert lease.current(root, LEASE_NAME) is None  # released at the end of the run


def test_two_cli_runs_started_together_never_lose_or_duplicate_a_row(lake):
    digest = lake_digest(lake)
    runs = [subprocess.Popen([SEEDANCE, "compact", str(lake), *CLI_ARGS], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outcomes = [(run.wait(300), run.stdout.read(), run.stderr.read()) for run in runs]
    for run in runs:
        run.stdout.close()
        run.stderr.close()
    assert sorted(code for code, _, _ in outcomes) in ([0, 0], [0, 5]), outcomes
    reports = [json.loads(out) for code, out, _ in outcomes if code == 0]
    assert sum(report["partitions_compacted"] for report in reports) == 3  # each partition once
    for code, _, err in outcomes:
        if code == 5:  # the loser names the winner's run, which holds the lease
            assert "error:" in err and reports[0]["run_id"] in err, err
    assert lake_digest(lake) == digest
    assert journal.pending(storage.resolve(lake)) == []


def test_a_killed_holders_lease_is_taken_over_after_its_ttl(lake, small_settings):
    digest = lake_digest(lake)
    killed = run_task("tests.chaos.test_compaction_chaos:cli_compact", {"uri": str(lake)}, fault_at=2,
                      match="storage.retire", env={"SEEDANCE__STORAGE__LEASE_TTL": "2s"})
    assert killed.returncode == -9  # killed mid-retire: published, some sources not yet retired
    root = storage.resolve(lake)
    dead = lease.current(root, LEASE_NAME)
    assert dead is not None and dead.ttl_s == 2
    if not dead.stale():
        with pytest.raises(LeaseHeldError) as refused:
            compact_dataset(str(lake), small_settings)
        assert dead.holder in refused.value.message
    time.sleep(max(0.0, dead.ttl_s - (time.time() - dead.heartbeat_at.timestamp())) + 0.5)
    report = compact_dataset(str(lake), small_settings)  # takes the stale lease over, recovers
    assert [item["action"] for item in report["recovered"]] == ["rolled forward"]
    assert lake_digest(lake) == digest
    assert lease.current(root, LEASE_NAME) is None and journal.pending(root) == []


def test_trash_purged_between_a_kill_mid_retire_and_the_next_run(lake, small_settings):
    digest = lake_digest(lake)
    killed = run_task("tests.chaos.test_compaction_chaos:cli_compact", {"uri": str(lake)}, fault_at=2,
                      match="storage.retire", env={"SEEDANCE__STORAGE__LEASE_TTL": "1s"})
    assert killed.returncode == -9
    purge = runner.invoke(app, ["trash", "purge", str(lake), "--older-than", "0", "--json"])
    assert purge.exit_code == 0, purge.output
    report = compact_dataset(str(lake), small_settings, wait_s=30)
    assert report["recovered"] and lake_digest(lake) == digest
    assert compact_dataset(str(lake), small_settings)["partitions_compacted"] == 0
    again = runner.invoke(app, ["trash", "purge", str(lake), "--older-than", "0", "--json"])
    assert again.exit_code == 0, again.output
    assert compact_dataset(str(lake), small_settings)["partitions_compacted"] == 0
    assert lake_digest(lake) == digest and journal.pending(storage.resolve(lake)) == []


def test_symlinks_are_never_followed_and_reported_once(lake, small_settings, tmp_path):
    outside = tmp_path / "outside"
    make_sample_lake(str(outside), partitions=1, files_per_partition=2, rows_per_file=100, seed=99)
    digest = lake_digest(lake)
    (lake / "latest").symlink_to(lake / "date=2026-11-03", target_is_directory=True)
    (lake / "elsewhere").symlink_to(outside, target_is_directory=True)
    (lake / "date=2026-11-01" / "linked.parquet").symlink_to(lake / "date=2026-11-02" / "part-00000.parquet")
    outside_files = sorted(p.name for p in outside.rglob("*.parquet"))
    report = compact_dataset(str(lake), small_settings)
    symlinks = [item for item in report["skipped"] if item["reason"] == SYMLINK_REASON]
    assert sorted(item["partition"] for item in symlinks) == ["date=2026-11-01/linked.parquet", "elsewhere", "latest"]
    assert report["partitions_compacted"] == 3 and report["rows"] == 18 * 1_500 and not report["quarantined"]
    assert sorted(p.name for p in outside.rglob("*.parquet")) == outside_files  # never touched
    for link in ("latest", "elsewhere", "date=2026-11-01/linked.parquet"):
        assert (lake / link).is_symlink()
    os.unlink(lake / "latest")
    os.unlink(lake / "elsewhere")
    os.unlink(lake / "date=2026-11-01" / "linked.parquet")
    assert lake_digest(lake) == digest


def test_a_file_name_that_is_not_utf8_is_reported_and_left_and_the_rest_is_compacted(lake, small_settings):
    odd = os.path.join(os.fsencode(lake / "date=2026-11-01"), b"caf\xe9.parquet")
    with open(odd, "wb") as handle:
        handle.write(b"not looked at")
    report = compact_dataset(str(lake), small_settings)
    assert [item for item in report["skipped"] if item["reason"] == UNDECODABLE_REASON] == [
        {"partition": "date=2026-11-01/caf\\xe9.parquet", "reason": UNDECODABLE_REASON}]
    assert report["partitions_compacted"] == 3 and report["rows"] == 18 * 1_500 and not report["quarantined"]
    with open(odd, "rb") as handle:
        assert handle.read() == b"not looked at"


def test_leases_on_s3_refuse_a_second_writer(s3_bucket, small_settings):
    uri = f"s3://{s3_bucket}/lake"
    make_sample_lake(uri, partitions=1, files_per_partition=3, rows_per_file=200)
    root = storage.resolve(uri)
    other = lease.acquire(root, LEASE_NAME, holder="another-deployment", purpose="test")
    with pytest.raises(LeaseHeldError) as refused:
        compact_dataset(uri, small_settings)
    assert "another-deployment" in refused.value.message
    other.release()
    assert compact_dataset(uri, small_settings)["partitions_compacted"] == 1
    assert lease.current(root, LEASE_NAME) is None
