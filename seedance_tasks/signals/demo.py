"""Demo: tonight's audit through `seedance_signals` over inputs built in the workspace, then the
fixes its Asset events name, run as the scheduler would run them (dry runs).

The inputs are generated for the 8 weeks before tonight so that some signals fire: FOCUS lines
made from rows of the FinOps sample (data transfer out up 60% with requests flat, an untagged
share of the month, a compute surge on the night), a lake of small Parquet files (aged 2 days),
a checkpoint store of tiny tensors keeping more checkpoints than the demo's policy (4 a run), and
DCGM samples where a job's GPU utilisation drops for two hours tonight. The rest of the rules say
why they are skipped, and `metrics-blind-spot` names the metrics the source lacks.
"""

from __future__ import annotations

import os
import shutil
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from seedance_tasks.demo import DemoAirflow, DemoResult, environment

POLICY = {"SEEDANCE__SIGNALS__CHECKPOINT_MAX_PER_RUN": "4"}  # the demo's store keeps 6
FIX_TASKS = ("fix_small_files", "fix_checkpoint_bloat")


def _billing(folder: Path, night: date) -> str:
    from seedance_tasks.signals.sample import focus_file, template

    egress = {**template("data transfer out"), "Tags": '{"owner": "PeoriaData"}'}
    requests = {**template("SQS standard requests"), "Tags": '{"owner": "PeoriaData"}'}
    compute = {**template("Instance Hour"), "Tags": '{"owner": "TempeAI"}'}
    untagged = {**template("Instance Hour"), "Tags": "NULL", "ResourceId": "i-0untagged"}
    lines = []
    for back in range(55, -1, -1):
        day = night - timedelta(days=back)
        lines += [(egress, day, "160" if back < 28 else "100", 900), (requests, day, "1", 5000),
                  (compute, day, "480" if back == 0 else ("298" if back % 2 else "302"), 24),
                  (untagged, day, "40", 24)]
    return focus_file(folder / "billing" / "focus.csv", lines)


def _lake(folder: Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    lake = folder / "lake" / "events"
    two_days_ago = (datetime.now(UTC) - timedelta(days=2)).timestamp()
    for part in range(12):
        path = lake / f"date=2024-10-{part + 1:02d}" / "part-0.parquet"
        path.parent.mkdir(parents=True)
        pq.write_table(pa.table({"id": range(part * 500, part * 500 + 500), "v": [float(part)] * 500}), path)
        os.utime(path, (two_days_ago, two_days_ago))  # older than compaction's min_age
    return str(lake)


def _checkpoints(folder: Path) -> str:
    import torch

    from seedance_tasks import checkpoint

    store = folder / "checkpoints"
    for step in range(0, 60, 10):
        weights = torch.linspace(0, 1, 4096).reshape(64, 64) + step * 1e-3
        checkpoint.save({"model": {"w": weights}, "step": step}, str(store), "tiny-gpt", step, cache_base=False)
    return str(store)


def _metrics(folder: Path, night: date) -> str:
    from seedance_tasks.signals.sample import samples_file

    first = datetime(night.year, night.month, night.day, tzinfo=UTC) - timedelta(days=7)
    dip = range(7 * 288 + 24, 7 * 288 + 48)  # tonight 02:00-04:00
    series = []
    for gpu in range(2):
        labels = {"job": "llama-7b", "gpu": str(gpu), "UUID": f"GPU-{gpu}"}
        series.append(("DCGM_FI_DEV_GPU_UTIL", labels,
                       [(first.timestamp() + i * 300, 25 if i in dip else 85) for i in range(8 * 288)]))
        series.append(("DCGM_FI_DEV_FB_USED", labels, [(first.timestamp() + i * 300, 40000) for i in range(8 * 288)]))
    return samples_file(folder / "metrics" / "dcgm.parquet", series)


def demo(workspace: Path, airflow: DemoAirflow) -> DemoResult:
    """Tonight's audit through Airflow, then each fix its Asset events carry."""
    import json

    from seedance_tasks.cost.money import display

    folder = workspace / "signals"
    if folder.exists():  # a fresh ledger each time: the demo announces and triggers again
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    night = datetime.now(UTC).date()
    conf = {"date": night.isoformat(), "billing": _billing(folder, night), "lakes": [_lake(folder)],
            "checkpoints": _checkpoints(folder), "metrics": _metrics(folder, night), "out": str(folder / "out")}
    with environment(POLICY):
        dag_run = airflow.run("seedance_signals", conf)
        summary = airflow.xcom(dag_run, "publish") or {}
        events = [airflow.xcom(dag_run, task) for task in FIX_TASKS]
        triggered = []
        for event in filter(None, events):
            for target in event["targets"]:
                fixed = airflow.run(target["dag_id"], target["conf"])
                triggered.append((event["signal"], target, fixed.state))
    figures: list[tuple[str, str]] = []
    did = "no report"
    if summary:
        document = json.loads((folder / "out" / "nights" / night.isoformat() / "findings.json").read_text())
        findings = [f for signal in document["signals"] for f in signal["findings"]]
        did = (f"night {night}: {len(summary['fired'])} of {len(document['signals'])} signals fired, "
               f"{len(findings)} findings, {len(triggered)} fix(es) triggered")
        for signal in document["signals"]:
            if not signal["findings"]:
                continue
            items = signal["findings"]
            if signal["id"] == "metrics-blind-spot":
                text = "cannot see what " + ", ".join(f["key"] for f in items) + " need"
            else:
                stake = sum(Decimal(f["at_stake"]) for f in items)
                more = f" (and {len(items) - 1} more)" if len(items) > 1 else ""
                text = f"{items[0]['summary']}{more}; at stake {display(stake, items[0]['currency'])}/month"
            figures.append((f"fired: {signal['id']} ({len(items)})", text))
        for signal, target, state in triggered:
            dry = target["conf"].get("dry_run") or target["conf"].get("apply") is False
            figures.append((f"triggered by {signal}",
                            f"{target['dag_id']} ({'dry run' if dry else 'applied'}) on {target['key']}: {state}"))
        skipped = summary.get("skipped", {})
        if skipped:
            figures.append(("skipped (inputs missing)", ", ".join(sorted(skipped))))
        outputs = list(summary["outputs"].values())
    else:
        outputs = [str(folder / "out")]
    ok = dag_run.state == "success" and all(state == "success" for *_, state in triggered)
    return DemoResult("cost signals", "seedance_signals", "success" if ok else "failed", did, figures, outputs)
