"""Demo: a 2-process gloo training run on the CPU through the `seedance_training` DAG."""

from __future__ import annotations

from pathlib import Path

from seedance_tasks.demo import DemoAirflow, DemoResult

STEPS = 12


def demo(workspace: Path, airflow: DemoAirflow) -> DemoResult:
    """Plan (no GPUs: the cpu-gloo profile), launch 2 ranks for 12 steps with the batch-size warmup,
    checkpoint every 4 steps into the workspace's store, read the job's health."""
    store = workspace / "training-checkpoints"
    logs = workspace / "training-logs"
    dag_run = airflow.run("seedance_training", {
        "nproc_per_node": 2, "backend": "gloo", "steps": STEPS, "checkpoint_every": 4,
        "checkpoint_store": str(store), "log_dir": str(logs),
    })
    planned = airflow.xcom(dag_run, "plan") or {}
    launched = airflow.xcom(dag_run, "launch") or {}
    checked = airflow.xcom(dag_run, "health") or {}
    figures = []
    if launched:
        from seedance_tasks.training.launch import read_metrics

        trajectory = read_metrics(launched["metrics"])["trajectory"]
        batches = [row["global_batch"] for row in trajectory]
        figures = [
            ("profile / backend", f"{planned.get('profile')} / {planned.get('backend')}, "
                                  f"{launched['nproc_per_node']} ranks"),
            ("loss, step 1 -> last", f"{launched['first_loss']:.3f} -> {launched['final_loss']:.3f}"),
            ("global batch (micro-batch fixed)", f"{batches[0]} -> {max(batches)} by accumulation"),
            ("checkpoints (steps)", ", ".join(map(str, launched["checkpoints"])) or "none"),
            ("job health", _health(checked, planned)),
            ("wall time", f"{launched['seconds']} s"),
        ]
        did = (f"{launched['steps_completed']} steps on 2 gloo ranks, loss {launched['first_loss']:.2f} -> "
               f"{launched['final_loss']:.2f}, {len(launched['checkpoints'])} checkpoints")
    else:
        did = "no launch summary (see the task logs)"
    return DemoResult(
        "training launch", "seedance_training", dag_run.state, did, figures,
        outputs=[launched.get("log") or str(logs), f"{store}/{launched.get('run', '')}"],
    )


def _health(checked: dict, planned: dict) -> str:
    status = (checked.get("verdict") or {}).get("status", "?")
    if status == "unknown" and planned.get("backend") == "gloo":
        return "no NCCL to judge (gloo on CPU)"
    return status
