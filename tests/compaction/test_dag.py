import pytest

from seedance_tasks.compaction.sample import make_sample_lake
from tests.conftest import xcom_value

from .conftest import read_lake


def test_compaction_dag_run_compacts_the_lake(tmp_path, run_dag):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=3, files_per_partition=5, rows_per_file=1_500)
    before = read_lake(lake)
    dag_run = run_dag(
        "seedance_compaction",
        {"uri": str(lake), "target_file_size": "512KiB", "min_age": "0", "purge_older_than": "0"},
    )
    assert dag_run.state == "success"
    report = xcom_value(dag_run, "report")
    assert report["partitions_compacted"] == 3 and report["files_before"] == 15
    assert report["rows"] == before.num_rows
    assert read_lake(lake).equals(before)
    purge = xcom_value(dag_run, "purge_trash")
    assert purge["purged"] == [report["run_id"]]  # purge_older_than=0 empties the trash
    mapped = [ti for ti in dag_run.get_task_instances() if ti.task_id == "compact"]
    assert len(mapped) == 3 and all(ti.state == "success" for ti in mapped)

    again = run_dag("seedance_compaction", {"uri": str(lake), "target_file_size": "512KiB", "min_age": "0"})
    assert again.state == "success"
    assert xcom_value(again, "report")["partitions_compacted"] == 0


def test_compaction_dag_dry_run_changes_nothing(tmp_path, run_dag):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=2, files_per_partition=3, rows_per_file=500)
    dag_run = run_dag("seedance_compaction", {"uri": str(lake), "min_age": "0", "dry_run": True})
    assert dag_run.state == "success"
    report = xcom_value(dag_run, "report")
    assert report["dry_run"] and report["partitions_compacted"] == 2
    assert not (lake / "_seedance").exists()


def test_compaction_dag_fails_on_a_table_format(tmp_path, run_dag):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=3, rows_per_file=200)
    (lake / "_delta_log").mkdir()
    (lake / "_delta_log" / "00000000000000000000.json").write_text("{}")
    dag_run = run_dag("seedance_compaction", {"uri": str(lake), "min_age": "0"})
    assert dag_run.state == "failed"


def test_invalid_params_are_refused(run_dag):
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError):
        run_dag("seedance_compaction", {"uri": "/tmp/x", "target_file_size": "big"})
