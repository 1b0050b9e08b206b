"""Batch-size schedule math: warmup/hold/decay, accumulation, LR rules, critical batch, world changes."""

from __future__ import annotations

import math

import pytest

from seedance_tasks.training import schedule
from seedance_tasks.training.schedule import RunSchedule


def make(**overrides) -> RunSchedule:
    values = dict(micro_batch=4, start_batch=32, peak_batch=256, end_batch=64, warmup_steps=8, decay_steps=4,
                  critical_batch=None, base_lr=1e-3, base_batch=32, optimizer="adamw", lr_scaling="auto",
                  total_steps=20)
    values.update(overrides)
    return RunSchedule(**values)


def test_warmup_hold_decay():
    s = make()
    batches = [schedule.target_batch(step, s) for step in range(20)]
    assert batches[0] == 32
    assert batches[4] == 144  # halfway up: 32 + (256 - 32) / 2
    assert all(a < b for a, b in zip(batches[:8], batches[1:9], strict=True))  # rising through warmup
    assert batches[8:16] == [256] * 8  # hold
    assert batches[16:] == [208, 160, 112, 64]  # decay to end_batch at the last step


def test_micro_batch_fixed_and_accumulation_realises_the_batch():
    s = make()
    for step in range(20):
        plan = schedule.plan_step(step, s, world_size=2)
        assert plan.global_batch == plan.accumulation * s.micro_batch * 2
        assert abs(plan.global_batch - plan.target_batch) <= s.micro_batch * 2 / 2  # nearest whole micro-batch
    assert schedule.plan_step(10, s, 2).accumulation == 32
    assert schedule.accumulation(3, micro_batch=4, world_size=8) == 1  # never below one micro-batch


def test_world_size_change_keeps_the_global_batch():
    s = make()
    for step in (0, 10, 19):  # batches of 32/256/64: whole micro-batches for 2, 4 and 8 ranks
        two, four, eight = (schedule.plan_step(step, s, world) for world in (2, 4, 8))
        assert two.global_batch == four.global_batch == eight.global_batch == two.target_batch
        assert two.accumulation == 2 * four.accumulation == 4 * eight.accumulation
        assert two.lr == four.lr == eight.lr
    for world in (2, 4, 8):  # mid-ramp (target 172): the nearest batch each world size can realise
        plan = schedule.plan_step(5, s, world)
        assert abs(plan.global_batch - 172) <= s.micro_batch * world / 2
        assert math.isclose(plan.lr, 1e-3 * math.sqrt(plan.global_batch / 32))
    # not divisible: the nearest realisable batch, with the LR of the batch actually used
    odd = schedule.plan_step(10, s, world_size=3)
    assert odd.accumulation == 21 and odd.global_batch == 252
    assert math.isclose(odd.lr, 1e-3 * math.sqrt(252 / 32))


def test_lr_rules():
    adam = make()
    assert math.isclose(schedule.learning_rate(128, adam), 1e-3 * 2)  # sqrt(128/32)
    sgd = make(optimizer="sgd")
    assert math.isclose(schedule.learning_rate(128, sgd), 1e-3 * 4)  # linear
    forced = make(optimizer="sgd", lr_scaling="sqrt")
    assert math.isclose(schedule.learning_rate(128, forced), 2e-3)
    assert schedule.learning_rate(128, make(lr_scaling="none")) == 1e-3


def test_critical_batch_caps_batch_and_lr_scaling():
    s = make(critical_batch=128)
    assert max(schedule.target_batch(step, s) for step in range(20)) == 128
    assert math.isclose(schedule.learning_rate(512, s), schedule.learning_rate(128, s))
    assert math.isclose(schedule.learning_rate(64, s), 1e-3 * math.sqrt(2))


@pytest.mark.parametrize("world", [1, 2, 4])
def test_table_covers_the_run(world):
    rows = schedule.table(make(), world)
    assert [row["step"] for row in rows] == list(range(20))
    assert rows[-1]["global_batch"] == 64


def test_a_world_too_large_for_the_target_batch_is_warned_about():
    s = make(critical_batch=512)
    assert schedule.oversize_warning(s, 2, schedule.table(s, 2)) is None
    warning = schedule.oversize_warning(s, 100_000, schedule.table(s, 100_000))
    assert warning.startswith("world size 100000 x micro_batch 4 = 400000 samples per step is more than the "
                              "target batch at 20 of 20 steps (up to 1.25e+04x the target, and past critical_batch 512)")
    # 16 ranks x 4 = 64: over the targets 32 and 60 of the first two warmup steps only
    assert "at 2 of 20 steps" in schedule.oversize_warning(s, 16, schedule.table(s, 16))


