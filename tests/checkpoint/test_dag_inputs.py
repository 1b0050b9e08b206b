"""DAG `seedance_checkpoints` driven from its trigger form with odd values, and a crowded inbox."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.conftest import xcom_value


def _drop(inbox, run, step):
    (inbox / run).mkdir(parents=True, exist_ok=True)
    path = inbox / run / f"step-{step:06d}.pt"
    torch.save({"w": torch.randn(32, 32)}, path)
    os.utime(path, (0, 0))  # old enough
    return path


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("field", ["store", "inbox"])
def test_a_relative_store_or_inbox_fails_and_touches_nothing(run_dag, tmp_path, monkeypatch, field):
    """A relative path was taken from the worker's working folder: the checkpoints were stored
    there (wherever that is) and the raw files retired from the inbox."""
    from airflow.sdk.exceptions import AirflowFailException

    from seedance_tasks.checkpoint.airflow_tasks import scan_task

    inbox = tmp_path / "inbox"
    _drop(inbox, "r", 1)
    monkeypatch.chdir(tmp_path)
    conf = {"inbox": str(inbox), "store": str(tmp_path / "store"), field: field}
    before = _tree(tmp_path)
    dag_run = run_dag("seedance_checkpoints", conf)
    assert dag_run.state == "failed"
    assert _tree(tmp_path) == before
    with pytest.raises(AirflowFailException, match=f"the `{field}` param '{field}' is a relative path"):
        scan_task(conf)


def test_a_store_in_a_missing_bucket_fails_the_scan(s3_server, tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    from seedance_tasks.checkpoint.airflow_tasks import scan_task

    inbox = tmp_path / "inbox"
    _drop(inbox, "r", 1)
    with pytest.raises(AirflowFailException, match="bucket 'no-such-bucket-c' does not exist"):
        scan_task({"inbox": str(inbox), "store": "s3://no-such-bucket-c/ckpt"})


def test_thousands_of_skipped_inbox_files_keep_the_xcoms_small(run_dag, tmp_path, caplog):
    inbox, store = tmp_path / "inbox", tmp_path / "store"
    (inbox / "r").mkdir(parents=True)
    for index in range(2000):
        (inbox / "r" / f"notes-{index:05d}.txt").write_bytes(b"")
    dag_run = run_dag("seedance_checkpoints", {"inbox": str(inbox), "store": str(store)})
    assert dag_run.state == "success"
    for task_id in ("scan", "report"):
        value = xcom_value(dag_run, task_id)
        assert value["skipped_count"] == 2000 and len(value["skipped"]) == 50
        assert len(json.dumps(value)) < 30_000
    assert "r/notes-01999.txt" in caplog.text  # the full list is in the task log
