"""A table-format dataset (Delta, Iceberg, Hudi), or a folder inside one, is refused before
anything is written into it: no lease, no journal, no `_seedance/` of any kind."""

from __future__ import annotations

import hashlib
import os

import pytest
from typer.testing import CliRunner

from seedance_tasks import storage
from seedance_tasks.cli import app
from seedance_tasks.compaction.run import compact_dataset, plan_for_dag
from seedance_tasks.compaction.sample import make_sample_lake
from seedance_tasks.errors import RefusedError

MARKERS = [("_delta_log/00000000000000000000.json", "Delta Lake"), ("metadata/v1.metadata.json", "Iceberg"),
           (".hoodie/hoodie.properties", "Hudi")]


def _snapshot(path) -> dict[str, str]:
    """Every file and folder below `path` (hidden ones included), with a digest of each file."""
    found = {}
    for directory, dirs, files in os.walk(path):
        for name in dirs:
            found[os.path.relpath(os.path.join(directory, name), path) + "/"] = ""
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                found[os.path.relpath(os.path.join(directory, name), path)] = hashlib.sha256(handle.read()).hexdigest()
    return found


def _table(tmp_path, marker):
    table = tmp_path / "table"
    make_sample_lake(str(table), partitions=2, files_per_partition=3, rows_per_file=100)
    (table / marker).parent.mkdir(parents=True, exist_ok=True)
    (table / marker).write_text("{}")
    return table


@pytest.mark.parametrize(("marker", "name"), MARKERS)
def test_a_refused_table_gets_no_seedance_folder_from_any_face(tmp_path, small_settings, marker, name):
    table = _table(tmp_path, marker)
    before = _snapshot(table)
    with pytest.raises(RefusedError, match=name):
        compact_dataset(str(table), small_settings)
    with pytest.raises(RefusedError, match=name):
        plan_for_dag(str(table), small_settings, holder="airflow:seedance_compaction:manual__t")
    result = CliRunner().invoke(app, ["compact", str(table), "--min-age", "0"])
    assert result.exit_code == 3 and name in result.output and "hint:" in result.output
    assert _snapshot(table) == before  # untouched: not even an empty _seedance/leases/


@pytest.mark.parametrize(("marker", "name"), MARKERS)
def test_a_partition_inside_a_table_is_refused_and_its_files_kept(tmp_path, small_settings, marker, name):
    """Pointing compaction at one partition of a Delta table would rewrite files its log names."""
    table = _table(tmp_path, marker)
    before = _snapshot(table)
    for partition in ("date=2026-11-01", "date=2026-11-02"):
        with pytest.raises(RefusedError, match=name) as refused:
            compact_dataset(str(table / partition), small_settings)
        assert str(table / marker.split("/")[0]) in refused.value.message and refused.value.hint
    assert _snapshot(table) == before


def test_a_folder_named_metadata_without_iceberg_files_is_data(tmp_path, small_settings):
    lake = tmp_path / "metadata" / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=3, rows_per_file=100)
    assert compact_dataset(str(lake), small_settings)["partitions_compacted"] == 1


def test_a_partition_of_a_delta_table_on_s3_is_refused_untouched(s3_bucket, small_settings):
    uri = f"s3://{s3_bucket}/warehouse/table"
    make_sample_lake(uri, partitions=1, files_per_partition=3, rows_per_file=100)
    root = storage.resolve(uri)
    storage.write_bytes_atomic(root.fs, root.join("_delta_log", "00000000000000000000.json"), b"{}")
    before = sorted(info.path for info in storage.list_files(root, include_hidden=True))
    for target in (uri, f"{uri}/date=2026-11-01"):
        with pytest.raises(RefusedError, match="Delta Lake"):
            compact_dataset(target, small_settings)
    assert sorted(info.path for info in storage.list_files(root, include_hidden=True)) == before


def test_the_dag_refuses_a_table_without_writing_into_it(tmp_path, run_dag):
    table = _table(tmp_path, "_delta_log/00000000000000000000.json")
    before = _snapshot(table)
    dag_run = run_dag("seedance_compaction", {"uri": str(table), "min_age": "0"})
    assert dag_run.state == "failed"
    plan = next(ti for ti in dag_run.get_task_instances() if ti.task_id == "plan")
    assert plan.try_number == 1  # refused: failed at once, not retried
    assert _snapshot(table) == before
