"""The `seedance_training` DAG, run for real: plan -> launch (2 gloo processes) -> health, checkpoints."""

from __future__ import annotations

import pytest

from seedance_tasks import checkpoint
from tests.conftest import DATA, xcom_value

pytestmark = pytest.mark.slow


def test_dag_params_and_wiring(dagbag):
    dag = dagbag.dags["seedance_training"]
    assert set(dag.task_dict) == {"plan", "launch", "health", "checkpoints"}
    assert dag.task_dict["launch"].downstream_task_ids == {"health", "checkpoints"}
    assert dag.task_dict["health"].trigger_rule == "all_done"  # diagnoses failed jobs too
    for name in ("nnodes", "nproc_per_node", "steps", "data", "checkpoint_store", "profile", "overrides"):
        assert name in dag.params
    assert {"auto", "nvlink-single-node", "aws-efa", "gcp-tcpx"} <= set(dag.params.get_param("profile").schema["examples"])
    outlets = dag.task_dict["checkpoints"].outlets
    assert [asset.name for asset in outlets] == ["seedance_checkpoint_store"]


def test_dag_run_trains_checkpoints_and_reports_health(run_dag, tmp_path):
    store = tmp_path / "store"
    dag_run = run_dag("seedance_training", {
        "nproc_per_node": 2, "backend": "gloo", "steps": 4, "checkpoint_store": str(store),
        "checkpoint_every": 2, "run": "dag-test", "log_dir": str(tmp_path / "logs"),
        "overrides": {"GLOO_SOCKET_IFNAME": "lo"},
    })
    assert dag_run.state == "success"
    planned = xcom_value(dag_run, "plan")
    assert planned["profile"] == "cpu-gloo" and planned["env"] == {"GLOO_SOCKET_IFNAME": "lo"}
    launched = xcom_value(dag_run, "launch")
    assert launched["ok"] and launched["steps_completed"] == 4 and launched["checkpoints"] == [2, 4]
    assert launched["final_loss"] < launched["first_loss"]
    assert launched["cost"].endswith(" USD") and launched["cost_per_1000_steps"].endswith(" USD")  # telemetry
    assert launched["energy_source"] in ("estimated", "rapl") and 0 <= launched["utilisation"] <= 1
    assert checkpoint.latest_step(str(store), "dag-test") == 4
    assert "[rank0] step 4/4" in (tmp_path / "logs" / "dag-test" / "launch.log").read_text()
    assert xcom_value(dag_run, "health")["verdict"]["status"] == "unknown"  # gloo: nothing NCCL to judge
    announced = {"checkpoint_store": str(store), "run": "dag-test", "steps": [2, 4], "latest": 4}
    assert xcom_value(dag_run, "checkpoints") == announced
    assert _asset_events("seedance_checkpoint_store", dag_run.run_id) == [announced]


def _asset_events(name: str, run_id: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        events = (
            session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.name == name, AssetEvent.source_run_id == run_id).all()
        )
        return [dict(event.extra) for event in events]


def test_plan_task_from_a_topology_file(tmp_path):
    """The DAG's plan task on a GPU topology (a launch would need GPUs, so only the plan here)."""
    from seedance_tasks.training.airflow_tasks import plan_task

    planned = plan_task({"topology": str(DATA / "training" / "topo" / "dgx_a100_8gpu_nv12_12nic_mlx5.txt"),
                         "nnodes": 2, "rdzv_endpoint": "node0:29500", "checkpoint_store": str(tmp_path)},
                        "manual__2026-11-29T10:00:00+00:00")
    assert planned["profile"] == "ib-multi-node" and planned["backend"] == "nccl"
    assert planned["env"]["NCCL_IB_HCA"].startswith("=mlx5_0,mlx5_1")
    assert planned["run"] == "dag-manual__2026-11-29T10-00-00-00-00"


