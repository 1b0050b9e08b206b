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


def test_compact_task_retried_by_airflow_after_a_transient_error(tmp_path, run_dag, dagbag):
    """A real Airflow retry: the first `compact` attempt fails mid-retire (an injected transient
    storage error), Airflow runs it again (try 2), which finishes the job: the lake holds exactly
    the original rows, the report counts each partition once, and the DAG run's lease is released."""
    from datetime import timedelta

    from seedance_tasks import faults, journal, lease, storage
    from seedance_tasks.compaction.run import LEASE_NAME

    from .conftest import lake_digest

    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=2, files_per_partition=3, rows_per_file=500)
    digest = lake_digest(lake)
    compact = dagbag.dags["seedance_compaction"].task_dict["compact"]
    saved = compact.retry_delay, compact.retry_exponential_backoff
    compact.retry_delay, compact.retry_exponential_backoff = timedelta(seconds=0), False  # no 2 min wait here
    try:
        # the 2nd retire point of the process: the first compact attempt, mid-retire; fires once
        with faults.armed(at=2, mode="raise", match="storage.retire"):
            # every param explicit: the session's DAG object keeps the params of earlier runs' conf
            dag_run = run_dag("seedance_compaction", {"uri": str(lake), "target_file_size": "512KiB", "min_age": "0",
                                                      "dry_run": False, "purge_older_than": "7d"})
    finally:
        compact.retry_delay, compact.retry_exponential_backoff = saved
    assert dag_run.state == "success"
    tries = sorted(ti.try_number for ti in dag_run.get_task_instances() if ti.task_id == "compact")
    assert tries == [1, 2], tries  # one mapped task retried once, its sibling ran once
    report = xcom_value(dag_run, "report")
    assert report["partitions_compacted"] == 2 and report["rows"] == digest[0]
    assert lake_digest(lake) == digest
    root = storage.resolve(lake)
    assert journal.pending(root) == [] and lease.current(root, LEASE_NAME) is None
