"""The reference trainer, run by torchrun: a small GPT, DDP, AdamW (or SGD), the batch-size
schedule through gradient accumulation, fp32/bf16/fp16 (GradScaler) precision, checkpoints
through `seedance_tasks.checkpoint` (`save_async`; every K steps or the Young-Daly interval),
resume from the latest checkpoint on (re)start, per-step telemetry (`seedance_tasks.telemetry`),
and a clean stop on SIGTERM or an EC2 spot notice: finish the step, save it, exit 75 (retryable).

Deterministic by construction, so an interrupted and resumed run follows the same loss
trajectory as an uninterrupted one: seeded init, data that is a pure function of (seed, step,
micro-batch, rank), deterministic algorithms, and the optimizer state saved with the model.

`python -m seedance_tasks.training.trainer --job job.json` (launch writes the job file). Test
hook: `SEEDANCE_TRAIN_FAIL_AT_STEP=N` makes rank `SEEDANCE_TRAIN_FAIL_RANK` (default: the last)
SIGKILL itself after step N on the run's first attempt (attempt 0: neither a torchrun restart nor a relaunch);
`SEEDANCE_TRAIN_HANG_AT_STEP=N` makes it hang there instead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from seedance_tasks.training import schedule as batch_schedule
from seedance_tasks.training.plan import apply_rank_binding

FAIL_AT_ENV = "SEEDANCE_TRAIN_FAIL_AT_STEP"
FAIL_RANK_ENV = "SEEDANCE_TRAIN_FAIL_RANK"
HANG_AT_ENV = "SEEDANCE_TRAIN_HANG_AT_STEP"
STOP_REASONS = ("SIGTERM", "spot-notice")  # every rank learns which, in the step's all-reduce


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads, dropout=0.0, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A decoder-only transformer: token + position embeddings, pre-norm blocks, tied output head."""

    def __init__(self, vocab_size: int, seq_len: int, d_model: int, n_layers: int, n_heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln = nn.LayerNorm(d_model)
        for embedding in (self.tok, self.pos):
            nn.init.normal_(embedding.weight, std=0.02)
        self.register_buffer("mask", torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), 1), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(length, device=tokens.device))
        mask = self.mask[:length, :length]
        for block in self.blocks:
            x = block(x, mask)
        return self.ln(x) @ self.tok.weight.T


