"""Checkpoint lifecycle benchmark: 1,000 saves of a run, keep-all-on-hot vs seedance's retention + tiering.

A run saves a checkpoint every 15 minutes (simulated clock: the manifests' `created_at` are set
to the simulated save times) into a real seedance checkpoint store (delta chains, keyframes
every 8) with a `val_loss` metric. Then the real GC and tiering code runs at the end of the run
with a realistic policy: keep the last 3, every 100th step, the best 3 by val_loss, plus the
bases kept deltas need; hot < 1 h, warm (S3 Standard-IA) < 24 h, cold (S3 Glacier Instant
Retrieval) after. Printed side by side: stored bytes and monthly storage cost of
  - keep-all, raw      : every checkpoint as the trainer wrote it (torch.save size), on hot;
  - keep-all, seedance : every checkpoint in the delta-compressed store, on hot;
  - seedance policy    : after GC + tiering.
Costs use the price table in config (lifecycle.prices, USD per GB-month); hot is S3 Standard.
Every checkpoint the policy promises (last 3, every 100th) is then restored and compared
bit-exact with what was saved. `--quick` runs 200 saves.

    .venv/bin/python bench/checkpoint_lifecycle.py [--quick] [--saves N] [--project-gb 20]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
WORK = REPO / "bench" / "_work" / "checkpoint_lifecycle"
INTERVAL = timedelta(minutes=15)


def state_at(step: int, rng_base, size: int):
    """A small training state whose weights drift a little per step (so saves delta, as in training)."""
    import numpy as np
    import torch

    drift = np.random.default_rng(step).standard_normal(size).astype(np.float32) * 1e-3
    weights = rng_base + drift
    return {
        "model": {"w": torch.from_numpy(weights.reshape(-1, 64))},
        "optimizer": {"exp_avg": torch.from_numpy(drift.reshape(-1, 64) * 0.1),
                      "exp_avg_sq": torch.from_numpy((drift * drift).reshape(-1, 64)),
                      "step": torch.tensor(float(step))},
        "step": step,
    }


def digest(state) -> str:
    import torch

    h = hashlib.sha256()
    for part in (state["model"]["w"], state["optimizer"]["exp_avg"], state["optimizer"]["exp_avg_sq"]):
        h.update(part.contiguous().view(torch.uint8).numpy().tobytes())
    h.update(repr(state["step"]).encode())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 saves")
    parser.add_argument("--saves", type=int, default=1000)
    parser.add_argument("--step-every", type=int, default=1, help="step numbers between saves (1: step N = N-th save)")
    parser.add_argument("--floats", type=int, default=16384, help="float32 weights in the synthetic model")
    parser.add_argument("--project-gb", type=float, default=20.0, help="project $ for checkpoints of this raw size")
    args = parser.parse_args(argv)
    saves = 200 if args.quick else args.saves

    import io

    import numpy as np
    import torch

    from seedance_tasks import checkpoint, storage
    from seedance_tasks.checkpoint.store import committed_steps, manifest_path
    from seedance_tasks.config import load_settings
    from seedance_tasks.lifecycle import costs, gc, inventory, tiering

    # The tier roots through the environment, as a deployment's config would give them: a manifest
    # naming a root that config does not trust is refused when it is read.
    os.environ["SEEDANCE__LIFECYCLE__TIERS__WARM__URI"] = str(WORK / "warm")
    os.environ["SEEDANCE__LIFECYCLE__TIERS__COLD__URI"] = str(WORK / "cold")
    settings = load_settings().lifecycle.model_copy(deep=True)
    shutil.rmtree(WORK, ignore_errors=True)
    store = WORK / "hot"
    settings.tiers.hot.price_class = "STANDARD"  # hot = S3 Standard (a hot bucket; local NVMe costs more)
    settings.tiers.warm.price_class, settings.tiers.cold.price_class = "STANDARD_IA", "GLACIER_IR"
    policy = {"keep_last": 3, "keep_every": 100 * args.step_every, "keep_best": 3, "metric": "val_loss"}

    base = np.random.default_rng(0).standard_normal(args.floats).astype(np.float32)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    loss_rng = np.random.default_rng(1)
    digests, raw_bytes = {}, 0
    began = time.perf_counter()
    for index in range(saves):
        step = index * args.step_every
        state = state_at(step, base, args.floats)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        raw_bytes += buffer.tell()
        val_loss = 3.0 * np.exp(-index / (saves / 3)) + 0.05 * loss_rng.standard_normal()
        checkpoint.save(state, str(store), "run", step, metrics={"val_loss": float(val_loss)}, cache_base=True)
        path = manifest_path(storage.resolve(store), "run", step)  # simulated clock: saved every 15 min
        manifest = storage.read_json(storage.resolve(store).fs, path)
        manifest["created_at"] = (start + index * INTERVAL).isoformat()
        storage.write_json_atomic(storage.resolve(store).fs, path, manifest)
        if index % 100 == 0 or index >= saves - 3:
            digests[step] = digest(state)
    save_s = time.perf_counter() - began
    end = start + (saves - 1) * INTERVAL + timedelta(minutes=5)
    location = storage.resolve(store)

    def exact(report: dict) -> Decimal:
        """USD/month of a cost report, unrounded (its tiers' bytes at their price classes)."""
        return sum((costs.monthly(r["bytes"], settings.tiers.spec(t).price_key(), settings)
                    for t, r in report["tiers"].items()), Decimal(0))

    all_hot = costs.report(inventory.manifests(location, "run"), settings)
    keep_all_raw = costs.monthly(raw_bytes, "STANDARD", settings)
    began = time.perf_counter()
    collected = gc.collect(str(store), ["run"], settings=settings, apply=True, now=end, **policy)
    tiered = tiering.tier(str(store), ["run"], settings=settings, apply=True, now=end)
    storage.purge_trash(location, 0)
    lifecycle_s = time.perf_counter() - began
    after = costs.report(inventory.manifests(location, "run"), settings)

    promised = sorted(digests)
    kept = set(committed_steps(location, "run"))
    restorable = [s for s in promised if s in kept and digest(checkpoint.load(str(store), "run", s)) == digests[s]]

    from seedance_tasks.units import format_size

    scale = Decimal(args.project_gb * 1024**3) / (Decimal(raw_bytes) / saves)

    def row(name, count, nbytes, usd, tiers=""):
        print(f"{name:<22}{count:>12,}{format_size(nbytes):>12}{usd:>14.6f}{usd * scale:>16,.2f}"
              f"{1 - float(usd / keep_all_raw):>10.1%}   {tiers}")

    print(f"\n{saves} saves, one every {INTERVAL.seconds // 60} min ({saves * INTERVAL / timedelta(days=1):.1f} days), "
          f"{format_size(raw_bytes / saves)} raw each; saving took {save_s:.1f} s, GC + tiering {lifecycle_s:.2f} s")
    print("policy: keep the last 3, every 100th checkpoint, the best 3 by val_loss (+ bases of kept deltas);"
          " hot < 1 h, warm (Standard-IA) < 24 h, cold (Glacier IR) after; the latest stays hot\n")
    print(f"{'strategy':<22}{'checkpoints':>12}{'stored':>12}{'USD/month':>14}"
          f"{f'at {args.project_gb:g} GB/ckpt':>16}{'saved':>10}   bytes per tier")
    row("keep-all, raw (hot)", saves, raw_bytes, keep_all_raw)
    row("keep-all, seedance", saves, all_hot["bytes"], exact(all_hot))
    row("seedance policy", len(kept), after["bytes"], exact(after),
        " / ".join(f"{t} {format_size(r['bytes'])}" for t, r in after["tiers"].items()))
    saved = 1 - float(exact(after) / exact(all_hot))
    print(f"\nseedance policy vs keep-all on hot: {saved:.1%} lower monthly cost than the same compressed store kept "
          f"whole, {1 - float(exact(after) / keep_all_raw):.1%} lower than raw checkpoints kept whole")
    print(f"GC deleted {collected['checkpoints_deleted']} of {saves}; tiering moved {len(tiered['moves'])}; "
          f"promised checkpoints (last 3 + every 100th) restorable bit-exact: {len(restorable)}/{len(promised)}")
    ok = saved >= 0.70 and len(restorable) == len(promised)
    print("goal (>= 70% lower monthly cost than keep-all on hot, promised checkpoints restorable):",
          "MET" if ok else "NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