def test_the_form_takes_a_profile_of_the_configured_profiles_file_and_the_plan_checks_it(dagbag, tmp_path,
                                                                                           monkeypatch):
    import jsonschema
    from airflow.sdk.exceptions import AirflowFailException

    from seedance_tasks.training.airflow_tasks import plan_task

    schema = dagbag.dags["seedance_training"].params.get_param("profile").schema
    for name in ("my-roce", "nccl-defaults", "auto", None):  # a deployment's own profile, the built-in one
        jsonschema.validate(name, schema)
    assert "ib-multi-node" in schema["examples"] and "nccl-defaults" in schema["examples"]
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("profiles:\n  my-roce:\n    env: {NCCL_IB_GID_INDEX: 3}\n")
    monkeypatch.setenv("SEEDANCE__TRAINING__PROFILES_FILE", str(profiles))
    planned = plan_task({"profile": "my-roce", "backend": "gloo"}, "manual__1")
    assert planned["profile"] == "my-roce"
    with pytest.raises(AirflowFailException, match=r"unknown NCCL profile 'ib-multi-node'\n.*auto, my-roce"):
        plan_task({"profile": "ib-multi-node", "backend": "gloo"}, "manual__1")


def test_a_form_nproc_per_node_of_zero_means_one_per_gpu_whatever_the_setting(tmp_path, monkeypatch):
    from seedance_tasks.training.airflow_tasks import plan_task

    monkeypatch.setenv("SEEDANCE__TRAINING__NPROC_PER_NODE", "4")
    topology = str(DATA / "training" / "topo" / "dgx_a100_8gpu_nv12_12nic_mlx5.txt")
    assert plan_task({"topology": topology, "nproc_per_node": 0}, "manual__1")["nproc_per_node"] == 8
    assert plan_task({"topology": topology, "nproc_per_node": None}, "manual__1")["nproc_per_node"] == 4
    assert plan_task({"topology": topology, "nproc_per_node": 2}, "manual__1")["nproc_per_node"] == 2


def _bad_topology(tmp_path, kind: str) -> str:
    import os

    if kind == "fifo":  # reading one would never end
        os.mkfifo(tmp_path / "topo.fifo")
        return str(tmp_path / "topo.fifo")
    if kind == "oversized":
        (tmp_path / "huge.txt").write_bytes(b"\0" * (5 * 1024**2))
        return str(tmp_path / "huge.txt")
    return {"missing": str(tmp_path / "absent.txt"), "folder": str(tmp_path), "blank": "  "}[kind]


@pytest.mark.parametrize("kind", ["missing", "folder", "fifo", "oversized", "blank"])
def test_the_cli_and_the_dag_refuse_a_bad_topology_file_with_the_same_words(tmp_path, kind):
    from airflow.sdk.exceptions import AirflowFailException
    from typer.testing import CliRunner

    from seedance_tasks.cli import app
    from seedance_tasks.training.airflow_tasks import plan_task

    path = _bad_topology(tmp_path, kind)
    result = CliRunner().invoke(app, ["train", "plan", "--topology", path])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    said = " ".join(result.output.split())  # rich wraps long lines
    with pytest.raises(AirflowFailException) as failed:
        plan_task({"topology": path}, "manual__1")
    message, _, hint = str(failed.value).removeprefix("error: ").partition("\n  hint: ")
    message, hint = " ".join(message.split()), " ".join(hint.split())
    assert message and f"error: {message}" in said and f"hint: {hint}" in said, (said, str(failed.value))
    assert "nvidia-smi topo -m > topo.txt" in hint


@pytest.mark.parametrize("run", ["../../escaped", "/tmp/elsewhere", ".hidden", "a/b"])
def test_a_run_that_is_not_one_path_component_is_refused_before_its_log_folder_is_made(tmp_path, run):
    from airflow.sdk.exceptions import AirflowFailException

    from seedance_tasks.errors import UsageError
    from seedance_tasks.training.airflow_tasks import plan_task
    from seedance_tasks.training.launch import launch

    base = tmp_path / "a" / "logs"
    with pytest.raises(AirflowFailException, match="bad run name"):
        plan_task({"run": run, "checkpoint_store": str(tmp_path / "store"), "log_dir": str(base)}, "manual__1")
    with pytest.raises(UsageError, match="bad run name"):
        launch(nproc_per_node=1, backend="gloo", steps=1, checkpoint_store=str(tmp_path / "store"), run=run,
               log_dir=base / "x")
    assert not (tmp_path / "escaped").exists() and not base.exists()
