"""The reference trainer, run by torchrun: a small GPT, DDP, AdamW (or SGD), the batch-size
schedule through gradient accumulation, checkpoints through `seedance_tasks.checkpoint`, and
resume from the latest checkpoint on (re)start.

Deterministic by construction, so an interrupted and resumed run follows the same loss
trajectory as an uninterrupted one: seeded init, data that is a pure function of (seed, step,
micro-batch, rank), deterministic algorithms, and the optimizer state saved with the model.

`python -m seedance_tasks.training.trainer --job job.json` (launch writes the job file). Test
hook: `SEEDANCE_TRAIN_FAIL_AT_STEP=N` makes rank `SEEDANCE_TRAIN_FAIL_RANK` (default: the last)
SIGKILL itself after step N on the first attempt (`TORCHELASTIC_RESTART_COUNT=0`);
`SEEDANCE_TRAIN_HANG_AT_STEP=N` makes it hang there instead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
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
    print(f"[rank{rank}] {message}", flush=True)


def _metrics_line(path: Path, record_: dict[str, Any]) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(record_) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@record
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Seedance reference trainer (run by torchrun)")
    parser.add_argument("--job", required=True, help="job file written by `seedance train launch`")
    args = parser.parse_args(argv)
    job = json.loads(Path(args.job).read_text())

    binding = apply_rank_binding()
    backend = job["backend"]
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group(backend, timeout=timedelta(seconds=float(job["collective_timeout"])))
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    _log(rank, f"start: world={world} backend={backend} device={device} attempt={attempt} binding={binding}")

    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS determinism needs it
    torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
    model_cfg, sched = job["model"], batch_schedule.RunSchedule(**job["schedule"])
    torch.manual_seed(job["seed"])
    model = TinyGPT(**model_cfg).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    if sched.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=sched.base_lr, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=sched.base_lr, weight_decay=0.01)

    store, run = job.get("checkpoint_store"), job.get("run")
    start = 0
    if store and run:
        from seedance_tasks import checkpoint

        latest = checkpoint.latest_step(store, run)
        if latest is not None:
            state = checkpoint.load(store, run, latest)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = int(state["step"])
            _log(rank, f"resumed from checkpoint step {start} of run {run} (saved with world={state.get('world')})")
    metrics = Path(job["metrics"])
    if rank == 0:
        _metrics_line(metrics, {"event": "start", "attempt": attempt, "world": world, "resumed_from": start})

    data = None
    if job.get("data"):
        data = ShardTokens(job["data"], sched.micro_batch, model_cfg["seq_len"], model_cfg["vocab_size"], rank, world)
        consumed = sum(batch_schedule.plan_step(step, sched, world).accumulation for step in range(start))
        data.skip(consumed * sched.micro_batch)  # resume at the sample the interrupted run was at
    fail_at = int(os.environ.get(FAIL_AT_ENV, "-1"))
    hang_at = int(os.environ.get(HANG_AT_ENV, "-1"))
    fail_rank = int(os.environ.get(FAIL_RANK_ENV, str(world - 1)))
    every, steps = int(job.get("checkpoint_every") or 0), int(job["steps"])
    loss_fn = nn.CrossEntropyLoss()
    for step in range(start, steps):
        plan = batch_schedule.plan_step(step, sched, world)
        for group in optimizer.param_groups:
            group["lr"] = plan.lr
        optimizer.zero_grad(set_to_none=True)
        local_loss = torch.zeros((), device=device)
        began = time.perf_counter()
        for micro in range(plan.accumulation):
            index = micro * world + rank  # the global micro-batch slot this rank fills
            if data is not None:
                tokens = data.batch()
            else:
                tokens = synthetic_tokens(job["seed"], step, index, sched.micro_batch,
                                          model_cfg["seq_len"], model_cfg["vocab_size"])
            tokens = tokens.to(device)
            sync = nullcontext() if micro == plan.accumulation - 1 else ddp.no_sync()
            with sync:
                logits = ddp(tokens[:, :-1])
                loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)) / plan.accumulation
                loss.backward()
            local_loss += loss.detach()
        optimizer.step()
        dist.all_reduce(local_loss)
        global_loss = float(local_loss.item() / world)
        if rank == 0:
            _metrics_line(metrics, {
                "step": step + 1, "loss": global_loss, "lr": plan.lr, "global_batch": plan.global_batch,
                "accumulation": plan.accumulation, "world": world, "attempt": attempt,
                "seconds": round(time.perf_counter() - began, 4),
            })
            _log(rank, f"step {step + 1}/{steps} loss {global_loss:.5f} batch {plan.global_batch} "
                       f"(accum {plan.accumulation}) lr {plan.lr:.3g}")
        done = step + 1
        if store and run and ((every and done % every == 0) or done == steps):
            if rank == 0:
                from seedance_tasks import checkpoint

                summary = checkpoint.save(
                    {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": done,
                     "world": world, "schedule": plan.to_dict()},
                    store, run, done, metrics={"loss": global_loss},
                )
                _metrics_line(metrics, {"event": "checkpoint", "step": done, "stored_bytes": summary.get("stored_bytes"),
                                        "kind": summary.get("kind")})
                _log(rank, f"checkpoint step {done}: {summary.get('kind')} {summary.get('stored_bytes')} bytes")
            dist.barrier()
        if done == fail_at and rank == fail_rank and attempt == 0:
            _log(rank, f"{FAIL_AT_ENV}={fail_at}: killing myself with SIGKILL")
            os.kill(os.getpid(), signal.SIGKILL)
        if done == hang_at and rank == fail_rank and attempt == 0:
            _log(rank, f"{HANG_AT_ENV}={hang_at}: hanging (the other ranks wait in the next collective)")
            while True:
                time.sleep(60)
    if rank == 0:
        _metrics_line(metrics, {"event": "finish", "steps": steps})
    _log(rank, "finished")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
