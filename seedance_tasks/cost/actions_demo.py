"""Demo: the cost actions workflow (`seedance_cost_actions`) as a dry run over the month the cost
demo charged back: the deadlines from the working-day calendar, the isolations and the deductions
it would make. A dry run asks nobody, waits for nothing and changes nothing outside the outputs."""

from __future__ import annotations

from seedance_tasks.cost.demo import make_inputs
from seedance_tasks.demo import DemoAirflow, DemoResult

MONTH = "2024-09"


def demo(workspace, airflow: DemoAirflow) -> DemoResult:
    """Plan the actions on 2024-09 of the cost demo's chargeback (dry run) and report the plan."""
    inputs = make_inputs(workspace / "cost")
    conf = {"month": MONTH, "out": inputs["out"], "owners": inputs["owners"], "apply": False}
    dag_run = airflow.run("seedance_cost_actions", conf)
    plan = airflow.xcom(dag_run, "plan") or {}
    isolate = airflow.xcom(dag_run, "isolate") or {}
    settle = airflow.xcom(dag_run, "settle") or {}
    deadlines = plan.get("deadlines", {})
    planned = settle.get("planned", [])
    figures = [
        ("deadlines", f"isolate by {deadlines.get('isolate_by', '?')[:10]}, confirm by "
                      f"{deadlines.get('confirm_by', '?')[:10]}, deduct on {deadlines.get('deduct_day', '?')}"),
        ("idle resources", f"{len(isolate.get('planned', []))} to isolate, {len(isolate.get('skipped', []))} skipped "
                           "(not EC2/EBS/RDS ids), " f"{len(isolate.get('flagged', []))} flagged (too young)"),
        ("deductions if confirmed", f"{len(planned)} owners" + (f", e.g. {planned[0]}" if planned else "")),
    ]
    did = f"dry run of {MONTH}: nothing isolated, nobody asked, nothing deducted"
    return DemoResult("cost actions", "seedance_cost_actions", dag_run.state, did, figures,
                      outputs=[inputs["out"]])