def test_cli_schedule_prints_the_warning():
    import json

    from typer.testing import CliRunner

    from seedance_tasks.cli import app

    result = CliRunner().invoke(app, ["train", "schedule", "--world-size", "100000", "--steps", "4", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["warnings"][0].startswith("world size 100000")


@pytest.mark.parametrize("override, key", [
    ({"micro_batch": 0}, "micro_batch"), ({"micro_batch": 2.5}, "micro_batch"), ({"peak_batch": -4}, "peak_batch"),
    ({"base_lr": math.nan}, "base_lr"), ({"base_lr": math.inf}, "base_lr"), ({"lr_scaling": "cubic"}, "lr_scaling"),
    ({"warmup_steps": "many"}, "warmup_steps"), ({"micro_bacth": 4}, "micro_bacth"),
])
def test_schedule_overrides_are_validated_as_the_settings_are(override, key):
    from seedance_tasks.config import load_settings
    from seedance_tasks.errors import ConfigError

    with pytest.raises(ConfigError, match=f"'{key}'") as caught:
        RunSchedule.from_settings(load_settings().training.schedule, 10, **override)
    assert caught.value.hint


def test_an_infinite_learning_rate_or_loss_scale_in_the_settings_is_refused(tmp_path):
    from seedance_tasks.config import load_settings
    from seedance_tasks.errors import ConfigError

    path = tmp_path / "seedance.yaml"
    path.write_text("training:\n  loss_scale_init: .inf\n  schedule:\n    base_lr: .inf\n"
                    "telemetry:\n  energy:\n    gpu_tdp_watts: .inf\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    for key in ("training.schedule.base_lr", "training.loss_scale_init", "telemetry.energy.gpu_tdp_watts"):
        assert f"'{key}'" in caught.value.message


def test_a_warmup_and_decay_longer_than_the_run_is_warned_about():
    assert schedule.overlap_warning(make()) is None  # 8 + 4 of 20 steps
    short = make(total_steps=10)
    batches = [schedule.target_batch(step, short) for step in range(10)]
    assert max(batches) < 256  # never reaches the peak
    warning = schedule.overlap_warning(short)
    assert "warmup_steps 8 + decay_steps 4 is more than the 10 steps" in warning
    import json

    from typer.testing import CliRunner

    from seedance_tasks.cli import app

    result = CliRunner().invoke(app, ["train", "schedule", "--steps", "5", "--json"])  # default warmup is 10
    assert result.exit_code == 0 and any("more than the 5 steps" in text for text in json.loads(result.stdout)["warnings"])


def test_an_accumulation_count_past_the_bound_is_refused_naming_the_key():
    from seedance_tasks.errors import ConfigError

    huge = make(peak_batch=10**12)
    with pytest.raises(ConfigError, match=r"training\.schedule\.peak_batch=1000000000000 needs 125000000000 "):
        schedule.table(huge, 2)
    with pytest.raises(ConfigError, match="end_batch"):
        schedule.check_accumulation(make(end_batch=10**9), 1)
    # capped by critical_batch: no step asks for more than it
    assert schedule.check_accumulation(make(peak_batch=10**12, critical_batch=1024), 2) == 128
    limit = schedule.MAX_ACCUMULATION
    assert schedule.check_accumulation(make(peak_batch=limit * 4 * 2), 2) == limit
    with pytest.raises(ConfigError, match="critical_batch"):
        schedule.check_accumulation(make(peak_batch=10**12, critical_batch=10**11), 2)


@pytest.mark.parametrize("overrides", [{}, {"total_steps": 10}, {"warmup_steps": 0}, {"decay_steps": 0},
                                       {"critical_batch": 100}, {"start_batch": 300, "end_batch": 500}])
@pytest.mark.parametrize("world", [1, 3, 64])
def test_segments_are_the_table_with_equal_steps_run_together(overrides, world):
    s = make(**overrides)
    rows, segments = schedule.table(s, world), schedule.segments(s, world)
    steps = [step for seg in segments for step in range(seg["first_step"], seg["last_step"] + 1)]
    assert steps == list(range(s.total_steps)) and sum(seg["steps"] for seg in segments) == s.total_steps
    for seg in segments:
        for row in rows[seg["first_step"]: seg["last_step"] + 1]:
            assert (row["accumulation"], row["global_batch"], row["lr"]) == (
                seg["accumulation"], seg["global_batch"], seg["lr"])
            assert seg["min_target_batch"] <= row["target_batch"] <= seg["max_target_batch"]
    assert schedule.oversize_warning(s, world, segments) == schedule.oversize_warning(s, world, rows)


def test_a_run_of_a_trillion_steps_is_a_few_segments_not_a_row_per_step():
    import json

    from typer.testing import CliRunner

    from seedance_tasks.cli import app

    long_run = make(total_steps=10**12, warmup_steps=10**9, decay_steps=10**9)
    segments = schedule.segments(long_run, 2)
    assert len(segments) < 1000 and segments[-1]["last_step"] == 10**12 - 1
    # was one row per step: 200,000 rows built and printed (a real run's --steps 10**11 never returned)
    result = CliRunner().invoke(app, ["train", "schedule", "--steps", "200000", "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)["segments"]
    assert len(printed) < 50 and printed[-1]["last_step"] == 199_999 and printed[-1]["global_batch"] == 64


@pytest.mark.parametrize("value", ["0", "0s"])
def test_a_zero_collective_timeout_is_refused_not_a_job_whose_every_collective_times_out(value):
    from seedance_tasks.config import load_settings
    from seedance_tasks.errors import ConfigError

    with pytest.raises(ConfigError, match=r"'training\.collective_timeout' \(from SEEDANCE__TRAINING__COLLECTIVE_TIMEOUT\)"):
        load_settings(environ={"SEEDANCE__TRAINING__COLLECTIVE_TIMEOUT": value})
    assert load_settings(environ={"SEEDANCE__TRAINING__COLLECTIVE_TIMEOUT": "30s"}).training.collective_timeout == 30
