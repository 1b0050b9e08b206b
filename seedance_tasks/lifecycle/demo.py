"""Demo: a GC and a tiering pass through `seedance_checkpoint_lifecycle`, with bytes and dollars saved.

Works on a copy of the store the checkpoint demo leaves in the workspace (or, without it, on a
small store of its own from a tiny GPT trained on CPU), so the checkpoint demo's store is left
as it was. Tiers are local folders beside the copy: hot is priced as local SSD, warm as S3
Standard-IA, cold as S3 Glacier Instant Retrieval.
"""

from __future__ import annotations

import shutil
from decimal import Decimal
from pathlib import Path

from seedance_tasks.demo import DemoAirflow, DemoResult, environment
from seedance_tasks.units import format_size

RUN = "tiny-gpt"


def _store(workspace: Path) -> Path:
    root = workspace / "lifecycle"
    if root.exists():
        shutil.rmtree(root)
    store = root / "store"
    source = workspace / "checkpoints" / "store"
    if (source / RUN).is_dir():
        shutil.copytree(source, store, ignore=shutil.ignore_patterns("_seedance"))
        return store
    from seedance_tasks import checkpoint
    from seedance_tasks.checkpoint.sample import train_tiny_gpt

    for step, state in train_tiny_gpt(range(0, 80, 10), width=128, layers=2, vocab=256):
        checkpoint.save(state, str(store), RUN, step, metrics={"val_loss": state["loss"]})
    return store


def demo(workspace: Path, airflow: DemoAirflow) -> DemoResult:
    """GC (keep the last 2 and every 40th step) then tiering of the rest, applied, through Airflow."""
    store = _store(workspace)
    overrides = {
        "SEEDANCE__LIFECYCLE__TIERS__HOT__PRICE_CLASS": "LOCAL_SSD",
        "SEEDANCE__LIFECYCLE__TIERS__WARM__URI": str(store.parent / "warm"),
        "SEEDANCE__LIFECYCLE__TIERS__COLD__URI": str(store.parent / "cold"),
        "SEEDANCE__LIFECYCLE__TIERS__WARM_AFTER": "0",  # demo: every checkpoint is old enough to move;
        "SEEDANCE__LIFECYCLE__TIERS__COLD_AFTER": "1s",  # the latest stays hot (keep_latest_hot)
    }
    with environment(overrides):  # the tier locations stay configured while the demo restores from them
        dag_run = airflow.run("seedance_checkpoint_lifecycle", {
            "store": str(store), "run": RUN, "apply": True, "keep_last": 2, "keep_every": 40, "purge_older_than": "0",
        })
        report = airflow.xcom(dag_run, "report") or {}
        figures = _figures(report, store)
    did = (f"GC deleted {report.get('deleted', 0)} checkpoint(s), tiering moved {report.get('moved', 0)}"
           if report else "no report")
    return DemoResult("checkpoint lifecycle", "seedance_checkpoint_lifecycle", dag_run.state, did, figures,
                      outputs=[str(store), str(store.parent / "warm"), str(store.parent / "cold")])


def _figures(report: dict, store: Path) -> list[tuple[str, str]]:
    """The lifecycle report's before/after figures, and a verified restore of the latest kept step."""
    from seedance_tasks import checkpoint, storage
    from seedance_tasks.checkpoint.store import committed_steps
    from seedance_tasks.lifecycle.costs import shown

    if not report:
        return []
    run = report["runs"][0]
    before, after = Decimal(report["monthly_usd_before"]), Decimal(report["monthly_usd_after"])
    gc_before = run["gc_cost"]["before"]
    tiers = run["cost"]["after"]["tiers"]
    kept = committed_steps(storage.resolve(store), RUN)
    restored = checkpoint.load(str(store), RUN, kept[-1])
    return [
        ("checkpoints before -> after GC", f"{gc_before['checkpoints']} -> {len(kept)} (kept steps {kept})"),
        ("stored bytes before -> after", f"{format_size(gc_before['bytes'])} -> {format_size(run['cost']['after']['bytes'])}"),
        ("freed by GC (trash purged)", format_size(report["bytes_freed"])),
        ("moved to warm / cold", f"{run['moved'].get('warm', 0)} / {run['moved'].get('cold', 0)}"),
        ("bytes per tier (hot/warm/cold)", " / ".join(format_size(tiers[t]["bytes"]) for t in ("hot", "warm", "cold"))),
        ("monthly cost before -> after", f"{shown(before)} -> {shown(after)}"
                                          + (f" (-{(before - after) / before:.0%})" if before else "")),
        ("restored latest step after tiering", f"{restored['step']} (sha256-verified)"),
    ]
