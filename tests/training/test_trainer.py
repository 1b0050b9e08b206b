"""The reference trainer's step in process (a one-rank gloo group, real DDP): bf16 autocast on CPU,
fp16 + GradScaler (on CPU as far as torch allows) with overflowing steps skipped and counted."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from seedance_tasks.config import load_settings
from seedance_tasks.telemetry.recorder import StepRecorder
from seedance_tasks.training.trainer import Precision, TinyGPT, synthetic_tokens, train_step
from tests.airflow_services import free_port

MODEL = {"vocab_size": 32, "seq_len": 8, "d_model": 16, "n_layers": 1, "n_heads": 2}


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    model = TinyGPT(**MODEL)
    return model, DistributedDataParallel(model), torch.optim.AdamW(model.parameters(), lr=1e-2)


def _batch(step: int):
    return lambda micro: synthetic_tokens(7, step, micro, 2, MODEL["seq_len"], MODEL["vocab_size"])


def test_bf16_autocast_runs_on_cpu(group):
    model, ddp, optimizer = _model()
    precision = Precision("bf16", torch.device("cpu"))
    with precision.autocast():
        logits = ddp(_batch(0)(0)[:, :-1])
    assert logits.dtype == torch.bfloat16  # the matmuls really ran in bf16
    before = [p.detach().clone() for p in model.parameters()]
    losses = []
    for step in range(4):
        loss, skipped = train_step(ddp, optimizer, precision, _batch(step), 2, nn.CrossEntropyLoss())
        assert not skipped and loss.dtype == torch.float32 and torch.isfinite(loss)
        losses.append(float(loss))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert precision.loss_scale is None and precision.state_dict() is None


def test_fp16_overflows_are_skipped_counted_and_backed_off(group, tmp_path):
    model, ddp, optimizer = _model()
    precision = Precision("fp16", torch.device("cpu"), init_scale=2.0**40)  # scaled grads overflow fp16
    settings = load_settings().telemetry
    settings.port = None
    recorder = StepRecorder(settings, folder=tmp_path, run="fp16")
    before = [p.detach().clone() for p in model.parameters()]
    with recorder.step(1):
        _loss, skipped = train_step(ddp, optimizer, precision, _batch(0), 1, nn.CrossEntropyLoss(), recorder)
    assert skipped and precision.loss_scale == 2.0**39  # backoff 0.5 after the overflow
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # the step was skipped
    scales, skips = [], 0
    for step in range(1, 40):
        with recorder.step(step + 1):
            _loss, skipped = train_step(ddp, optimizer, precision, _batch(step), 1, nn.CrossEntropyLoss(), recorder)
        skips += skipped
        scales.append(precision.loss_scale)
        if not skipped:
            break
    assert not skipped, "the scale never came down far enough"  # the scaler kept backing off, never gave up
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    totals = recorder.snapshot()["totals"]
    assert totals["skipped_steps"] == 1 + skips and recorder.snapshot()["last"]["loss_scale"] == scales[-1]
    assert all(later == earlier / 2 for earlier, later in zip([2.0**39, *scales[:-2]], scales[:-1], strict=True))
    state = precision.state_dict()
    restored = Precision("fp16", torch.device("cpu"))
    restored.load_state_dict(state)
    assert restored.loss_scale == precision.loss_scale  # the scale survives a checkpoint
    recorder.close()
