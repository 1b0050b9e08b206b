"""Retention policy: which checkpoints of a run GC keeps, and why.

Pure functions over manifests (no I/O), so the decision is easy to test and to explain: every
kept step carries its reasons (`last`, `every`, `best`, `tagged`, `young`, `base of N`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from seedance_tasks.errors import UsageError
from seedance_tasks.lifecycle import inventory
from seedance_tasks.lifecycle.settings import LifecycleSettings, RetentionPolicy


def policy_with(settings: LifecycleSettings, run: str, **overrides: Any) -> RetentionPolicy:
    """The policy of `run` (config + per-run overrides) with per-call `overrides` (None ignored).

    Raises UsageError naming the bad option (keep_last 0, keep_best without a metric, ...).
    """
    from pydantic import ValidationError

    values = {key: value for key, value in overrides.items() if value is not None}
    base = settings.policy_for(run).model_dump()
    try:
        return RetentionPolicy.model_validate({**base, **values})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'policy'}: {e['msg'].removeprefix('Value error, ')} (got {e.get('input')!r})"
            for e in exc.errors()
        )
        raise UsageError(
            f"bad retention policy for run {run!r}: {problems}",
            hint="keep_last >= 1, keep_every >= 1, keep_best >= 0 with a --metric; see lifecycle.retention in config",
        ) from None


def select(manifests: list[dict], policy: RetentionPolicy, now: datetime | None = None) -> dict[int, list[str]]:
    """{step: reasons} of the steps `policy` keeps among `manifests` (one run), bases included.

    A step kept only because a kept delta needs it has the reason `base of <step>`; the chains of
    those bases are kept too. Steps not in the result are garbage. Checkpoints without a finite
    numeric metric (`metric_value`) are never among the best; equal values rank the later step first.
    """
    now = now or datetime.now(UTC)
    by_step = {int(m["step"]): m for m in manifests}
    steps = sorted(by_step)
    keep: dict[int, list[str]] = {}

    def add(step: int, reason: str) -> None:
        keep.setdefault(step, []).append(reason)

    for step in steps[-policy.keep_last:]:
        add(step, "last")
    if policy.keep_every:
        for step in steps:
            if step % policy.keep_every == 0:
                add(step, "every")
    if policy.keep_best and policy.metric:
        scored = [(score, s) for s in steps
                  if (score := metric_value(by_step[s], policy.metric)) is not None]
        scored.sort(key=lambda item: (item[0] if policy.metric_mode == "min" else -item[0], -item[1]))
        for _value, step in scored[: policy.keep_best]:
            add(step, "best")
    for step in steps:
        manifest = by_step[step]
        if policy.keep_tagged and manifest.get("tags"):
            add(step, "tagged")
        if policy.min_age and inventory.age_s(manifest, None, now) < policy.min_age:
            add(step, "young")
    return with_bases(manifests, keep)


def with_bases(manifests: list[dict], keep: dict[int, list[str]]) -> dict[int, list[str]]:
    """`keep` ({step: reasons}, not changed) plus every step in the chain of a kept step and in the
    chains of those (an unsealed manifest's chain may stop short of its base's, and a restore
    follows every base link), each with the reason `base of <step>` once; by step. A step not
    among `manifests` (not committed) adds no bases (`missing_bases` reports it)."""
    by_step = {int(m["step"]): m for m in manifests}
    return bases_closure(by_step.get, keep)


def bases_closure(read: Callable[[int], dict | None], keep: dict[int, list[str]]) -> dict[int, list[str]]:
    """`with_bases` over manifests read on demand: `read(step)` is the manifest of `step` (None:
    not committed; an exception it raises propagates), called once per step the result holds, so
    a caller that needs only a few chains (thaw) reads only their manifests."""
    keep = {step: list(reasons) for step, reasons in keep.items()}
    pending = sorted(keep)
    heapq.heapify(pending)
    while pending:  # a step enters `pending` once: when it enters `keep`
        step = heapq.heappop(pending)
        manifest = read(step)
        for base in (manifest.get("chain") or []) if manifest else []:
            base = int(base)
            if base not in keep:
                heapq.heappush(pending, base)
            if not any(r.startswith("base of") for r in keep.get(base, [])):
                keep.setdefault(base, []).append(f"base of {step}")
    return {step: keep[step] for step in sorted(keep)}


def metric_value(manifest: dict, metric: str) -> float | None:
    """`metric` of the checkpoint as a number to rank by, or None where it cannot rank: missing,
    not a number (a bool, a string), NaN, infinite or too large for a float."""
    value = (manifest.get("metrics") or {}).get(metric)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def missing_bases(manifests: list[dict], kept: dict[int, list[str]]) -> dict[int, list[int]]:
    """{kept step: [chain steps not committed]}: kept checkpoints that are already unrestorable."""
    by_step = {int(m["step"]): m for m in manifests}
    found = {}
    for step in kept:
        if step not in by_step:
            continue
        lost = [int(b) for b in by_step[step].get("chain") or [] if int(b) not in by_step]
        if lost:
            found[step] = lost
    return found
