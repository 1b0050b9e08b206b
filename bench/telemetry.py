"""Telemetry overhead: the reference trainer's step with the step recorder against the same loop without it.

Both loops run in this process on the same model and data (a one-rank gloo group, real DDP,
the trainer's own `train_step`), their steps interleaved (ABBA) so machine noise hits both alike:

- plain: `train_step` with no recorder (the trainer's stand-in that does nothing);
- recorded: `StepRecorder` on: phases, the energy meter, cost, Parquet samples flushed every
  50 steps, and the Prometheus exporter running (scraped by this script every 0.5 s);
- the recorder alone: an empty step with its phase markers, no training work (its own cost).

Prints the median step time of each, their ratio (the median over blocks of each block's paired
ratio: step times on a VM drift by 30% within minutes, so only steps close in time compare), the
whole loops of consecutive steps with and without it (every sample file written inside the time:
what a stall such as writing a file costs shows there, not in a median), the slowest step, and
the recorder's cost per step in µs.
Data lives in bench/_work/telemetry/ (git-ignored).

    .venv/bin/python bench/telemetry.py           # 8 blocks x 100 steps of each
    .venv/bin/python bench/telemetry.py --quick   # smoke test
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
WORK = REPO / "bench" / "_work" / "telemetry"
MODEL = {"vocab_size": 64, "seq_len": 32, "d_model": 64, "n_layers": 2, "n_heads": 4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke test: few steps")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100, help="steps per block")
    args = parser.parse_args()
    blocks, steps = (2, 20) if args.quick else (args.blocks, args.steps)

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from seedance_tasks.config import load_settings
    from seedance_tasks.telemetry.recorder import StepRecorder
    from seedance_tasks.training.trainer import Precision, TinyGPT, synthetic_tokens, train_step
    from tests.airflow_services import free_port

    shutil.rmtree(WORK, ignore_errors=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = TinyGPT(**MODEL)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    precision = Precision("fp32", torch.device("cpu"))
    loss_fn = nn.CrossEntropyLoss()
    batches = [synthetic_tokens(1, step, 0, 4, MODEL["seq_len"], MODEL["vocab_size"]) for step in range(16)]
    settings = load_settings().telemetry
    recorder = StepRecorder(settings, folder=WORK, run="bench")
    port = recorder.start()
    stop = threading.Event()

    def scrape() -> None:  # a Prometheus-like scraper, so the exporter's work is in the figure too
        while not stop.wait(0.5):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                response.read()

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()

    def one(step: int, rec) -> None:
        batch = batches[step % len(batches)]
        local, _skipped = train_step(ddp, optimizer, precision, lambda micro: batch, 2, loss_fn, rec)
        if rec is not None:
            with rec.phase("collective"):
                dist.all_reduce(local)
        else:
            dist.all_reduce(local)
        float(local)

    plain, recorded, empty = [], [], []
    block_ratios = []  # per block: median recorded step / median plain step (paired in time)
    counter = 0
    for _block in range(blocks):
        block_plain, block_recorded = len(plain), len(recorded)
        for index in range(2 * steps):  # plain and recorded steps alternate (ABBA), so load hits both alike
            began = time.perf_counter()
            if (index % 4) in (0, 3):
                one(counter, None)
                plain.append(time.perf_counter() - began)
            else:
                with recorder.step(counter):
                    one(counter, recorder)
                recorded.append(time.perf_counter() - began)
            counter += 1
        for _ in range(steps * 5):
            began = time.perf_counter()
            with recorder.step(counter):
                with recorder.phase("data"):
                    pass
                recorder.loader(4, 1056)
                with recorder.phase("compute"):
                    pass
                with recorder.phase("collective"):
                    pass
            empty.append(time.perf_counter() - began)
            counter += 1
        block_ratios.append(statistics.median(recorded[block_recorded:]) / statistics.median(plain[block_plain:]))
    # whole loops: runs of consecutive steps, every recorded run's files written inside its time
    loop_steps = max(4 * settings.flush_every, steps)
    runs: dict[str, list[float]] = {"plain": [], "recorded": []}
    for order in ("plain", "recorded", "recorded", "plain") * max(1, blocks // 2):
        began = time.perf_counter()
        for _ in range(loop_steps):
            if order == "plain":
                one(counter, None)
            else:
                with recorder.step(counter):
                    one(counter, recorder)
            counter += 1
        if order == "recorded":
            recorder.flush()  # waits for the writer thread, then writes what is left: all of it counted
        runs[order].append(time.perf_counter() - began)
    stop.set()
    snapshot = recorder.close()
    dist.destroy_process_group()

    p, r, e = (statistics.median(values) for values in (plain, recorded, empty))
    print(f"model {MODEL}, {blocks} blocks x {steps} steps of each, 1 thread, energy source "
          f"{snapshot['energy']['source']}, exporter on :{port}")
    print(f"{'loop':<34}{'median step':>14}{'ratio':>10}")
    print(f"{'plain (no recorder)':<34}{p * 1e3:>11.3f} ms{1.0:>10.3f}")
    print(f"{'recorded (StepRecorder on)':<34}{r * 1e3:>11.3f} ms{statistics.median(block_ratios):>10.3f}"
          "  (median of the per-block paired ratios)")
    print(f"{'recorder alone (empty step)':<34}{e * 1e6:>11.1f} µs{e / p:>10.4f}")
    print(f"overhead per step: {(r - p) * 1e6:+.1f} µs difference of the pooled medians ({(r / p - 1) * 100:+.2f}%; "
          "pooled over blocks it mixes the machine's speed changes between blocks); "
          f"the recorder's own work {e * 1e6:.1f} µs = {e / p * 100:.2f}% of a plain step")
    print(f"per block (recorded / plain median step, {blocks} blocks): median {statistics.median(block_ratios):.3f} "
          f"({min(block_ratios):.3f}–{max(block_ratios):.3f}): the spread is this machine's noise on whole steps")
    loops = [r / p for r, p in zip(runs["recorded"], runs["plain"], strict=True)]
    print(f"whole loops of {loop_steps} steps ({len(loops)} pairs, ABBA; sample files every {settings.flush_every} "
          f"steps, their writing inside the time): recorded / plain {statistics.median(loops):.3f} "
          f"({min(loops):.3f}–{max(loops):.3f}); slowest single step: plain {max(plain) * 1e3:.1f} ms, "
          f"recorded {max(recorded) * 1e3:.1f} ms")
    print(f"samples written: {len(list(WORK.glob('samples-*.parquet')))} Parquet files in {WORK}")


if __name__ == "__main__":
    main()
