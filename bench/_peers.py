"""Fair side-by-side measurement for the benches: every peer runs in its own fresh process, its
memory is its own high-water mark, and rounds alternate the order so no peer always runs first.

Why a fresh process and VmHWM: a child forked from a parent that generated the data starts with
the parent's resident set, and Linux carries the old high-water mark across `exec` into
`ru_maxrss`; `VmHWM` in `/proc/self/status` belongs to the new address space only.

A peer child calls `report(seconds=..., **extra)` as its last act; the parent calls `measure()`
for one run or `rounds()` for several in turns, and `spread()` to print the median and range.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPORT_PREFIX = "BENCH-RESULT "


def vm_hwm_mb() -> float:
    """This process's peak resident set since its last `exec`, in MB (10^6 bytes)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError("no VmHWM in /proc/self/status")


def report(seconds: float, **extra) -> None:
    """Print a peer's result for the parent: its timed seconds, its own peak RSS and any extras."""
    extra.setdefault("peak_rss_mb", vm_hwm_mb())
    print(REPORT_PREFIX + json.dumps({"seconds": seconds, **extra}), flush=True)


def run_tree(command: Sequence[str], *, poll_s: float = 0.02, **popen) -> tuple[float, float]:
    """Run an external command; its wall seconds and the peak summed RSS of its process tree in MB.

    For peers that are programs (cp, the `seedance` CLI): sampled every `poll_s` with psutil.
    """
    import psutil

    started = time.perf_counter()
    child = subprocess.Popen(list(command), **popen)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        root = psutil.Process(child.pid)
        while not done.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in procs if p.is_running()))
            except psutil.Error:
                pass
            done.wait(poll_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    returncode = child.wait()
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    if returncode:
        raise subprocess.CalledProcessError(returncode, list(command))
    return seconds, peak / 1e6


def measure(argv: Sequence[str], *, cwd: str | Path | None = None, env: dict | None = None,
            timeout: float | None = None) -> dict:
    """Run one peer child (`python <argv>`) and return the dict it `report()`ed; raises on failure."""
    proc = subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(REPORT_PREFIX)]
    if proc.returncode or not lines:
        raise RuntimeError(f"peer {' '.join(map(str, argv))} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(REPORT_PREFIX):])


def rounds(names: Sequence[str], run_one: Callable[[str], dict], count: int = 3,
           on_result: Callable[[str, int, dict], None] | None = None) -> dict[str, list[dict]]:
    """`count` rounds of every peer in turns; each round starts one peer later (ABC, BCA, CAB...)."""
    results: dict[str, list[dict]] = {name: [] for name in names}
    for index in range(count):
        shift = index % len(names)
        for name in [*names[shift:], *names[:shift]]:
            result = run_one(name)
            results[name].append(result)
            if on_result:
                on_result(name, index, result)
    return results


def median(results: Sequence[dict], key: str = "seconds") -> float:
    """The median of one figure over a peer's rounds."""
    return statistics.median(r[key] for r in results)


def spread(results: Sequence[dict], key: str = "seconds", fmt: str = "{:.2f}") -> str:
    """`median (min–max)` of one figure over a peer's rounds, for the printed table."""
    values = [r[key] for r in results]
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def ratio_spread(ours: Sequence[dict], theirs: Sequence[dict], key: str = "seconds") -> str:
    """Per-round ratio theirs/ours of a time (>1: we are faster): `median× (min–max)`, rounds paired."""
    ratios = [t[key] / o[key] for o, t in zip(ours, theirs, strict=False) if o[key] > 0]
    if not ratios:
        return "-"
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}×"
    return f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})"
