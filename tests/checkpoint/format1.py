"""The committed format-1 store (`tests/data/checkpoint_format1/`, see its SOURCE.md) and helpers
to build a mixed store from it: format-1 checkpoints written by the old code, then format-2 ones."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent.parent / "data" / "checkpoint_format1"
RUN = "v1"
STEPS = (0, 10, 20)  # 0 a keyframe, 10 and 20 deltas against it (keyframe_every 4, chunk_size 4096)


def state_at(step: int):
    """The state the fixture stored at `step` (the generator in SOURCE.md), for later steps too."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    base = torch.randn(2048, generator=gen)
    drift = torch.randn(2048, generator=torch.Generator().manual_seed(step)) * 1e-3
    w = base + drift * (step / 10 + 1)
    return {"model": {"w": w.reshape(-1, 16), "b": torch.arange(16, dtype=torch.float32) + step,
                      "h": w[:512].to(torch.bfloat16), "ids": torch.arange(300, dtype=torch.int64) * (step + 1)},
            "optimizer": {"exp_avg_sq": (w * w).reshape(-1, 16), "step": torch.tensor(float(step))},
            "step": step}


def fingerprint(state) -> str:
    """sha256 over every tensor's name and bytes in tree order (what SOURCE.md's generator recorded)."""
    import torch

    from seedance_tasks.checkpoint.tree import flatten

    h = hashlib.sha256()
    for name, tensor in flatten(state)[1]:
        h.update(name.encode())
        h.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def expected() -> dict[int, str]:
    """{step: fingerprint} of the states the fixture holds, as recorded when it was written."""
    return {int(step): value for step, value in json.loads((FIXTURE / "expected.json").read_text()).items()}


def copy_store(target: Path) -> Path:
    """A writable copy of the format-1 store at `target`; returns it."""
    shutil.copytree(FIXTURE / "store", target)
    return target


def mixed_store(target: Path, later=(30, 40, 50)) -> dict[int, str]:
    """The format-1 store copied to `target`, then `later` steps saved by this version (format 2;
    step 30 is a delta against format-1 step 20, 40 a keyframe, 50 a delta against 40).
    Returns {step: fingerprint} of every step."""
    from seedance_tasks import checkpoint

    copy_store(target)
    for step in later:
        checkpoint.save(state_at(step), str(target), RUN, step, keyframe_every=4, cache_base=False,
                        chunk_size=4096)
    return {**expected(), **{step: fingerprint(state_at(step)) for step in later}}
