"""Kill a task function (or make its storage fail once) at each of its fault points, in a fresh process.

A chaos test finds how many fault points one run of a task passes (`points_hit`), then for each
point runs the task with a kill -9 (or a transient OSError) there (`run_task(fault_at=i)`), runs
it again with the same inputs as Airflow's retry would, and checks that the data is exactly
what it was meant to be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_FAULT_ENV = ("SEEDANCE_FAULT_AT", "SEEDANCE_FAULT_MODE", "SEEDANCE_FAULT_MATCH", "SEEDANCE_FAULT_TRACE")


def _environment(extra: dict | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _FAULT_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def run_task(target: str, kwargs: dict, *, fault_at: int | None = None, mode: str = "kill",
             match: str | None = None, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `module:function(**kwargs)` in a fresh interpreter, optionally with a fault armed.

    Returns the finished process: returncode -9 when the fault killed it, the function's JSON
    result on the last line of stdout when it returned.
    """
    extra = dict(env or {})
    if fault_at is not None:
        extra.update({"SEEDANCE_FAULT_AT": str(fault_at), "SEEDANCE_FAULT_MODE": mode})
        if match:
            extra["SEEDANCE_FAULT_MATCH"] = match
    return subprocess.run(
        [sys.executable, "-m", "tests.chaos.runner", target, json.dumps(kwargs)],
        cwd=REPO, env=_environment(extra), capture_output=True, text=True, timeout=timeout, check=False,
    )


def result_of(process: subprocess.CompletedProcess):
    """The JSON result a successful `run_task` printed; fails with its stderr otherwise."""
    if process.returncode != 0:
        raise AssertionError(f"task failed (rc {process.returncode}):\n{process.stderr[-4000:]}")
    return json.loads(process.stdout.strip().splitlines()[-1])


def call_in_process(target: str, kwargs: dict, *, fault_at: int | None = None, match: str | None = None):
    """Call `module:function(**kwargs)` here, optionally with a transient fault armed (mode "raise").

    A raised fault needs no fresh process, and a retry is a plain second call: much cheaper than
    `run_task` for the raise-mode half of a chaos suite.
    """
    import importlib

    from seedance_tasks import faults

    module_name, _, function_name = target.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    if fault_at is None:
        return function(**kwargs)
    with faults.armed(at=fault_at, mode="raise", match=match):
        return function(**kwargs)


def points_hit(target: str, kwargs: dict, *, match: str | None = None, env: dict | None = None) -> list[str]:
    """The fault points one clean run of the task passes, in order (the run must succeed)."""
    if env is None:
        from seedance_tasks import faults

        with faults.tracing(match=match) as names:
            call_in_process(target, kwargs)
        return names
    with tempfile.NamedTemporaryFile("r", suffix=".trace", delete=False) as trace:
        path = trace.name
    try:
        extra = {**(env or {}), "SEEDANCE_FAULT_TRACE": path}
        if match:
            extra["SEEDANCE_FAULT_MATCH"] = match
        result_of(run_task(target, kwargs, env=extra))
        return Path(path).read_text().split()
    finally:
        os.unlink(path)
