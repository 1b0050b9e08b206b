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


CONF = {"target_file_size": "512KiB", "min_age": "0", "dry_run": False, "purge_older_than": "7d"}


def test_a_run_failed_at_plan_releases_the_lakes_lease_and_stays_failed(tmp_path, run_dag):
    """The plan task takes the lease for the run and fails for good (a Delta table): the teardown
    releases it, so the CLI (or the next run) is not refused for the lease's TTL, and the run is
    still `failed`."""
    from seedance_tasks import lease, storage
    from seedance_tasks.compaction.run import LEASE_NAME, compact_dataset
    from seedance_tasks.compaction.settings import CompactionSettings

    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=3, rows_per_file=200)
    (lake / "_delta_log").mkdir()
    (lake / "_delta_log" / "00000000000000000000.json").write_text("{}")
    dag_run = run_dag("seedance_compaction", {"uri": str(lake), **CONF})
    assert dag_run.state == "failed"
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert states["plan"] == "failed" and states["release_leases"] == "success", states
    assert lease.current(storage.resolve(lake), LEASE_NAME) is None
    (lake / "_delta_log" / "00000000000000000000.json").unlink()
    (lake / "_delta_log").rmdir()
    settings = CompactionSettings(target_file_size="512KiB", min_age=0)
    assert compact_dataset(str(lake), settings)["partitions_compacted"] == 1  # not refused: no wait


def test_a_compact_task_failed_for_good_keeps_its_siblings_work_and_frees_the_lake(tmp_path, run_dag, monkeypatch):
    """One mapped `compact` task fails for good, its sibling succeeds: the run fails (no report),
    the sibling's partition stays compacted, no row is lost, the lease is released, and the next
    run compacts the partition left."""
    from seedance_tasks import journal, lease, storage
    from seedance_tasks.compaction import run
    from seedance_tasks.compaction.run import LEASE_NAME
    from seedance_tasks.errors import RefusedError

    from .conftest import lake_digest

    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=2, files_per_partition=3, rows_per_file=500)
    digest = lake_digest(lake)
    real, doomed = run.compact_group_attempt, []

    def first_fails(group, holder):  # the first group started fails, not retried (RefusedError)
        doomed[:] = doomed or [group["indices"]]
        if group["indices"] == doomed[0]:
            raise RefusedError("injected: this group cannot be compacted", hint="a test")
        return real(group, holder=holder)

    monkeypatch.setattr(run, "compact_group_attempt", first_fails)
    failed = run_dag("seedance_compaction", {"uri": str(lake), **CONF})
    monkeypatch.setattr(run, "compact_group_attempt", real)
    assert failed.state == "failed"
    tis = failed.get_task_instances()
    assert sorted(ti.state for ti in tis if ti.task_id == "compact") == ["failed", "success"]
    assert {ti.task_id: ti.state for ti in tis}["release_leases"] == "success"
    root = storage.resolve(lake)
    assert lake_digest(lake) == digest and journal.pending(root) == []
    assert lease.current(root, LEASE_NAME) is None
    again = run_dag("seedance_compaction", {"uri": str(lake), **CONF})
    assert again.state == "success"
    assert xcom_value(again, "report")["partitions_compacted"] == 1
    assert lake_digest(lake) == digest


def test_the_lake_planned_is_freed_even_if_config_names_another_one_by_then(tmp_path, run_dag, monkeypatch):
    """A nightly run (lake from `compaction.default_uri`) fails at a compact task after config was
    edited to name another lake: the teardown still releases the lease of the lake it planned."""
    from seedance_tasks import lease, storage
    from seedance_tasks.compaction import run
    from seedance_tasks.compaction.run import LEASE_NAME
    from seedance_tasks.errors import RefusedError

    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=3, rows_per_file=200)
    monkeypatch.setenv("SEEDANCE__COMPACTION__DEFAULT_URI", str(lake))

    def config_edited_then_fails(group, holder):
        monkeypatch.setenv("SEEDANCE__COMPACTION__DEFAULT_URI", str(tmp_path / "another-lake"))
        raise RefusedError("injected: cannot compact", hint="a test")

    monkeypatch.setattr(run, "compact_group_attempt", config_edited_then_fails)
    dag_run = run_dag("seedance_compaction", {key: value for key, value in CONF.items()})
    assert dag_run.state == "failed"
    assert {ti.task_id: ti.state for ti in dag_run.get_task_instances()}["release_leases"] == "success"
    assert lease.current(storage.resolve(lake), LEASE_NAME) is None


