"""Leases are per root and roots nest: `seedance compact lake` and `seedance compact
lake/date=1` (or the nightly DAG and a person's manual run on one partition) hold different
leases over the same files. Right before its point of no return each writer looks for a fresh
lease of another holder above its root or inside it down to the partition: of two overlapping
runs at most one rewrites the shared files, so no row is ever doubled."""

from __future__ import annotations

import pytest

from seedance_tasks import journal, lease, storage
from seedance_tasks.compaction.run import LEASE_NAME, compact_dataset
from seedance_tasks.compaction.sample import make_sample_lake

from .conftest import lake_digest


def _interleaved(monkeypatch, first: str, second: str, settings) -> tuple[dict, dict]:
    """Run `first`; when it is about to commit its first partition, run `second` to its end."""
    real = journal.Journal.commit
    reports: dict[str, dict] = {}

    def commit(self, **kwargs):
        monkeypatch.setattr(journal.Journal, "commit", real)
        reports["second"] = compact_dataset(second, settings)
        return real(self, **kwargs)

    monkeypatch.setattr(journal.Journal, "commit", commit)
    reports["first"] = compact_dataset(first, settings)
    return reports["first"], reports["second"]


@pytest.mark.parametrize("outer_first", [False, True])
def test_a_lake_and_a_partition_of_it_compacted_at_once_never_double_a_row(tmp_path, small_settings,
                                                                            monkeypatch, outer_first):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=2, files_per_partition=3, rows_per_file=100)
    digest = lake_digest(lake)
    inner = f"{lake}/date=2026-11-01"
    first, second = (str(lake), inner) if outer_first else (inner, str(lake))
    one, two = _interleaved(monkeypatch, first, second, small_settings)
    assert lake_digest(lake) == digest  # before the fix: 900 rows, 300 of them twice
    skipped = [item for report in (one, two) for item in report["skipped"]]
    assert any("overlaps this partition and is being compacted by" in item["reason"] for item in skipped)
    compact_dataset(str(lake), small_settings)  # what was left is compacted by the next run
    assert lake_digest(lake) == digest and journal.pending(storage.resolve(lake)) == []
    assert compact_dataset(str(lake), small_settings)["partitions_compacted"] == 0


def test_a_stale_or_own_lease_above_the_lake_does_not_block_it(tmp_path, small_settings):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake / "inner"), partitions=1, files_per_partition=3, rows_per_file=50)
    held = lease.acquire(storage.resolve(lake), LEASE_NAME, holder="run-dead", purpose="x", ttl_s=0.01)
    assert compact_dataset(str(lake / "inner"), small_settings)["partitions_compacted"] == 1  # stale: passed over
    held.release()
