"""Run torchrun with a plan's environment and the reference trainer; stream logs; report the outcome.

The job runs in its own process group, so a failure, a timeout or an interrupt of the caller
takes every worker down with it (TERM, then KILL). The result says how it ended: exit status,
the failing rank and its error (from torchrun's failure summary), restarts, the loss trajectory
(metrics written by rank 0), the checkpoints saved, whether the job stopped on SIGTERM or a spot
notice (`interrupted`, `retryable`), the checkpoint interval and the telemetry summary (cost so
far, $ per 1,000 steps, energy, utilisation).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seedance_tasks.training.plan import RANKS_ENV

JOB_TOKEN_ENV = "SEEDANCE_TRAIN_JOB"
_EXIT_GRACE_S = 3.0
_REPO = Path(__file__).resolve().parents[2]
_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank: (\d+)\)")
_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_HOST_RE = re.compile(r"^\s*host\s*:\s*(\S+)")
_TRACE_RE = re.compile(r"^\s*(?:traceback|error_file)\s*:\s*(.*)$")
_PEER_LOST_RE = re.compile(
    r"Connection (reset|closed) by peer|remote worker|NCCL communicator was aborted|Broken pipe", re.IGNORECASE
)
_RESTART_RE = re.compile(r"will restart worker group|Restarting worker group|restart_count=\d+")
# what launch writes into the job's log when it kills a job that printed nothing for hang_timeout
HUNG_MESSAGE = "[seedance] no output for {seconds:g} s: killing the job as hung"
HUNG_RE = re.compile(r"\[seedance\] no output for (?P<seconds>[\d.e+]+) s: killing the job as hung")


def signal_of(exit_code: int | None) -> str | None:
    """The signal an exit code says killed the process: -N (Python's returncode, torchrun's
    exitcode) or 128+N (as a shell or a container runtime reports it: 137 is SIGKILL, the OOM
    killer's); None for any other code."""
    if exit_code is None or exit_code == 0:
        return None
    number = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 else None
    try:
        return signal.Signals(number).name if number else None
    except ValueError:
        return None


def describe_exit(exit_code: int | None) -> str:
    """`SIGKILL` for -9, `exit code 137 (SIGKILL)` for 137, `exit code 1` for 1."""
    name = signal_of(exit_code)
    if name and exit_code is not None and exit_code < 0:
        return name
    return f"exit code {exit_code}" + (f" ({name})" if name else "")


def parse_failures(lines: list[str]) -> list[dict[str, Any]]:
    """The failed ranks of torchrun's ChildFailedError summary ("Root Cause" first)."""
    failures: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    in_root = False
    host = None  # torchrun prints a failure's host before its rank
    for line in lines:
        if "Root Cause" in line:
            in_root = True
        if match := _HOST_RE.match(line):
            host = match.group(1)
            continue
        if match := _RANK_RE.match(line):
            current = {"rank": int(match.group(1)), "local_rank": int(match.group(2)), "error": [],
                       "root_cause": in_root, "host": host}
            failures.append(current)
            continue
        if current is None:
            continue
        if match := _EXIT_RE.match(line):
            current["exitcode"] = int(match.group(1))
            if name := signal_of(current["exitcode"]):
                current["signal"] = name
        elif match := _TRACE_RE.match(line):
            if match.group(1).strip() not in ("", "<N/A>"):
                current["error"].append(match.group(1).strip())
        elif line.startswith("=") or line.startswith("---"):
            current = None
        elif current["error"] and line.strip():
            current["error"].append(line.rstrip())
    for failure in failures:
        text = [item for item in failure.pop("error") if item]
        failure["error"] = "\n".join(text[-12:]) if text else None
    unique: dict[tuple[int, int], dict[str, Any]] = {}
    for failure in sorted(failures, key=lambda item: not item["root_cause"]):
        unique.setdefault((failure["rank"], failure.get("exitcode", 0)), failure)
    found = list(unique.values())
    for failure in found:  # a rank that only lost its peer is a consequence, not the cause
        failure["secondary"] = bool(failure["error"] and _PEER_LOST_RE.search(failure["error"]))
    primary = [item for item in found if not item["secondary"] and item.get("signal") != "SIGTERM"]
    if primary and found[0] not in primary:
        for item in found:
            item["root_cause"] = item is primary[0]
        found.sort(key=lambda item: not item["root_cause"])
    return found


def metrics_records(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """The records of a metrics file (one JSON object a line) and how many lines were damaged.

    A line cut short by a crash (kill -9, a full disk, a lost node) or otherwise not a JSON object
    is counted and skipped, never fatal: the records before and after it are all returned. A
    missing file has no records."""
    path = Path(path)
    if not path.is_file():
        return [], 0
    records, damaged = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            item = None
        if isinstance(item, dict):
            records.append(item)
        else:
            damaged += 1
    return records, damaged


def _int_field(item: dict[str, Any], key: str) -> int | None:
    value = item.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_metrics(path: str | Path) -> dict[str, Any]:
    """rank 0's metrics file -> the loss trajectory (last record of each step wins: a resumed run
    recomputes the steps after its checkpoint), the checkpoints and the attempts.

    Damaged lines, and records without the integer step (or attempt) they need, are skipped and
    counted in `damaged_lines`."""
    records, damaged = metrics_records(path)
    steps: dict[int, dict[str, Any]] = {}
    checkpoints, starts, interruptions = [], [], []
    interval, ended = None, None
    for item in records:
        step = _int_field(item, "step")
        if "event" not in item:
            if step is None or not isinstance(item.get("loss"), (int, float)):
                damaged += 1
                continue
            steps[step] = item
        elif item["event"] == "checkpoint":
            if step is None:
                damaged += 1
                continue
            checkpoints.append(step)
        elif item["event"] == "start":
            if _int_field(item, "attempt") is None:
                damaged += 1
                continue
            starts.append({key: item.get(key) for key in ("attempt", "world", "resumed_from")})
            ended = None
        elif item["event"] == "interrupted":
            interruptions.append({key: item.get(key) for key in ("step", "reason", "saved", "notice")})
            ended = interruptions[-1]
        elif item["event"] == "checkpoint_interval":
            interval = {key: value for key, value in item.items() if key != "event"}
        elif item["event"] == "finish":
            ended = "finished"
    ordered = [steps[key] for key in sorted(steps)]
    return {
        "losses": [item["loss"] for item in ordered],
        "trajectory": ordered,
        "checkpoints": sorted(set(checkpoints)),
        "starts": starts,
        "interruptions": interruptions,
        "interrupted": ended if isinstance(ended, dict) else None,  # the last attempt stopped on a signal/notice
        "checkpoint_interval": interval,
        "skipped_steps": sum(1 for item in ordered if item.get("skipped")),
        "damaged_lines": damaged,
    }


_ATTEMPT_FILE_RE = re.compile(r"^(?:samples|totals)-r\d+-a(\d+)[-.]")


def next_attempt(metrics: str | Path, telemetry_dir: str | Path | None) -> int:
    """The first attempt number no earlier launch of this run folder used: one past the highest
    attempt its metrics' `start` events or its telemetry file names show (0 for a new folder).

    Both are read because either can be missing: a job killed before its first telemetry flush
    wrote a `start` event only, and a metrics file can be torn by a crash."""
    used = [item["attempt"] for item in metrics_records(metrics)[0]
            if item.get("event") == "start" and _int_field(item, "attempt") is not None]
    folder = Path(telemetry_dir) if telemetry_dir else None
    if folder is not None and folder.is_dir():
        used += [int(match.group(1)) for entry in folder.iterdir() if (match := _ATTEMPT_FILE_RE.match(entry.name))]
    return max((value for value in used if value >= 0), default=-1) + 1


def run_torchrun(
    plan: dict[str, Any],
    job: dict[str, Any],
    log_dir: str | Path,
    *,
    on_line: Callable[[str], None] | None = None,
    hang_timeout: float = 0,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the plan's torchrun command for `job` (steps, schedule, model, checkpoints...), with the
    plan's environment; stream every output line to `log_dir/launch.log` and `on_line`.

    Returns {ok, exit_code, failures, restarts, hung, steps_completed, final_loss, losses,
    checkpoints, log, metrics}. Kills the whole process group on exit, error or hang.
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    job = dict(job)
    job.setdefault("metrics", str(log_dir / "metrics.jsonl"))
    job.setdefault("telemetry_dir", str(log_dir / "telemetry"))
    # a relaunch (an Airflow retry, the CLI again) numbers its attempts after every earlier one:
    # torchrun's restart count starts at 0 each time, and telemetry is keyed and named by attempt
    job.setdefault("attempt_base", next_attempt(job["metrics"], job["telemetry_dir"]))
    job_path = log_dir / "job.json"
    job_path.write_text(json.dumps(job, indent=2))
    command = [sys.executable, "-m", "torch.distributed.run", *plan["command"][1:], "--job", str(job_path)]
    env = dict(os.environ)
    env.update(plan["env"])
    env[RANKS_ENV] = json.dumps(plan["ranks"])
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH")]))
    env.update(extra_env or {})
    job_token = uuid.uuid4().hex
    env[JOB_TOKEN_ENV] = job_token  # marks every process of this job, even ones torchrun loses track of
    log_path = log_dir / "launch.log"
    lines: list[str] = []
    restarts = 0
    hung = False
    started = time.monotonic()
    with log_path.open("a") as log:
        log.write(f"$ {shlex.join(command)}\n")
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=True, bufsize=1,
        )
        lines_queue: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                lines_queue.put(line)
            lines_queue.put(None)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        last_output = time.monotonic()
        try:
            while True:
                try:
                    line = lines_queue.get(timeout=1.0)
                except queue.Empty:
                    if process.poll() is not None and time.monotonic() - last_output > _EXIT_GRACE_S:
                        break  # torchrun is gone; whatever still holds the pipe is an orphan
                    if hang_timeout and time.monotonic() - last_output > hang_timeout:
                        hung = True
                        message = HUNG_MESSAGE.format(seconds=hang_timeout)
                        log.write(message + "\n")
                        if on_line:
                            on_line(message)
                        break
                    continue
                if line is None:
                    break
                last_output = time.monotonic()
                line = line.rstrip("\n")
                lines.append(line)
                log.write(line + "\n")
                log.flush()
                if _RESTART_RE.search(line):
                    restarts += 1
                if on_line:
                    on_line(line)
        finally:
            _stop(process)
            _kill_marked(job_token)
            reader.join(timeout=5)
    exit_code = process.returncode if not hung else 124
    metrics = read_metrics(job["metrics"])
    failures = parse_failures(lines) if exit_code != 0 else []
    losses = metrics["losses"]
    error = None
    if hung:
        error = f"no output for {hang_timeout:g} s: the job was killed as hung"
    elif failures:
        first = failures[0]
        reason = describe_exit(first.get("exitcode"))
        detail = (first.get("error") or "").strip().splitlines()
        error = f"rank {first['rank']} (local rank {first['local_rank']}) failed: {reason}" + (
            f": {detail[-1].strip()}" if detail else "")
    elif exit_code != 0:
        killer = signal_of(exit_code)
        why = ": the OOM killer, the scheduler or an operator; a retry resumes from the last checkpoint"
        error = f"torchrun exited with {exit_code}" + (
            f" (killed by {killer}{why if killer == 'SIGKILL' else ''})" if killer else "")
    interrupted = metrics["interrupted"] if exit_code != 0 and not hung else None
    if interrupted:
        error = (f"interrupted ({interrupted['reason']}) after step {interrupted['step']}"
                 + (": checkpoint saved, a retry resumes from it" if interrupted["saved"] else ": nothing saved"))
    return {
        "ok": exit_code == 0 and not hung,
        "exit_code": exit_code,
        "hung": hung,
        "failures": failures,
        "error": error,
        "restarts": max(restarts, max(0, len(metrics["starts"]) - 1)),
        "steps_completed": len(losses),
        "final_loss": losses[-1] if losses else None,
        "first_loss": losses[0] if losses else None,
        "losses": losses,
        "checkpoints": metrics["checkpoints"],
        "starts": metrics["starts"],
        "interrupted": interrupted,
        "interruptions": metrics["interruptions"],
        "retryable": bool(interrupted),  # the job asked to be run again: torchrun and Airflow retry it
        "checkpoint_interval": metrics["checkpoint_interval"],
        "skipped_steps": metrics["skipped_steps"],
        "damaged_metrics_lines": metrics["damaged_lines"],  # torn by a crash, skipped
        "telemetry": _telemetry_summary(job.get("telemetry_dir")),
        "seconds": round(time.monotonic() - started, 1),
        "log": str(log_path),
        "metrics": job["metrics"],
        "command": command,
        "pgid": process.pid,
        "job_token": job_token,
    }


def _telemetry_summary(folder: str | None) -> dict[str, Any] | None:
    """Cost so far, $ per 1,000 steps, energy and utilisation from the run's telemetry samples."""
    if not folder or not Path(folder).is_dir():
        return None
    from seedance_tasks.telemetry.samples import summarise

    summary = summarise(folder, skip_damaged=True)  # after the job: a file a crash left unreadable is named, not fatal
    summary["cost_usd"] = str(summary["cost_usd"])
    if summary["usd_per_1000_steps"] is not None:
        summary["usd_per_1000_steps"] = str(summary["usd_per_1000_steps"])
    summary["folder"] = folder
    return summary


def _marked_pids(token: str) -> list[int]:
    """Processes of this user whose environment carries this job's token (Linux /proc)."""
    needle = f"{JOB_TOKEN_ENV}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or another user's
            continue
    return found


def _kill_marked(token: str) -> list[int]:
    """SIGKILL every process left over from this job: torchrun runs workers in their own process
    groups, and their children (data-loading pools) can outlive a killed worker."""
    killed = []
    for pid in _marked_pids(token):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return killed


def _stop(process: subprocess.Popen, grace_s: float = 10) -> None:
    """End the job's whole process group: TERM, then KILL whatever is left."""
    pgid = process.pid  # start_new_session: the job leads its own process group
    if process.poll() is None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:  # workers orphaned by a dead agent are still in the group
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process.poll() is None:
        process.wait(grace_s)


MAX_RUN_BYTES = 200
"""A run names a folder (of logs, of checkpoints): file systems take 255 bytes a name at most."""


def check_run(run: str) -> str:
    """`run` if it can name the run's folders: one path component (`catalog.check_run_name`) of at
    most MAX_RUN_BYTES bytes in UTF-8; else UsageError (not an OSError that a retry would repeat)."""
    from seedance_tasks.checkpoint.catalog import check_run_name
    from seedance_tasks.errors import UsageError

    check_run_name(run)
    if len(run.encode("utf-8", "surrogatepass")) > MAX_RUN_BYTES:
        raise UsageError(f"run name {run[:40]!r}… is {len(run.encode('utf-8', 'surrogatepass')):,} bytes long",
                         hint=f"name the run in at most {MAX_RUN_BYTES} bytes: it names its log and checkpoint folders")
    return run


def absolute_store(uri: str | None) -> str | None:
    """A checkpoint store given by an untrusted face (the DAG form), as given if it is an absolute
    local path, a `file:///` URI or a `scheme://bucket/prefix` one, none with a `..` component;
    else UsageError. A relative path would resolve against whatever folder the worker runs in,
    another on a retry's worker, where the run's checkpoints are not: it would start over silently.
    Empty or None: None (the settings' store)."""
    from seedance_tasks.errors import UsageError

    if not uri:
        return None
    scheme, sep, rest = uri.partition("://")
    path = rest if sep else uri
    local = not sep or scheme == "file"
    if ".." in re.split(r"[/\\]", path) or (local and not path.startswith("/")) or (sep and not rest.strip("/")):
        raise UsageError(f"checkpoint store {uri[:200]!r} is not an absolute location",
                         hint="give an absolute path, file:///path or s3://bucket/prefix, without `..`; "
                              "empty for training.checkpoint_store")
    return uri


def launch(
    *,
    topology=None,
    nproc_per_node: int | None = None,
    nnodes: int | None = None,
    rdzv_endpoint: str | None = None,
    backend: str | None = None,
    steps: int | None = None,
    checkpoint_store: str | None = None,
    run: str | None = None,
    checkpoint_every: int | str | None = None,
    data: str | None = None,
    precision: str | None = None,
    max_restarts: int | None = None,
    profile: str | None = None,
    nic_transport: str | None = None,
    overrides: dict[str, object] | None = None,
    log_dir: str | Path | None = None,
    schedule: dict[str, Any] | None = None,
    on_line: Callable[[str], None] | None = None,
    extra_env: dict[str, str] | None = None,
    settings=None,
) -> dict[str, Any]:
    """Plan (from `topology`, or a CPU/gloo plan without one) and run the reference trainer.

    Arguments left None come from the `training:` settings. Returns the plan's summary (profile,
    env, command) and the run's outcome (see `run_torchrun`), with `run` and `checkpoint_store`.
    """
    import tempfile

    from seedance_tasks import storage
    from seedance_tasks.config import load_settings
    from seedance_tasks.errors import UsageError
    from seedance_tasks.training import schedule as batch_schedule
    from seedance_tasks.training.plan import make_plan

    settings = settings or load_settings()
    cfg = settings.training
    max_restarts = cfg.max_restarts if max_restarts is None else max_restarts
    steps = steps or cfg.steps
    checkpoint_store = checkpoint_store or cfg.checkpoint_store or settings.checkpoint.store
    if run and not checkpoint_store:
        raise UsageError("--run needs a checkpoint store", hint="pass --checkpoint-store or set checkpoint.store")
    if run:
        check_run(run)  # refused here, not by every rank after torchrun starts
    if checkpoint_store and not run:
        run = f"train-{storage.new_run_id()}"
    if data:
        from seedance_tasks.shards.index import resolve_shards

        resolve_shards(data)  # a missing or unreadable shard set fails here, not in every rank
    plan = make_plan(
        topology,
        nodes=nnodes or cfg.nnodes,
        nproc_per_node=nproc_per_node if nproc_per_node is not None else cfg.nproc_per_node,
        profile=profile or cfg.profile,
        overrides=overrides,
        backend=backend or cfg.backend,
        nccl_debug=cfg.nccl_debug,
        max_restarts=max_restarts,
        rdzv_endpoint=rdzv_endpoint,
        profiles_file=cfg.profiles_file,
        nic_transport=nic_transport or cfg.nic_transport,
    )
    if precision not in (None, "fp32", "bf16", "fp16"):
        raise UsageError(f"unknown precision {precision!r}", hint="use fp32, bf16 or fp16")
    every = cfg.checkpoint_every if checkpoint_every is None else checkpoint_every
    if not (every == "auto" or (isinstance(every, int) and every >= 0)):
        raise UsageError(f"checkpoint_every must be a step count >= 0 or auto, not {every!r}",
                         hint="e.g. 50, 0 (only at the end) or auto (Young-Daly)")
    sched = batch_schedule.RunSchedule.from_settings(cfg.schedule, steps, **(schedule or {}))
    batch_schedule.check_accumulation(sched, plan["nodes"] * plan["nproc_per_node"])  # before torchrun starts
    job = {
        "backend": plan["backend"],
        "steps": steps,
        "seed": cfg.seed,
        "model": cfg.model.model_dump(),
        "schedule": sched.to_dict(),
        "collective_timeout": cfg.collective_timeout,
        "checkpoint_store": checkpoint_store,
        "run": run,
        "checkpoint_every": every,
        "mtbf": cfg.mtbf,
        "data": data,
        "precision": precision or cfg.precision,
        "loss_scale_init": cfg.loss_scale_init,
        "spot": {"enabled": cfg.spot.enabled, "endpoint": cfg.spot.endpoint, "poll_interval": cfg.spot.poll_interval},
        "telemetry": settings.telemetry.model_dump(mode="json"),
    }
    log_dir = Path(log_dir or cfg.log_dir or tempfile.mkdtemp(prefix="seedance-train-"))
    if cfg.log_dir and not log_dir.is_absolute():
        log_dir = log_dir.resolve()
    result = run_torchrun(plan, job, log_dir, on_line=on_line, hang_timeout=cfg.hang_timeout, extra_env=extra_env)
    return {
        **result,
        "run": run,
        "checkpoint_store": checkpoint_store,
        "profile": plan["profile"]["name"],
        "backend": plan["backend"],
        "nproc_per_node": plan["nproc_per_node"],
        "nnodes": plan["nodes"],
        "env": plan["env"],
        "expected_busbw_gbps": plan["profile"]["expected_busbw_gbps"],
    }
