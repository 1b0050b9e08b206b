"""The training DAG's task bodies: read params, call the library, return a small summary."""

from __future__ import annotations

import hashlib
import logging
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any

from seedance_tasks.dag_support import fail_fast
from seedance_tasks.training.envvars import form_overrides
from seedance_tasks.training.launch import MAX_RUN_BYTES, absolute_store, check_run

log = logging.getLogger("seedance.training")


def _topology(value: str | None):
    """The `topology` param: a saved `nvidia-smi topo -m` on the worker, `detect`, or empty (none)."""
    from seedance_tasks.training.topology import load_topology

    if value is None or value == "":
        return None
    return load_topology(None if value == "detect" else value, detect_here=value == "detect")


def _run_name(params: dict, run_id: str | None) -> str | None:
    """The run's name: the `run` param (UsageError unless it is one path component of at most
    MAX_RUN_BYTES: it names the run's log folder under log_dir too), else one derived from the DAG run id."""
    if params.get("run"):
        return check_run(params["run"])
    if not run_id:
        return None
    name = "dag-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", run_id).strip("-.")
    if len(name) > MAX_RUN_BYTES:  # an API-triggered run id can be 250 characters: cut, kept distinct
        name = name[:MAX_RUN_BYTES - 9] + "-" + hashlib.sha256(run_id.encode()).hexdigest()[:8]
    return name


@fail_fast
def plan_task(params: dict, run_id: str | None = None) -> dict:
    """The launch plan (profile, env, ranks, command) plus where this run's logs and checkpoints go."""
    from seedance_tasks.config import load_settings
    from seedance_tasks.training.plan import make_plan

    settings = load_settings()
    cfg = settings.training
    overrides = form_overrides(params.get("overrides"))
    store = absolute_store(params.get("checkpoint_store")) or cfg.checkpoint_store or settings.checkpoint.store
    nnodes = int(params.get("nnodes") or cfg.nnodes)
    max_restarts = int(cfg.max_restarts if params.get("max_restarts") is None else params["max_restarts"])
    plan = make_plan(
        _topology(params.get("topology")),
        nodes=nnodes,
        # 0 is a choice (one process per GPU), not "from config": only an empty field takes the setting
        nproc_per_node=int(cfg.nproc_per_node if params.get("nproc_per_node") is None else params["nproc_per_node"]),
        profile=params.get("profile") or cfg.profile,
        overrides=overrides,
        backend=params.get("backend") or cfg.backend,
        nccl_debug=cfg.nccl_debug,
        max_restarts=max_restarts,
        rdzv_endpoint=params.get("rdzv_endpoint") or None,
        profiles_file=cfg.profiles_file,
        nic_transport=params.get("nic_transport") or cfg.nic_transport,
    )
    run = _run_name(params, run_id) if store else None
    base = params.get("log_dir") or cfg.log_dir
    # one folder per training run: a retry of this DAG run appends to the same metrics and log
    log_dir = Path(base) / (run or _run_name({}, run_id) or "run") if base else Path(
        tempfile.mkdtemp(prefix="seedance-train-"))
    if not store:
        plan["warnings"].append("no checkpoint store (the form's, training.checkpoint_store or checkpoint.store): "
                                "the job saves no checkpoints, so a retried launch starts over from step 0")
    for warning in plan["warnings"]:
        log.warning("%s", warning)
    log.info("profile %s (%s); env %s", plan["profile"]["name"], plan["profile"]["why"], plan["env"])
    return {
        "profile": plan["profile"]["name"],
        "why": plan["profile"]["why"],
        "expected_busbw_gbps": plan["profile"]["expected_busbw_gbps"],
        "backend": plan["backend"],
        "nic_transport": plan["nic_transport"],
        "nproc_per_node": plan["nproc_per_node"],
        "nnodes": nnodes,
        "max_restarts": max_restarts,
        "env": plan["env"],
        "warnings": plan["warnings"],
        "command": shlex.join(plan["command"]),
        "checkpoint_store": store,
        "run": run,
        "log_dir": str(log_dir.resolve()),
    }