def test_one_bad_lake_of_a_signal_run_does_not_stop_the_others(tmp_path, monkeypatch):
    """A small-files event names three lakes: one fine, one deleted since, one a Delta table. The
    task adapters (as the DAG chains them) compact the good lake, report the other two under
    `failed_lakes` with an `error:` line each, and the teardown frees every lease the run took;
    a run whose every lake fails still fails."""
    import logging
    from collections import namedtuple
    from types import SimpleNamespace

    import pendulum
    from airflow.sdk.exceptions import AirflowFailException

    from seedance_tasks import dag_support, lease, storage
    from seedance_tasks.compaction import airflow_tasks
    from seedance_tasks.compaction.run import LEASE_NAME

    from .conftest import lake_digest

    holder = "airflow:seedance_compaction:asset_triggered__1"
    monkeypatch.setattr(airflow_tasks, "airflow_lease_holder", lambda: holder)
    monkeypatch.setattr(dag_support, "airflow_lease_holder", lambda: holder)
    good, missing, delta = tmp_path / "good", tmp_path / "deleted", tmp_path / "delta"
    make_sample_lake(str(good), partitions=2, files_per_partition=3, rows_per_file=300)
    make_sample_lake(str(delta), partitions=1, files_per_partition=3, rows_per_file=100)
    (delta / "_delta_log").mkdir()
    (delta / "_delta_log" / "00000000000000000000.json").write_text("{}")
    digest = lake_digest(good)

    def events(*uris):
        targets = [{"dag_id": "seedance_compaction", "conf": {"uri": str(uri), "dry_run": False}} for uri in uris]
        event = SimpleNamespace(timestamp=pendulum.now("UTC"), extra={"targets": targets})
        return {namedtuple("Asset", "name")("seedance_signal_small_files"): [event]}

    params = {"target_file_size": "512KiB", "min_age": "0", "purge_older_than": "7d"}
    triggered = events(good, missing, delta)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = records.append  # Airflow's logging config replaces pytest's capture handler
    logging.getLogger("seedance_tasks.compaction").addHandler(handler)
    try:
        planned = airflow_tasks.plan_task(params, triggered)
    finally:
        logging.getLogger("seedance_tasks.compaction").removeHandler(handler)
    assert [lake["uri"] for lake in planned["failed_lakes"]] == [str(missing), str(delta)]
    logged = "\n".join(record.getMessage() for record in records)
    assert f"error: lake {missing}" in logged and f"error: lake {delta}" in logged and "hint:" in logged
    results = [airflow_tasks.compact_group_task(group) for group in planned["groups"]]
    summary = airflow_tasks.report_task(planned, results)
    assert [lake["uri"] for lake in summary["failed_lakes"]] == [str(missing), str(delta)]
    (report,) = airflow_tasks.lake_summaries(summary)
    assert report["partitions_compacted"] == 2 and lake_digest(good) == digest
    airflow_tasks.purge_task(params, summary)
    # the Delta table was refused before any lease was taken in it: nothing to release, nothing written
    assert airflow_tasks.release_task(params, triggered, planned)["released"] == []
    assert not (delta / "_seedance").exists()
    assert all(lease.current(storage.resolve(uri), LEASE_NAME) is None for uri in (good, delta))
    with pytest.raises(AirflowFailException, match="does not exist"):
        airflow_tasks.plan_task(params, events(missing, tmp_path / "also-deleted"))
