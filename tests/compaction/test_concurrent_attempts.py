"""Two attempts at one partition at once: a zombie `compact` attempt (presumed dead by Airflow,
still running) whose sources a later attempt of the same DAG run already compacted and retired,
and a source removed by someone else while it is read. A file that is gone is not bad data:
nothing is quarantined or reported as quarantined for it, and no row is lost or doubled."""

from __future__ import annotations

import os

from seedance_tasks.compaction import run, writer
from seedance_tasks.compaction.sample import make_sample_lake

from .conftest import lake_digest

HOLDER = "airflow:seedance_compaction:manual__zombie"


def _quarantine_files(lake) -> list[str]:
    folder = lake / "_seedance" / "quarantine"
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_a_zombie_attempt_does_not_report_retired_sources_as_quarantined(tmp_path, small_settings, monkeypatch):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=4, rows_per_file=300)
    digest = lake_digest(lake)
    [group] = run.plan_for_dag(str(lake), small_settings, holder=HOLDER)["groups"]
    real_open = writer._open
    later: list[dict] = []

    def open_then_a_retry_runs(root, source, int96_unit=None):
        parquet = real_open(root, source, int96_unit)
        if not later:  # the zombie opened its first source; the retry runs to the end meanwhile
            monkeypatch.setattr(writer, "_open", real_open)
            later.append(run.compact_group_attempt(group, holder=HOLDER))
        return parquet

    monkeypatch.setattr(writer, "_open", open_then_a_retry_runs)
    [zombie] = run.compact_group_attempt(group, holder=HOLDER)["results"]
    [retry] = later[0]["results"]
    assert retry["status"] == "compacted" and retry["files_before"] == 4
    assert zombie["quarantined"] == [] and _quarantine_files(lake) == []
    assert zombie["status"] == "compacted" and zombie["outputs"] == retry["outputs"]  # the retry's work
    assert lake_digest(lake) == digest


def test_a_source_removed_while_it_is_read_skips_the_partition_without_quarantine(tmp_path, small_settings,
                                                                                  monkeypatch):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=4, rows_per_file=300)
    partition = lake / "date=2026-11-01"
    moved = tmp_path / "elsewhere.parquet"
    real_read = writer._read

    def read_after_a_writer_moved_one(root, unit, schema):
        if unit.source.path.endswith("part-00002.parquet") and not moved.exists():
            os.rename(partition / "part-00002.parquet", moved)
        return real_read(root, unit, schema)

    monkeypatch.setattr(writer, "_read", read_after_a_writer_moved_one)
    before = sorted(os.listdir(partition))
    report = run.compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 0 and report["quarantined"] == []
    [skipped] = report["skipped"]
    assert "part-00002.parquet disappeared" in skipped["reason"]
    assert _quarantine_files(lake) == []
    assert sorted(os.listdir(partition)) == [name for name in before if name != "part-00002.parquet"]
