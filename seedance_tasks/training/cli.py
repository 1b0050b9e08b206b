"""`seedance train` subcommands: plan, launch, health, schedule."""

from __future__ import annotations

import math
import shlex

import typer

from seedance_tasks.cli_support import JSON_OPTION, console, emit, err_console, escape, handle_errors, table
from seedance_tasks.errors import UsageError

app = typer.Typer(help="Training launch: plan NCCL settings, launch torchrun, read job health.", no_args_is_help=True)

TOPOLOGY_OPTION = typer.Option(None, "--topology", help="saved `nvidia-smi topo -m` output")
DETECT_OPTION = typer.Option(False, "--detect", help="run `nvidia-smi topo -m` on this machine")
MACHINE_OPTION = typer.Option(0, "--machine", min=0, help="which matrix of a file holding several (0 = first)")
SET_OPTION = typer.Option(None, "--set", help="override an env variable: NAME=value (repeatable); validated")
NPROC_OPTION = typer.Option(None, "--nproc-per-node", min=0, help="processes per node (0 = one per GPU)")
PROFILE_OPTION = typer.Option(None, "--profile", help="NCCL profile name (default: auto)")
RDZV_OPTION = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of the rendezvous, for more than one node")
NIC_TRANSPORT_OPTION = typer.Option(
    None, "--nic-transport",
    help="auto | ib | efa | none: how the NICs carry inter-node traffic (default: training.nic_transport; "
         "auto = from the topology's NIC names)")
RESTARTS_OPTION = typer.Option(None, "--max-restarts", min=0, help="torchrun restarts of the worker group; each resumes")


def _not_blank(**options: str | None) -> None:
    """UsageError for an option given as an empty or blank string: left to the library it would
    quietly mean "not given" (synthetic data, the configured store, a temp log folder, auto)."""
    for name, value in options.items():
        if value is not None and not value.strip():
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} is empty", hint=f"give {flag} a value, or leave it out for its default")


def _topology(topology: str | None, detect: bool, machine: int):
    from seedance_tasks.training.topology import load_topology

    return load_topology(topology, detect_here=detect, machine=machine)


def _render_plan(plan: dict) -> None:
    profile = plan["profile"]
    console.print(f"[bold]profile[/] {escape(profile['name'])} — {escape(profile['description'])}  "
                  f"[dim]({escape(profile['why'])})[/]")
    if plan["gpus"]:
        names = plan["gpus"]
        rows = [[a, *[plan["links"][a].get(b, "") for b in names], str(plan["numa"].get(a, "")),
                 plan["cpu_affinity"].get(a) or ""] for a in plan["gpus"]]
        console.print(table("GPU links", ["", *names, "NUMA", "CPUs"], rows))
        if plan["nics"]:
            console.print(f"NICs: {', '.join(plan['nics'])}", markup=False)
    console.print(table(
        f"ranks per node ({plan['nproc_per_node']} x {plan['nodes']} node(s), {plan['backend']})",
        ["local rank", "GPU", "NUMA", "CPUs", "nearest NICs", "extra env"],
        [[r["local_rank"], r["gpu"] or "-", "" if r["numa"] is None else str(r["numa"]), r["cpus"] or "-",
          ",".join(r["nics"]) or "-", " ".join(f"{k}={v}" for k, v in r["env"].items())] for r in plan["ranks"]],
    ))
    console.print(table("environment", ["variable", "value"], sorted(plan["env"].items())))
    for note in profile["notes"]:
        console.print(f"[dim]note:[/] {escape(note)}")
    for warning in plan["warnings"]:
        text, _, hint = warning.partition("; hint: ")
        console.print(f"[yellow]warning:[/] {escape(text)}", highlight=False, soft_wrap=True)
        if hint:
            console.print(f"  [yellow]hint:[/] {escape(hint)}", highlight=False, soft_wrap=True)
    console.print("[bold]command[/] " + escape(shlex.join(plan["command"])))


