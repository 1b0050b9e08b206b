"""Demo: September 2024 of the FOCUS 1.0 sample charged back through the `seedance_cost_recovery` DAG."""

from __future__ import annotations

import shutil
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path

from seedance_tasks.demo import REPO, DemoAirflow, DemoResult

SAMPLE = REPO / "tests" / "data" / "cost" / "focus-1.0" / "focus_sample.csv"
IDLE = ["i-021f2ebl49063f9l1", "i-006flle71l19b488a"]  # two EC2 instances of the sample, made idle here
BUSY = ["i-0834le5b437l856a8"]


def make_inputs(folder: Path) -> dict[str, str]:
    """Billing sample, owners file (config/owners.yaml), usage files for the shared costs, utilization."""
    folder.mkdir(parents=True, exist_ok=True)
    billing = folder / "billing" / "focus_sample.csv"
    billing.parent.mkdir(exist_ok=True)
    shutil.copyfile(SAMPLE, billing)
    shutil.copyfile(REPO / "config" / "owners.yaml", folder / "owners.yaml")
    usage = folder / "usage"
    usage.mkdir(exist_ok=True)
    (usage / "ecs-2024-09.csv").write_text(
        "owner,partitions,bytes\nPeoriaData,12,700000000\nTempeAI,24,100000000\nLipaData,4,200000000\n")
    (usage / "lake-2024-09.csv").write_text(
        "owner,gb_months,last_access\nPeoriaData,1200,2024-09-28\nTempeAI,800,2024-08-02\nArchive,5000,2023-03-01\n")
    lines = ["resource_id,date,cpu_percent,network_in_bytes,network_out_bytes,gpu_percent,is_gpu,created,owner"]
    for offset in range(1, 8):
        day = (date(2024, 10, 1) - timedelta(days=offset)).isoformat()
        lines += [f"{resource},{day},1.2,0,0,,,2024-06-01," for resource in IDLE]
        lines += [f"{resource},{day},64,1000,2000,,,2024-06-01," for resource in BUSY]
    (folder / "utilization-2024-09.csv").write_text("\n".join(lines) + "\n")
    return {"billing": str(billing), "owners": str(folder / "owners.yaml"),
            "utilization": str(folder / "utilization-2024-09.csv"), "out": str(folder / "chargeback")}


def demo(workspace: Path, airflow: DemoAirflow) -> DemoResult:
    """Charge back 2024-09 of the FOCUS sample (dry-run actions) and report the reconciliation."""
    import json

    inputs = make_inputs(workspace / "cost")
    conf = {**inputs, "month": "2024-09", "basis": "BilledCost", "apply": False}
    dag_run = airflow.run("seedance_cost_recovery", conf)
    out = Path(inputs["out"]) / "month=2024-09"
    figures: list[tuple[str, str]] = []
    did = "no output"
    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
        usd = summary["currencies"]["USD"]
        owned = sum((Decimal(v) for v in usd["by_owner"].values()), Decimal(0))
        top = sorted(usd["by_owner"].items(), key=lambda kv: -Decimal(kv[1]))[:3]
        did = f"{summary['lines']:,} lines of 2024-09 -> {len(usd['by_owner'])} owners' statements"
        figures = [
            ("invoice total (BilledCost, USD)", usd["invoice_total"]),
            ("owners + unallocated == total", f"{owned} + {usd['unallocated']} == {usd['total']}"),
            ("top owners", ", ".join(f"{owner} {amount}" for owner, amount in top)),
            ("shared costs split", ", ".join(summary["shared"]) or "none"),
            ("tag conflicts / rejected rows", f"{summary['tag_conflicts']['count']} / {summary['rejected_count']}"),
            ("idle resources (dry-run tagging)", ", ".join(item["resource_id"] for item in summary["idle"])),
            ("over budget", ", ".join(f"{i['owner']} (+{i['over_percent']}%{', approved' if i['approved'] else ''})"
                                      for i in summary["over_budget"]) or "none"),
        ]
    return DemoResult("cost recovery", "seedance_cost_recovery", dag_run.state, did, figures,
                      outputs=[str(out / "report.html"), str(out / "statements")])
