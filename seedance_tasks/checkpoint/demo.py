"""Demo: a tiny GPT trained on CPU drops real checkpoints into an inbox; `seedance_checkpoints` stores them."""

from __future__ import annotations

import os
from pathlib import Path

from seedance_tasks.demo import DemoAirflow, DemoResult
from seedance_tasks.units import format_size


def demo(workspace: Path, airflow: DemoAirflow) -> DemoResult:
    """Train a tiny GPT with AdamW for 80 steps, checkpoint every 10, compress them via Airflow."""
    import torch

    from seedance_tasks import checkpoint
    from seedance_tasks.checkpoint.sample import train_tiny_gpt

    root = workspace / "checkpoints"
    inbox, store = root / "inbox", root / "store"
    run_name = "tiny-gpt"
    if checkpoint.latest_step(str(store), run_name) is None:
        (inbox / run_name).mkdir(parents=True, exist_ok=True)
        for step, state in train_tiny_gpt(range(0, 80, 10), width=128, layers=2, vocab=256):
            path = inbox / run_name / f"step-{step:06d}.pt"
            torch.save(state, path)
            os.utime(path, (path.stat().st_mtime - 3600,) * 2)
    dag_run = airflow.run(
        "seedance_checkpoints", {"inbox": str(inbox), "store": str(store), "min_age": "0", "purge_older_than": "7d"}
    )
    report = airflow.xcom(dag_run, "report") or {}
    latest = checkpoint.latest_step(str(store), run_name)
    restored = checkpoint.load(str(store), run_name, latest) if latest is not None else None
    stored = report.get("by_status", {}).get("stored", 0)
    did = (f"{stored} raw checkpoints -> delta-compressed store, verified, raw files retired"
           if stored else "inbox empty: checkpoints already stored")
    figures = []
    if stored:
        figures = [
            ("checkpoints (keyframe + deltas)", f"{stored}"),
            ("raw -> stored", f"{format_size(report['raw_bytes'])} -> {format_size(report['stored_bytes'])}"),
            ("ratio (lossless)", f"{report['ratio']:.3f}x"),
        ]
    if restored is not None:
        figures.append(("restored latest step (digest-verified)", f"{restored['step']}"))
    return DemoResult("checkpoint store", "seedance_checkpoints", dag_run.state, did, figures,
                      outputs=[str(store), str(inbox / "_seedance" / "trash")])
