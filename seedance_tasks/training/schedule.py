"""Batch-size schedule: warmup, hold, decay of the effective (global) batch, as pure functions.

The micro-batch (samples per rank per forward pass) never changes, so memory use does not
either; the effective batch is realised through gradient accumulation:
`global_batch = micro_batch * world_size * accumulation`. The learning rate follows the realised
batch (square-root rule for Adam(W), linear for SGD, or as configured), and neither the batch
nor the LR scaling goes past the critical batch size. When the world size changes (a restart on
fewer or more nodes), the target global batch is kept and only the accumulation changes.

A schedule needing more than `MAX_ACCUMULATION` micro-batches per rank per step is refused
(`check_accumulation`): even at a millisecond each, one step would take over a minute, so a batch
that large is a typo (an extra zero or two), never a plan.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from seedance_tasks.errors import ConfigError

MAX_ACCUMULATION = 65536


@dataclass(frozen=True)
class StepPlan:
    """What step `step` does: accumulate `accumulation` micro-batches per rank, at `lr`."""

    step: int
    target_batch: int
    accumulation: int
    global_batch: int
    lr: float

    def to_dict(self) -> dict:
        return asdict(self)


def target_batch(step: int, schedule) -> int:
    """The effective batch the schedule asks for at `step` (before rounding to whole micro-batches).

    Linear ramp `start_batch -> peak_batch` over `warmup_steps`, hold, then a linear ramp
    `peak_batch -> end_batch` over the last `decay_steps` of `total_steps`; capped at
    `critical_batch`.
    """
    total = schedule_total(schedule)
    warmup, decay = schedule.warmup_steps, schedule.decay_steps
    if warmup and step < warmup:
        value = schedule.start_batch + (schedule.peak_batch - schedule.start_batch) * step / warmup
    elif decay and step >= total - decay:
        into = step - (total - decay) + 1
        value = schedule.peak_batch + (schedule.end_batch - schedule.peak_batch) * into / decay
    else:
        value = schedule.peak_batch
    if schedule.critical_batch:
        value = min(value, schedule.critical_batch)
    return max(1, int(round(value)))


def schedule_total(schedule) -> int:
    return int(getattr(schedule, "total_steps", 0) or 0)


def accumulation(batch: int, micro_batch: int, world_size: int) -> int:
    """Micro-batches per rank per step whose global total is nearest `batch` (at least 1)."""
    if micro_batch < 1 or world_size < 1:
        raise ValueError("micro_batch and world_size must be >= 1")
    return max(1, int(round(batch / (micro_batch * world_size))))


def check_accumulation(schedule, world_size: int) -> int:
    """The largest accumulation any step of `schedule` needs on `world_size` ranks; ConfigError
    naming the `training.schedule` key that asks for it, and the accumulation, where it is more than
    MAX_ACCUMULATION."""
    batches = {"start_batch": schedule.start_batch, "peak_batch": schedule.peak_batch,
               "end_batch": schedule.end_batch}
    key = max(batches, key=batches.get)
    if schedule.critical_batch and schedule.critical_batch < batches[key]:
        key, batches[key] = "critical_batch", schedule.critical_batch
    worst = accumulation(batches[key], schedule.micro_batch, world_size)
    if worst > MAX_ACCUMULATION:
        most = MAX_ACCUMULATION * schedule.micro_batch * world_size
        raise ConfigError(
            f"training.schedule.{key}={batches[key]} needs {worst} gradient-accumulation passes per step "
            f"(micro_batch {schedule.micro_batch} x world size {world_size}); more than {MAX_ACCUMULATION} "
            "is taken for a typo",
            hint=f"lower {key} (at most {most} on {world_size} rank(s)) or raise micro_batch",
        )
    return worst


def lr_rule(schedule) -> str:
    if schedule.lr_scaling != "auto":
        return schedule.lr_scaling
    return "linear" if schedule.optimizer == "sgd" else "sqrt"


def learning_rate(batch: int, schedule) -> float:
    """`base_lr` rescaled from `base_batch` to `batch` by the rule (sqrt/linear/none); the batch
    used for scaling is capped at `critical_batch`, past which a larger batch buys no speed-up."""
    effective = min(batch, schedule.critical_batch) if schedule.critical_batch else batch
    ratio = effective / schedule.base_batch
    rule = lr_rule(schedule)
    if rule == "sqrt":
        return schedule.base_lr * math.sqrt(ratio)
    if rule == "linear":
        return schedule.base_lr * ratio
    return schedule.base_lr


def plan_step(step: int, schedule, world_size: int) -> StepPlan:
    """The accumulation and LR of `step` for `world_size` ranks; the LR follows the batch realised."""
    wanted = target_batch(step, schedule)
    accum = accumulation(wanted, schedule.micro_batch, world_size)
    realised = accum * schedule.micro_batch * world_size
    return StepPlan(step, wanted, accum, realised, learning_rate(realised, schedule))


def table(schedule, world_size: int, steps: int | None = None) -> list[dict]:
    """The whole run, one row per step (for reports and `train plan`); ConfigError where a step
    needs more than MAX_ACCUMULATION micro-batches (`check_accumulation`)."""
    count = steps if steps is not None else schedule_total(schedule)
    check_accumulation(schedule, world_size)
    return [plan_step(step, schedule, world_size).to_dict() for step in range(count)]


def _phases(schedule) -> list[tuple[int, int]]:
    """[first, end) of the warmup, hold and decay phases of the run; `target_batch` is monotonic
    within each (a linear ramp or a constant, capped and rounded)."""
    total, warmup, decay = schedule_total(schedule), schedule.warmup_steps, schedule.decay_steps
    cuts = sorted({0, min(warmup, total), max(min(warmup, total), total - decay) if decay else total, total})
    return [(first, end) for first, end in zip(cuts, cuts[1:], strict=False) if first < end]


def segments(schedule, world_size: int) -> list[dict]:
    """The whole run as runs of steps that do the same thing: one row per stretch of steps with
    the same accumulation, global batch and LR (and on the same side of the target batch), with
    `first_step`, `last_step`, `steps` and the target batch's `min_target_batch`/`max_target_batch`
    over it. Found by bisection inside each monotonic phase, so a run of a billion steps takes as
    long as one of ten; ConfigError as `table` (`check_accumulation`)."""
    check_accumulation(schedule, world_size)
    floor = schedule.micro_batch * world_size

    def key(step: int) -> tuple:
        plan = plan_step(step, schedule, world_size)
        return plan.accumulation, plan.global_batch, plan.lr, floor > plan.target_batch

    rows: list[dict] = []
    for first, end in _phases(schedule):
        while first < end:
            wanted, low, high = key(first), first, end - 1  # the last step of the stretch: in [low, high]
            while low < high:
                middle = (low + high + 1) // 2
                low, high = (middle, high) if key(middle) == wanted else (low, middle - 1)
            targets = (target_batch(first, schedule), target_batch(low, schedule))
            plan = plan_step(first, schedule, world_size)
            rows.append({"first_step": first, "last_step": low, "steps": low - first + 1,
                         "min_target_batch": min(targets), "max_target_batch": max(targets),
                         "accumulation": plan.accumulation, "global_batch": plan.global_batch, "lr": plan.lr})
            first = low + 1
    return rows


def oversize_warning(schedule, world_size: int, rows: list[dict]) -> str | None:
    """A warning where one micro-batch per rank already exceeds the target batch (the accumulation
    cannot go below 1, so the realised global batch is larger than the schedule asks); else None.
    `rows` are `table`'s (one per step) or `segments`'."""
    floor = schedule.micro_batch * world_size
    least = {id(row): row["target_batch"] if "target_batch" in row else row["min_target_batch"] for row in rows}
    over = [row for row in rows if floor > least[id(row)]]
    if not over:
        return None
    worst = max(row["global_batch"] / least[id(row)] for row in over)
    over_steps, all_steps = (sum(row.get("steps", 1) for row in found) for found in (over, rows))
    critical = schedule.critical_batch
    past = f", and past critical_batch {critical}" if critical and floor > critical else ""
    return (f"world size {world_size} x micro_batch {schedule.micro_batch} = {floor} samples per step is more than "
            f"the target batch at {over_steps} of {all_steps} steps (up to {worst:.3g}x the target{past}): "
            "use fewer ranks or a smaller micro_batch to follow the schedule")


def overlap_warning(schedule) -> str | None:
    """A warning where warmup_steps + decay_steps exceed the run (the decay then starts before the
    warmup ends: the batch never holds peak_batch and drops at once when the warmup stops); else None."""
    total = schedule_total(schedule)
    if not total or schedule.warmup_steps + schedule.decay_steps <= total:
        return None
    return (f"warmup_steps {schedule.warmup_steps} + decay_steps {schedule.decay_steps} is more than the "
            f"{total} steps of the run: the batch never holds peak_batch {schedule.peak_batch} and drops from "
            "the warmup straight into the decay; shorten them or run more steps")


@dataclass(frozen=True)
class RunSchedule:
    """A schedule bound to a run length: the settings' fields plus `total_steps`."""

    micro_batch: int
    start_batch: int
    peak_batch: int
    end_batch: int
    warmup_steps: int
    decay_steps: int
    critical_batch: int | None
    base_lr: float
    base_batch: int
    optimizer: str
    lr_scaling: str
    total_steps: int

    @classmethod
    def from_settings(cls, settings, total_steps: int, **overrides) -> RunSchedule:
        """The `training.schedule` settings with `overrides` (None ignored) bound to `total_steps`;
        overrides are validated as the settings are (ConfigError naming the key: a zero micro
        batch, a fractional or negative batch, a NaN learning rate)."""
        from seedance_tasks.config import section_with

        values = section_with(settings, overrides, source="the schedule overrides").model_dump()
        return cls(total_steps=total_steps, **values)

    def to_dict(self) -> dict:
        return asdict(self)