@fail_fast(retry_on=(RuntimeError,))  # a failed job is retried: it resumes from its checkpoint
def launch_task(planned: dict, params: dict) -> dict:
    """Run the job, streaming its output into the task log; raise (fail the task) if it fails."""
    from seedance_tasks.training.launch import launch

    result = launch(
        topology=_topology(params.get("topology")),
        nproc_per_node=planned["nproc_per_node"],  # as planned (0 resolved to the GPU count there)
        nnodes=planned["nnodes"],
        rdzv_endpoint=params.get("rdzv_endpoint") or None,
        backend=planned["backend"],
        steps=params.get("steps") or None,
        checkpoint_store=planned["checkpoint_store"],
        run=planned["run"],
        checkpoint_every=params.get("checkpoint_every"),
        data=params.get("data") or None,
        max_restarts=int(planned.get("max_restarts") or 0),
        profile=planned["profile"],
        nic_transport=params.get("nic_transport") or None,
        overrides=form_overrides(params.get("overrides")),
        log_dir=planned["log_dir"],
        on_line=lambda line: log.info("%s", line),
    )
    summary = _summary(result)
    if not result["ok"]:
        raise RuntimeError(f"training job failed: {result['error']} (log: {result['log']})")
    return summary


def _summary(result: dict[str, Any]) -> dict:
    keys = ("ok", "exit_code", "error", "restarts", "steps_completed", "first_loss", "final_loss", "checkpoints",
            "run", "checkpoint_store", "profile", "backend", "nproc_per_node", "nnodes", "log", "metrics", "seconds",
            "interrupted", "retryable", "checkpoint_interval", "skipped_steps")
    summary = {key: result.get(key) for key in keys}
    telemetry = result.get("telemetry") or {}
    per_1000 = telemetry.get("usd_per_1000_steps")
    summary.update({  # cost so far (every attempt of the run), money to the cent with its currency
        "cost": telemetry.get("cost"),
        "cost_per_1000_steps": f"{per_1000} {telemetry.get('currency', 'USD')}" if per_1000 is not None else None,
        "energy_kwh": telemetry.get("energy_kwh"),
        "energy_source": "+".join(telemetry.get("energy_sources") or []) or None,
        "utilisation": telemetry.get("utilisation"),
        "telemetry": telemetry.get("folder"),
        # what a crash left unreadable (skipped, not counted): telemetry sample files, metrics lines
        "damaged_telemetry_files": telemetry.get("damaged_files") or None,
        "damaged_metrics_lines": result.get("damaged_metrics_lines") or None,
    })
    return summary


@fail_fast
def health_task(planned: dict) -> dict:
    """The health report of the job's log (also after a failed launch: that is when it matters)."""
    from seedance_tasks.training import health

    path = Path(planned["log_dir"]) / "launch.log"
    if not path.is_file():
        return {"log": str(path), "verdict": {"status": "unknown", "cause": "no launch log", "fix": "see launch"}}
    report = health.report(path.read_text(errors="replace"), expected_busbw=planned.get("expected_busbw_gbps"))
    verdict = report["verdict"]
    log.info("health: %s: %s (fix: %s)", verdict["status"], verdict["cause"], verdict["fix"])
    return {
        "log": str(path),
        "verdict": verdict,
        "timeouts": report["timeouts"][:20],
        "channels": report["channels"],
        "transports": report["transports"],
        "algorithms": report["algorithms"],
    }


@fail_fast
def checkpoints_task(launched: dict) -> dict:
    """Announce the run's new checkpoints (the Asset event); skipped when it saved none."""
    from airflow.sdk.exceptions import AirflowSkipException

    if not launched or not launched.get("checkpoints"):
        raise AirflowSkipException("the job saved no checkpoints")
    return {"checkpoint_store": launched["checkpoint_store"], "run": launched["run"],
            "steps": launched["checkpoints"], "latest": max(launched["checkpoints"])}