@app.command("plan")
@handle_errors
def plan_command(
    topology: str = TOPOLOGY_OPTION,
    detect: bool = DETECT_OPTION,
    machine: int = MACHINE_OPTION,
    nodes: int = typer.Option(None, "--nodes", min=1, help="nodes in the job (default: training.nnodes)"),
    nproc_per_node: int = NPROC_OPTION,
    profile: str = PROFILE_OPTION,
    nic_transport: str = NIC_TRANSPORT_OPTION,
    rdzv_endpoint: str = RDZV_OPTION,
    max_restarts: int = RESTARTS_OPTION,
    overrides: list[str] = SET_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Derive the NCCL/PyTorch environment, per-rank NIC and CPU binding, and the torchrun command."""
    from seedance_tasks.config import load_settings

    _not_blank(profile=profile, nic_transport=nic_transport, rdzv_endpoint=rdzv_endpoint)
    from seedance_tasks.training import envvars
    from seedance_tasks.training.plan import make_plan

    cfg = load_settings().training
    plan = make_plan(
        _topology(topology, detect, machine),
        nodes=nodes or cfg.nnodes,
        nproc_per_node=cfg.nproc_per_node if nproc_per_node is None else nproc_per_node,
        profile=profile or cfg.profile,
        overrides=envvars.parse_assignments(overrides),
        backend=cfg.backend,
        nccl_debug=cfg.nccl_debug,
        max_restarts=cfg.max_restarts if max_restarts is None else max_restarts,
        rdzv_endpoint=rdzv_endpoint or ("HOST:29500" if (nodes or cfg.nnodes) > 1 else None),
        profiles_file=cfg.profiles_file,
        nic_transport=nic_transport or cfg.nic_transport,
    )
    emit(plan, as_json, _render_plan)


@app.command("launch")
@handle_errors
def launch_command(
    topology: str = TOPOLOGY_OPTION,
    detect: bool = DETECT_OPTION,
    nproc_per_node: int = NPROC_OPTION,
    nnodes: int = typer.Option(None, "--nnodes", min=1, help="nodes in the job"),
    rdzv_endpoint: str = RDZV_OPTION,
    backend: str = typer.Option(None, "--backend", help="nccl | gloo (default: nccl with GPUs)"),
    steps: int = typer.Option(None, "--steps", min=1, help="optimizer steps"),
    checkpoint_store: str = typer.Option(None, "--checkpoint-store", help="checkpoint store URI"),
    run: str = typer.Option(None, "--run", help="run name in the store (resume continues it)"),
    checkpoint_every: int = typer.Option(None, "--checkpoint-every", min=0, help="save every K steps (0 = only at the end)"),
    data: str = typer.Option(None, "--data", help="preprocessed shards (default: synthetic tokens)"),
    max_restarts: int = RESTARTS_OPTION,
    profile: str = PROFILE_OPTION,
    nic_transport: str = NIC_TRANSPORT_OPTION,
    overrides: list[str] = SET_OPTION,
    log_dir: str = typer.Option(None, "--log-dir", help="launch.log and metrics.jsonl go here"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run the reference trainer under torchrun with the planned environment; stream its logs."""
    from seedance_tasks.training import envvars

    _not_blank(rdzv_endpoint=rdzv_endpoint, backend=backend, checkpoint_store=checkpoint_store, run=run, data=data,
               profile=profile, nic_transport=nic_transport, log_dir=log_dir)
    from seedance_tasks.training.launch import launch

    printer = err_console if as_json else console
    result = launch(
        topology=_topology(topology, detect, 0),
        nproc_per_node=nproc_per_node, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, backend=backend,
        steps=steps, checkpoint_store=checkpoint_store, run=run, checkpoint_every=checkpoint_every, data=data,
        max_restarts=max_restarts, profile=profile, nic_transport=nic_transport,
        overrides=envvars.parse_assignments(overrides),
        log_dir=log_dir, on_line=lambda line: printer.print(line, markup=False, highlight=False),
    )
    result = {key: value for key, value in result.items() if key != "trajectory"}

    def render(res: dict) -> None:
        colour = "green" if res["ok"] else "red"
        console.print(
            f"[{colour}]{'finished' if res['ok'] else 'FAILED'}[/] exit {res['exit_code']}, "
            f"{res['steps_completed']} steps, loss {res['first_loss']} -> {res['final_loss']}, "
            f"{res['restarts']} restart(s), checkpoints {res['checkpoints']} in {escape(str(res['checkpoint_store']))} "
            f"run {escape(str(res['run']))}"
        )
        if res["error"]:
            console.print(f"[red]error:[/] {escape(res['error'])}", highlight=False)
        console.print(f"log: {res['log']}\nmetrics: {res['metrics']}", markup=False)

    emit(result, as_json, render)
    if not result["ok"]:
        # 75 (EX_TEMPFAIL): interrupted (SIGTERM, spot notice) after saving; run it again to resume
        raise typer.Exit(75 if result.get("retryable") else 1)


@app.command("health")
@handle_errors
def health_command(
    log: str = typer.Argument(..., help="NCCL_DEBUG=INFO log, PyTorch watchdog log or nccl-tests output"),
    profile: str = typer.Option(None, "--profile", help="compare bandwidth with this profile's expectation"),
    link: str = typer.Option(None, "--link", help="GPU link type for the expectation, e.g. NV18 (with --profile)"),
    expected_busbw: float = typer.Option(None, "--expected-busbw", min=0.001, help="expected bus bandwidth, GB/s"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Timeouts, channels, transports, algorithms, bandwidth, and a verdict with cause and fix."""
    from pathlib import Path

    from seedance_tasks.training import health
    from seedance_tasks.training.plan import load_profiles

    path = Path(log)
    if not path.is_file():
        what = "is a directory, not a log file" if path.is_dir() else "not found"
        raise UsageError(f"log {log}: {what}", hint="pass one job's log file (NCCL_DEBUG=INFO output or nccl-tests)")
    if expected_busbw is not None and not math.isfinite(expected_busbw):
        raise UsageError(f"--expected-busbw {expected_busbw}: not a bandwidth",
                         hint="give the expected bus bandwidth in GB/s, e.g. --expected-busbw 360")
    if link and not profile:
        raise UsageError("--link picks one of a profile's expected bandwidths: it needs --profile NAME",
                         hint="add --profile NAME, or give the figure itself with --expected-busbw GBPS")
    no_expectation = None
    if expected_busbw is None and profile:
        profiles = load_profiles()
        if profile not in profiles:
            raise UsageError(f"unknown NCCL profile {profile!r}", hint=f"choose one of: {', '.join(profiles)}")
        expected_busbw = health.expected_busbw_of(profiles[profile], link)
        if expected_busbw is None:
            no_expectation = f"profile {profile!r} has no expected bus bandwidth figures (expected_busbw_gbps)"
    result = health.report(path.read_text(errors="replace"), expected_busbw=expected_busbw,
                           no_expectation=no_expectation)
    result["log"] = str(path)

    def render(res: dict) -> None:
        if res["timeouts"]:
            console.print(table("watchdog timeouts", ["rank", "op", "seq", "timeout ms", "ran ms"],
                                [["?" if t["rank"] is None else t["rank"], t["op"], "?" if t["seq"] is None else t["seq"],
                                 t["timeout_ms"], t["ran_ms"]] for t in res["timeouts"]]))
        if res["channels"]:
            console.print(table("channels", ["kind", "count"], sorted(res["channels"].items())))
        if res["transports"]:
            console.print(table("transports", ["via", "connections"], sorted(res["transports"].items())))
        if res["algorithms"]:
            console.print(f"algorithms logged: {', '.join(res['algorithms'])}", markup=False)
        if res["bandwidth"]:
            bw = res["bandwidth"]
            console.print(table("all_reduce_perf", ["size (B)", "algbw GB/s", "busbw GB/s"],
                                [[r["size"], r["algbw"], r["busbw"]] for r in bw["rows"]]))
        verdict = res["verdict"]
        colour = {"ok": "green", "warning": "yellow", "failed": "red"}.get(verdict["status"], "white")
        for finding in verdict["findings"]:
            console.print(f"[{colour}]{finding['status']}[/]: {escape(finding['cause'])}\n  [dim]fix:[/] {escape(finding['fix'])}",
                          highlight=False)

    emit(result, as_json, render)


@app.command("schedule")
@handle_errors
def schedule_command(
    steps: int = typer.Option(None, "--steps", min=1, help="run length (default: training.steps)"),
    world_size: int = typer.Option(2, "--world-size", min=1, help="ranks in the job"),
    as_json: bool = JSON_OPTION,
) -> None:
    """The batch-size schedule over the run, one row per stretch of steps that do the same thing:
    target batch, accumulation, realised batch, LR (a run of any length prints in an instant)."""
    from seedance_tasks.config import load_settings
    from seedance_tasks.training import schedule

    cfg = load_settings().training
    run = schedule.RunSchedule.from_settings(cfg.schedule, steps or cfg.steps)
    rows = schedule.segments(run, world_size)
    warnings = [text for text in (schedule.oversize_warning(run, world_size, rows), schedule.overlap_warning(run))
                if text]

    def span(first: int, last: int) -> str:
        return f"{first:,}" if first == last else f"{first:,}-{last:,}"

    def render(res: dict) -> None:
        console.print(table(f"batch schedule, world size {world_size}", ["steps", "target", "accum", "global batch", "lr"],
                            [[span(r["first_step"], r["last_step"]), span(r["min_target_batch"], r["max_target_batch"]),
                              r["accumulation"], r["global_batch"], f"{r['lr']:.4g}"] for r in res["segments"]]))
        for text in res["warnings"]:
            console.print(f"[yellow]warning:[/] {escape(text)}")

    emit({"schedule": run.to_dict(), "world_size": world_size, "segments": rows, "warnings": warnings}, as_json, render)
