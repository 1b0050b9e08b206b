"""Named fault points: where tests kill the process or raise a transient storage error.

Every step that publishes, retires or writes metadata calls `point(name)`. Disarmed (the normal
case) a call costs one global check. Armed from the environment, so subprocesses inherit it:

- `SEEDANCE_FAULT_AT=N`: fire at the N-th point reached in this process (1-based, all threads);
- `SEEDANCE_FAULT_MODE=kill` (SIGKILL itself, the default) or `raise` (`InjectedFault`, an OSError);
- `SEEDANCE_FAULT_MATCH=prefix`: count only points whose name starts with `prefix`;
- `SEEDANCE_FAULT_TRACE=/path`: append the name of every point reached, one per line.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


class InjectedFault(OSError):
    """A transient storage error injected by a test (Airflow's retry is expected to fix it)."""


@dataclass
class _Plan:
    at: int | None = None
    mode: str = "kill"
    match: str | None = None
    trace_path: str | None = None
    trace: list[str] | None = None
    count: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _from_environment() -> _Plan | None:
    at, trace = os.environ.get("SEEDANCE_FAULT_AT"), os.environ.get("SEEDANCE_FAULT_TRACE")
    if not at and not trace:
        return None
    return _Plan(
        at=int(at) if at else None,
        mode=os.environ.get("SEEDANCE_FAULT_MODE", "kill"),
        match=os.environ.get("SEEDANCE_FAULT_MATCH") or None,
        trace_path=trace or None,
    )


_plan: _Plan | None = _from_environment()


def point(name: str) -> None:
    """Mark a place where a crash may happen; fires the armed fault when its turn comes."""
    plan = _plan
    if plan is None:
        return
    if plan.match and not name.startswith(plan.match):
        return
    with plan.lock:
        plan.count += 1
        count = plan.count
        if plan.trace is not None:
            plan.trace.append(name)
        if plan.trace_path:
            with open(plan.trace_path, "a", encoding="utf-8") as handle:
                handle.write(name + "\n")
    if plan.at is not None and count == plan.at:
        if plan.mode == "raise":
            raise InjectedFault(f"injected transient fault at {name} (point {count})")
        os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def armed(*, at: int, mode: str = "raise", match: str | None = None) -> Iterator[None]:
    """Arm a fault in this process for the block (tests); `mode` "raise" or "kill"."""
    global _plan
    previous, _plan = _plan, _Plan(at=at, mode=mode, match=match)
    try:
        yield
    finally:
        _plan = previous


@contextmanager
def tracing(match: str | None = None) -> Iterator[list[str]]:
    """Collect the names of the points reached in the block (tests)."""
    global _plan
    names: list[str] = []
    previous, _plan = _plan, _Plan(match=match, trace=names)
    try:
        yield names
    finally:
        _plan = previous
