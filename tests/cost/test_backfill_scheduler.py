"""`airflow backfill create` for real: a scheduler and an API server (LocalExecutor, SQLite) in
their own Airflow home run three past months of the cost DAG; each month's outputs are checked.

Slow (about a minute and a half on two cores): it starts real Airflow services as subprocesses.
"""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from pathlib import Path

import pytest

from tests.airflow_services import AirflowServices, free_port, standalone_env
from tests.cost.helpers import three_months

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "seedance_cost_recovery"


@pytest.mark.slow
def test_airflow_backfill_create_runs_three_past_months(tmp_path):
    billing, owners = three_months(tmp_path)
    out = tmp_path / "out"
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(REPO / "dags" / "seedance_cost_recovery.py", dags)
    home = tmp_path / "airflow"
    port = free_port()
    env = standalone_env(home, dags, port)
    env.update({
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",  # a paused DAG's backfill runs stay queued
        # the regular run that unpausing creates (the latest month) needs these defaults
        "SEEDANCE__COST__BILLING_URI": str(billing), "SEEDANCE__COST__OWNERS_FILE": str(owners),
        "SEEDANCE__COST__OUT_URI": str(out),
    })
    home.mkdir()
    services = AirflowServices(home, env)
    services.airflow("db", "migrate")
    services.airflow("dags", "reserialize")
    conf = json.dumps({"billing": str(billing), "owners": str(owners), "out": str(out), "apply": True})
    # created before the services start: SQLite takes one writer at a time
    services.airflow("backfill", "create", "--dag-id", DAG_ID, "--from-date", "2024-07-01",
             "--to-date", "2024-09-30", "--dag-run-conf", conf)
    try:
        services.start("api-server", "api-server")  # tasks report to the API server: it must be up first
        services.wait_healthy(port)
        services.start("scheduler", "scheduler")
        summaries = [out / f"month={month}" / "summary.json" for month in ("2024-07", "2024-08", "2024-09")]
        # files, not the DB: no lock contention
        services.wait_until(lambda: all(path.exists() for path in summaries), 300,
                            "the backfill to publish three months")

        def finished_backfills():
            try:  # list-runs may meet a locked SQLite DB: try again
                runs = services.json("dags", "list-runs", DAG_ID)
            except RuntimeError:
                return None
            found = [run for run in runs if run["run_id"].startswith("backfill__")]
            return found if len(found) == 3 and all(run["state"] in ("success", "failed") for run in found) else None

        backfills = services.wait_until(finished_backfills, 300, "the backfill runs to finish")
    finally:
        services.stop()
    assert sorted(run["logical_date"][:7] for run in backfills) == ["2024-07", "2024-08", "2024-09"]
    assert {run["state"] for run in backfills} == {"success"}, backfills
    for month, alpha in (("2024-07", "10.5"), ("2024-08", "20.25"), ("2024-09", "30.125")):
        usd = json.loads((out / f"month={month}" / "summary.json").read_text())["currencies"]["USD"]
        assert usd["by_owner"] == {"alpha": alpha, "beta": "5"}
        assert sum(map(Decimal, usd["by_owner"].values())) + Decimal(usd["unallocated"]) == Decimal(usd["total"])
    state = out / "_seedance" / "cost"  # over budget every month, apply=true: a backfill still never acts
    assert not (state / "quota-ledger.json").exists() and not (state / "outbox.jsonl").exists()
