"""The training DAG's form with odd values: each refused by the plan task with one clear error (not
retried), before anything runs; what is safe is taken."""

from __future__ import annotations

import os

import pytest


def _refused(params: dict) -> str:
    from airflow.sdk.exceptions import AirflowFailException

    from seedance_tasks.training.airflow_tasks import plan_task

    with pytest.raises(AirflowFailException) as failed:
        plan_task(params, "manual__1")
    text = str(failed.value)
    assert text.startswith("error: ") and "\n  hint: " in text and "unexpected" not in text, text
    return text


@pytest.mark.parametrize("count", [10**9, 100_000])
def test_more_cpu_processes_than_cores_are_refused_at_once(count, tmp_path):
    """Without GPUs a typo of a process count forked that many trainers (10**9 never got past the plan)."""
    text = _refused({"nproc_per_node": count, "log_dir": str(tmp_path)})
    assert f"--nproc-per-node {count} CPU processes" in text and "cores" in text
    from seedance_tasks.training.plan import make_plan

    assert make_plan(None, nproc_per_node=max(2, os.cpu_count() or 1))["nproc_per_node"] >= 2  # up to the cores


@pytest.mark.parametrize("overrides", [
    {"NCCL_NET_PLUGIN": "/tmp/evil/libnccl-net.so"}, {"NCCL_TUNER_PLUGIN": "../lib/x.so"},
    {"NCCL_PROFILER_PLUGIN": "/dev/shm/p.so"}, {"NCCL_DEBUG_FILE": "/home/airflow/.bashrc"},
    {"NCCL_TOPO_DUMP_FILE": "/etc/cron.d/x"}, {"NCCL_CONF_FILE": "/tmp/nccl.conf"},
])
def test_form_overrides_that_load_a_library_or_write_a_file_are_refused(overrides, tmp_path):
    name = next(iter(overrides))
    text = _refused({"overrides": overrides, "log_dir": str(tmp_path)})
    assert "refused overrides from the form" in text and name in text and "profiles_file" in text


@pytest.mark.parametrize("overrides", [{"LD_PRELOAD": "/tmp/x.so"}, {"PATH": "/tmp"}, {"PYTHONPATH": "/tmp"}])
def test_form_overrides_that_are_not_nccl_or_pytorch_variables_are_refused(overrides, tmp_path):
    assert next(iter(overrides)) in _refused({"overrides": overrides, "log_dir": str(tmp_path)})


@pytest.mark.parametrize("overrides", [["NCCL_DEBUG"], "NCCL_DEBUG=INFO", 3])
def test_form_overrides_that_are_not_an_object_are_one_clear_error(overrides, tmp_path):
    assert "must be a JSON object" in _refused({"overrides": overrides, "log_dir": str(tmp_path)})


def test_safe_form_overrides_and_a_plugin_by_name_are_taken(tmp_path):
    from seedance_tasks.training.airflow_tasks import plan_task

    planned = plan_task({"overrides": {"NCCL_NET_PLUGIN": "aws-ofi", "NCCL_SOCKET_IFNAME": "=eth0",
                                       "NCCL_DEBUG": "WARN"}, "log_dir": str(tmp_path)}, "manual__1")
    assert planned["env"]["NCCL_NET_PLUGIN"] == "aws-ofi" and planned["env"]["NCCL_SOCKET_IFNAME"] == "=eth0"


@pytest.mark.parametrize("store", ["relative/store", "../../etc", "/srv/ckpt/../../etc", "file://relative",
                                   "s3://bucket/../other", "s3://"])
def test_a_form_checkpoint_store_that_is_relative_or_climbs_is_refused(store, tmp_path):
    """Relative to the worker's folder, a retry on another worker would not find the checkpoints
    and would start over silently."""
    text = _refused({"checkpoint_store": store, "log_dir": str(tmp_path / "logs")})
    assert "not an absolute location" in text and "s3://bucket/prefix" in text
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("store", ["/srv/ckpt", "file:///srv/ckpt", "s3://bucket/prefix"])
def test_an_absolute_form_checkpoint_store_is_taken(store, tmp_path):
    from seedance_tasks.training.airflow_tasks import plan_task

    planned = plan_task({"checkpoint_store": store, "log_dir": str(tmp_path)}, "manual__1")
    assert planned["checkpoint_store"] == store and planned["run"] == "dag-manual__1"


def test_a_run_name_too_long_for_a_folder_is_refused_before_the_launch(tmp_path):
    """It names the run's log and checkpoint folders: the plan took it, then the launch's mkdir
    failed ("file name too long", with a hint about partition names)."""
    from seedance_tasks.errors import UsageError
    from seedance_tasks.training.launch import launch

    text = _refused({"run": "r" * 300, "checkpoint_store": str(tmp_path / "store"), "log_dir": str(tmp_path)})
    assert "300 bytes long" in text and "at most 200 bytes" in text
    with pytest.raises(UsageError, match="bytes long"):
        launch(nproc_per_node=1, backend="gloo", steps=1, checkpoint_store=str(tmp_path / "store"), run="é" * 150,
               log_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_long_dag_run_id_gives_a_run_name_that_fits_a_folder_and_stays_distinct(tmp_path):
    from seedance_tasks.training.airflow_tasks import plan_task

    first = plan_task({"checkpoint_store": "/srv/ckpt", "log_dir": str(tmp_path)}, "api__" + "a" * 245 + "1")
    second = plan_task({"checkpoint_store": "/srv/ckpt", "log_dir": str(tmp_path)}, "api__" + "a" * 245 + "2")
    assert len(first["run"]) <= 200 and first["run"] != second["run"]
    assert first["log_dir"].endswith(first["run"])


def test_a_plan_without_a_checkpoint_store_warns_that_a_retry_starts_over(tmp_path, monkeypatch):
    from seedance_tasks.training.airflow_tasks import plan_task

    monkeypatch.setenv("SEEDANCE__TRAINING__CHECKPOINT_STORE", "")
    monkeypatch.setenv("SEEDANCE__CHECKPOINT__STORE", "")
    planned = plan_task({"log_dir": str(tmp_path)}, "manual__1")
    assert planned["checkpoint_store"] is None
    assert any("a retried launch starts over from step 0" in warning for warning in planned["warnings"])
    stored = plan_task({"log_dir": str(tmp_path), "checkpoint_store": "/srv/ckpt"}, "manual__1")
    assert not any("starts over" in warning for warning in stored["warnings"])


@pytest.mark.parametrize(("key", "value"), [("NNODES", "1000000000"), ("NPROC_PER_NODE", "1000000"),
                                            ("MAX_RESTARTS", "1000000000000")])
def test_job_sizes_and_restarts_past_any_real_job_are_refused_at_load_naming_the_key(key, value):
    from seedance_tasks.config import load_settings
    from seedance_tasks.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        load_settings(None, environ={f"SEEDANCE__TRAINING__{key}": value})
    assert f"training.{key.lower()}" in info.value.message