def synthetic_tokens(seed: int, step: int, index: int, micro_batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    """A micro-batch of a learnable synthetic language: next = (5*prev + 3) mod vocab, 10% noise.

    A pure function of its arguments: the same (seed, step, index) always gives the same tokens.
    """
    generator = torch.Generator().manual_seed((seed * 1_000_003 + step) * 65_537 + index)
    tokens = torch.empty(micro_batch, seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, vocab, (micro_batch,), generator=generator)
    noise = torch.rand(micro_batch, seq_len + 1, generator=generator) < 0.1
    random = torch.randint(0, vocab, (micro_batch, seq_len + 1), generator=generator)
    for t in range(1, seq_len + 1):
        tokens[:, t] = torch.where(noise[:, t], random[:, t], (tokens[:, t - 1] * 5 + 3) % vocab)
    return tokens


def sample_tokens(sample: dict[str, Any], length: int, vocab: int) -> torch.Tensor:
    """`length` tokens of one preprocessed sample: its text (UTF-8 bytes) if it has one, else its
    image pixels, each byte mapped onto the vocabulary (`byte * vocab // 256`); cycled if short."""
    text = next((sample[key] for key in ("txt", "text", "caption") if isinstance(sample.get(key), str)), None)
    if text:
        raw = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
    else:
        image = torch.as_tensor(sample["image"])  # uint8 (3, size, size)
        raw = image.reshape(-1).to(torch.long)
    if raw.numel() == 0:
        raw = torch.zeros(1, dtype=torch.long)
    repeats = -(-length // raw.numel())
    return (raw.repeat(repeats)[:length] * vocab) // 256


class ShardTokens:
    """Micro-batches from preprocessed WebDataset shards (`--data`), through the preprocessing
    pipeline's `ShardDataset`: this rank's shards in a fixed order, epoch after epoch, so a resumed
    run sees exactly the samples the uninterrupted run saw (it skips the ones already consumed)."""

    def __init__(self, uri: str, micro_batch: int, seq_len: int, vocab: int, rank: int, world: int,
                 image_size: int = 32) -> None:
        from seedance_tasks.preprocess import ShardDataset

        self.dataset = ShardDataset(uri, size=image_size, io_workers=1, cpu_workers=1, shuffle=False,
                                    rank=rank, world_size=world)
        if not self.dataset.shards_for_this_reader():
            raise RuntimeError(f"{uri}: rank {rank} of {world} has no shard to read; use fewer ranks or more shards")
        self.micro_batch, self.length, self.vocab = micro_batch, seq_len + 1, vocab
        self._iterator = None
        self.epoch = 0

    def _next_sample(self) -> dict[str, Any]:
        for _attempt in range(2):
            if self._iterator is None:
                self._iterator = iter(self.dataset)
            try:
                return next(self._iterator)
            except StopIteration:
                self._iterator, self.epoch = None, self.epoch + 1
        raise RuntimeError(f"{self.dataset.source}: no readable sample for this rank")

    def skip(self, samples: int) -> None:
        for _ in range(samples):
            self._next_sample()

    def batch(self) -> torch.Tensor:
        return torch.stack([sample_tokens(self._next_sample(), self.length, self.vocab)
                            for _ in range(self.micro_batch)])


def _log(rank: int, message: str) -> None:
    """One whole line in one write: ranks share torchrun's pipe, and `print` writes the text and
    its newline apart (unbuffered), so two ranks' lines could interleave mid-line."""
    sys.stdout.write(f"[rank{rank}] {message}\n")
    sys.stdout.flush()


_METRICS_LOCK = threading.Lock()  # the main loop and finished background saves both write lines


def _metrics_line(path: Path, record_: dict[str, Any]) -> None:
    """Append one record as a line, synced. After a line torn by a crash (no newline at the end
    of the file) it starts a new line, so the torn one stays alone and this record stays whole."""
    line = json.dumps(record_) + "\n"
    with _METRICS_LOCK, path.open("a+b") as handle:
        if handle.seek(0, os.SEEK_END):
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                line = "\n" + line
        handle.write(line.encode())
        handle.flush()
        os.fsync(handle.fileno())


class Precision:
    """fp32, bf16 autocast (CPU and CUDA), or fp16 autocast with a GradScaler (CUDA; CPU where torch
    has it). `step()` says whether the optimizer step was skipped for inf/NaN gradients: the
    scaler never switches itself off, so every overflow is counted."""

    def __init__(self, mode: str, device: torch.device, init_scale: float = 65536.0) -> None:
        self.mode, self.device = mode, device
        self.dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[mode]
        self.scaler = torch.amp.GradScaler(device.type, init_scale=init_scale) if mode == "fp16" else None

    def autocast(self):
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        if self.scaler is None:
            optimizer.step()
            return False
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)  # skipped when the unscaled gradients hold inf/NaN
        self.scaler.update()
        return self.scaler.get_scale() < before  # the scale only backs off after an overflow

    @property
    def loss_scale(self) -> float | None:
        return self.scaler.get_scale() if self.scaler is not None else None

    def state_dict(self) -> dict[str, Any] | None:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


class _NoPhase:
    """The recorder's stand-in when telemetry is off: every call does nothing."""

    _null = nullcontext()

    def step(self, step: int):
        return self._null

    def phase(self, name: str):
        return self._null

    def loader(self, samples: int, nbytes: int) -> None:
        pass

    def loss_scale(self, scale: float, skipped: bool) -> None:
        pass

    def note_checkpoint_interval(self, info: dict) -> None:
        pass

    def close(self) -> dict:
        return {}


def train_step(ddp, optimizer, precision: Precision, batch, accumulation: int, loss_fn, recorder=None):
    """One optimizer step over `accumulation` micro-batches (`batch(micro)` -> tokens on the device),
    gradients synchronised by DDP on the last one. Returns (this rank's loss, skipped)."""
    recorder = recorder or _NoPhase()
    optimizer.zero_grad(set_to_none=True)
    local_loss = None
    for micro in range(accumulation):
        with recorder.phase("data"):
            tokens = batch(micro)
        recorder.loader(tokens.shape[0], tokens.numel() * tokens.element_size())
        with recorder.phase("compute"):
            sync = nullcontext() if micro == accumulation - 1 else ddp.no_sync()
            with sync:
                with precision.autocast():
                    logits = ddp(tokens[:, :-1])
                    loss = loss_fn(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
                loss = loss / accumulation
                precision.backward(loss)
            local_loss = loss.detach() if local_loss is None else local_loss + loss.detach()
    with recorder.phase("compute"):
        skipped = precision.step(optimizer)
    if precision.scaler is not None:
        recorder.loss_scale(precision.loss_scale, skipped)
    return local_loss, skipped


class Checkpointing:
    """Rank 0's checkpoints: when to save (every K steps, or the Young-Daly interval for `auto`),
    saves through `save_async` (the loop stalls only for the copy), and their metrics events."""

    def __init__(self, job: dict[str, Any], metrics: Path, rank: int, start: int, recorder) -> None:
        from seedance_tasks.training import resilience

        self.store, self.run = job.get("checkpoint_store"), job.get("run")
        self.every, self.steps = job.get("checkpoint_every") or 0, int(job["steps"])
        self.metrics, self.rank, self.recorder = metrics, rank, recorder
        self.pending: list[Any] = []
        self.saved: set[int] = {start} if start else set()
        self.last_saved = start
        self.stalls: list[float] = []
        self.step_seconds: list[float] = []
        self.interval: dict[str, Any] | None = None
        if self.every == "auto":
            self.history = resilience.mtbf_from_history(metrics, float(job.get("mtbf") or 86400))
            self.stalls += self.history.pop("save_stalls", [])
            self._plan()
        elif self.store and self.run:
            self.interval = {"mode": "fixed", "interval_steps": int(self.every) or None}
            recorder.note_checkpoint_interval(self.interval)
            if rank == 0:
                _metrics_line(metrics, {"event": "checkpoint_interval", **self.interval})

    @property
    def enabled(self) -> bool:
        return bool(self.store and self.run)

    def _plan(self) -> None:
        from seedance_tasks.training import resilience

        if not self.stalls or not self.step_seconds:
            self.interval = {"mode": "young-daly", "interval_steps": 1, "why": "first save measures the save stall",
                             **self.history}
        else:
            self.interval = {**resilience.young_daly(sum(self.stalls) / len(self.stalls), self.history["mtbf_s"],
                                                     sum(self.step_seconds) / len(self.step_seconds),
                                                     max_steps=self.steps), **self.history}
        self.recorder.note_checkpoint_interval(self.interval)
        if self.rank == 0:
            _metrics_line(self.metrics, {"event": "checkpoint_interval", **self.interval})

    def due(self, done: int, step_seconds: float) -> bool:
        """Rank 0's decision to save after step `done` (the other ranks follow it through the all-reduce)."""
        self.step_seconds.append(step_seconds)
        if not self.enabled or self.rank != 0:
            return False
        if done == self.steps:
            return True
        if self.every == "auto":
            return done - self.last_saved >= self.interval["interval_steps"]
        return bool(self.every) and done % int(self.every) == 0

    def save(self, state: dict[str, Any], done: int, loss: float) -> None:
        """save_async of `state` as step `done` (once per step); the stall is what the loop waited."""
        from seedance_tasks import checkpoint

        if done in self.saved:
            return
        began = time.perf_counter()
        future = checkpoint.save_async(state, self.store, self.run, done, metrics={"loss": loss})
        stall = time.perf_counter() - began
        self.saved.add(done)
        self.last_saved = done
        self.pending.append(future)
        self.stalls.append(stall)
        # the event is written when the save commits, even if this process dies right after
        future.add_done_callback(lambda finished, done=done, stall=stall: self._committed(done, finished, stall))
        if self.every == "auto":
            self._plan()

    def _committed(self, done: int, future, stall: float) -> None:
        if future.cancelled() or future.exception() is not None:
            return  # wait_for_saves() raises it in the main thread
        summary = future.result()
        _metrics_line(self.metrics, {"event": "checkpoint", "step": done, "stored_bytes": summary.get("stored_bytes"),
                                     "kind": summary.get("kind"), "stall_s": round(stall, 6)})
        _log(self.rank, f"checkpoint step {done}: {summary.get('kind')} {summary.get('stored_bytes')} bytes "
                        f"(loop stalled {stall * 1000:.1f} ms)")

    def drain(self, wait: bool = False) -> None:
        """Forget the saves that finished; with `wait`, wait for all of them (raising a failed one's error)."""
        if wait and self.pending:
            from seedance_tasks import checkpoint

            checkpoint.wait_for_saves()
        self.pending = [future for future in self.pending if not future.done()]


def _recorder(job: dict[str, Any], rank: int, world: int, attempt: int, device: torch.device):
    if not job.get("telemetry"):
        return _NoPhase()
    from seedance_tasks.telemetry.recorder import StepRecorder
    from seedance_tasks.telemetry.settings import TelemetrySettings

    settings = TelemetrySettings.model_validate(job["telemetry"])
    if not settings.enabled:
        return _NoPhase()
    recorder = StepRecorder(settings, folder=job["telemetry_dir"], rank=rank, world=world,
                            run=job.get("run") or Path(job["telemetry_dir"]).parent.name, attempt=attempt,
                            device=device, local_world=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    port = recorder.start()
    _log(rank, f"telemetry: exporter {'on port ' + str(port) if port else 'off'}, energy {recorder.meter.source}, "
               f"price {recorder.price.key} {recorder.price.hourly} USD/h x {recorder.price.units}")
    return recorder


def _watcher(job: dict[str, Any], local_rank: int):
    from seedance_tasks.training.resilience import InterruptWatcher

    spot = job.get("spot") or {}
    endpoint = spot.get("endpoint") if spot.get("enabled") and local_rank == 0 else None  # one poller per node
    return InterruptWatcher(endpoint, float(spot.get("poll_interval") or 5)).install()


@record
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Seedance reference trainer (run by torchrun)")
    parser.add_argument("--job", required=True, help="job file written by `seedance train launch`")
    args = parser.parse_args(argv)
    job = json.loads(Path(args.job).read_text())

    binding = apply_rank_binding()
    backend = job["backend"]
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    watcher = _watcher(job, local_rank)  # a SIGTERM from here on is a request to stop after a step
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group(backend, timeout=timedelta(seconds=float(job["collective_timeout"])))
    rank, world = dist.get_rank(), dist.get_world_size()
    # unique across relaunches of the run (launch's attempt_base), not just torchrun's restarts
    attempt = int(job.get("attempt_base") or 0) + int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    precision_mode = job.get("precision") or "fp32"
    _log(rank, f"start: world={world} backend={backend} device={device} attempt={attempt} pid={os.getpid()} "
               f"precision={precision_mode} binding={binding}")

    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS determinism needs it
    torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
    model_cfg, sched = job["model"], batch_schedule.RunSchedule(**job["schedule"])
    batch_schedule.check_accumulation(sched, world)  # a restart on fewer ranks needs more accumulation
    torch.manual_seed(job["seed"])
    model = TinyGPT(**model_cfg).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    if sched.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=sched.base_lr, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=sched.base_lr, weight_decay=0.01)
    precision = Precision(precision_mode, device, float(job.get("loss_scale_init") or 65536.0))

    store, run = job.get("checkpoint_store"), job.get("run")
    start = 0
    if store and run:
        from seedance_tasks import checkpoint

        latest = checkpoint.latest_step(store, run)
        if latest is not None:
            state = checkpoint.load(store, run, latest)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            precision.load_state_dict(state.get("scaler"))
            start = int(state["step"])
            _log(rank, f"resumed from checkpoint step {start} of run {run} (saved with world={state.get('world')})")
    metrics = Path(job["metrics"])
    recorder = _recorder(job, rank, world, attempt, device)
    checkpoints = Checkpointing(job, metrics, rank, start, recorder)
    if rank == 0:
        _metrics_line(metrics, {"event": "start", "attempt": attempt, "world": world, "resumed_from": start,
                                "precision": precision_mode, "time": time.time()})

    data = None
    if job.get("data"):
        data = ShardTokens(job["data"], sched.micro_batch, model_cfg["seq_len"], model_cfg["vocab_size"], rank, world)
        consumed = sum(batch_schedule.plan_step(step, sched, world).accumulation for step in range(start))
        data.skip(consumed * sched.micro_batch)  # resume at the sample the interrupted run was at
    fail_at = int(os.environ.get(FAIL_AT_ENV, "-1"))
    hang_at = int(os.environ.get(HANG_AT_ENV, "-1"))
    fail_rank = int(os.environ.get(FAIL_RANK_ENV, str(world - 1)))
    steps = int(job["steps"])
    loss_fn = nn.CrossEntropyLoss()
    interrupted = None
    for step in range(start, steps):
        done = step + 1
        plan = batch_schedule.plan_step(step, sched, world)
        for group in optimizer.param_groups:
            group["lr"] = plan.lr
        began = time.perf_counter()
        with recorder.step(done):

            def batch(micro: int, plan=plan, step=step) -> torch.Tensor:
                if data is not None:
                    return data.batch().to(device)
                index = micro * world + rank  # the global micro-batch slot this rank fills
                return synthetic_tokens(job["seed"], step, index, sched.micro_batch, model_cfg["seq_len"],
                                        model_cfg["vocab_size"]).to(device)

            local_loss, skipped = train_step(ddp, optimizer, precision, batch, plan.accumulation, loss_fn, recorder)
            with recorder.phase("collective"):
                # one all-reduce: the loss, whether any rank was asked to stop, whether rank 0 saves now
                wants_save = checkpoints.due(done, time.perf_counter() - began)
                asked = [float(watcher.reason == reason) for reason in STOP_REASONS]
                flags = torch.cat([local_loss.float().reshape(1),
                                   torch.tensor([*asked, float(wants_save)], device=device)])
                dist.all_reduce(flags)
                reduced = flags.tolist()
            global_loss = float(reduced[0] / world)
            stops = [reason for reason, count in zip(STOP_REASONS, reduced[1:-1], strict=True) if count > 0]
            stop, save_now = bool(stops), reduced[-1] > 0
            if checkpoints.enabled and (save_now or stop) and rank == 0:
                with recorder.phase("checkpoint"):
                    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": done,
                             "world": world, "schedule": plan.to_dict()}
                    if precision.scaler is not None:
                        state["scaler"] = precision.state_dict()
                    checkpoints.save(state, done, global_loss)
        if rank == 0:
            line = {"step": done, "loss": global_loss, "lr": plan.lr, "global_batch": plan.global_batch,
                    "accumulation": plan.accumulation, "world": world, "attempt": attempt,
                    "seconds": round(time.perf_counter() - began, 4)}
            if precision.scaler is not None:
                line.update(loss_scale=precision.loss_scale, skipped=skipped)
            _metrics_line(metrics, line)
            _log(rank, f"step {done}/{steps} loss {global_loss:.5f} batch {plan.global_batch} "
                       f"(accum {plan.accumulation}) lr {plan.lr:.3g}" + (" SKIPPED (overflow)" if skipped else ""))
            checkpoints.drain()
        if stop:
            interrupted = {"step": done, "reason": "+".join(stops), "notice": watcher.notice}
            break
        if done == fail_at and rank == fail_rank and attempt == 0:
            _log(rank, f"{FAIL_AT_ENV}={fail_at}: killing myself with SIGKILL")
            os.kill(os.getpid(), signal.SIGKILL)
        if done == hang_at and rank == fail_rank and attempt == 0:
            _log(rank, f"{HANG_AT_ENV}={hang_at}: hanging (the other ranks wait in the next collective)")
            while True:
                time.sleep(60)
    if rank == 0:
        checkpoints.drain(wait=True)  # every save committed before anyone exits
    recorder.close()
    if interrupted is not None:
        from seedance_tasks.training.resilience import INTERRUPTED_EXIT

        saved = interrupted["step"] in checkpoints.saved
        if rank == 0:
            _metrics_line(metrics, {"event": "interrupted", **interrupted, "saved": saved, "exit_code": INTERRUPTED_EXIT})
        _log(rank, f"interrupted ({interrupted['reason']}) after step {interrupted['step']}: "
                   f"{'checkpoint saved' if saved else 'no checkpoint store'}; exiting {INTERRUPTED_EXIT} (retryable)")
        dist.barrier()  # nobody exits before rank 0's save is committed
        dist.destroy_process_group()
        watcher.close()  # till here a SIGTERM (torchrun stopping the group) cannot cut the exit short
        return INTERRUPTED_EXIT
    if rank == 0:
        _metrics_line(metrics, {"event": "finish", "steps": steps})
    _log(rank, "finished")
    dist.destroy_process_group()
    watcher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
