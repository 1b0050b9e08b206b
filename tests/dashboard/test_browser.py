"""The dashboard in a real browser: Airflow's API server with the plugin, a login, headless Chromium.

The API server runs as its own process on this session's Airflow home (so it sees the DAG runs
this test makes); the test logs in with the simple auth manager's generated password, hands the
JWT to Chromium as Airflow's `_token` cookie and loads every page. Screenshots go to
tests/_artifacts/ (git-ignored).
"""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from decimal import Decimal
from pathlib import Path

import pytest

from tests.airflow_services import AirflowServices, admin_token, free_port
from tests.browser_support import Browser, chromium, dump_dom
from tests.dashboard.conftest import HOSTILE, MONTHS, NIGHTS, RUN_NAMES, Cells, expected_cost_cells

pytestmark = pytest.mark.skipif(chromium() is None, reason="no chromium: apt-get install -y chromium (make test does)")

PAGES = {"overview": "/seedance/", "cost": "/seedance/cost", "savings": "/seedance/savings",
         "training": "/seedance/training", "findings": "/seedance/findings",
         "safety": "/seedance/safety", "report": "/seedance/cost/report?root=0&month=2024-09"}


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory, airflow_db, dagbag, chargeback, training_logs, findings_root):
    """A compacted lake (a real DAG run: its report is the savings), a quarantined file, a lease, training
    telemetry and two audited nights; the API server."""
    from seedance_tasks import lease, storage
    from seedance_tasks.compaction.sample import make_sample_lake
    from tests.conftest import xcom_value

    home = tmp_path_factory.mktemp("dashboard-api")
    lake = home / "lake"
    make_sample_lake(str(lake), partitions=2, files_per_partition=4, rows_per_file=300)
    assert not dagbag.import_errors, dagbag.import_errors
    dag_run = dagbag.dags["seedance_compaction"].test(
        run_conf={"uri": str(lake), "target_file_size": "16MiB", "min_age": "0"})
    assert dag_run.state == "success"
    report = xcom_value(dag_run, "report")
    root = storage.resolve(lake)
    (lake / "p=bad").mkdir()
    (lake / "p=bad" / "x.parquet").write_text("not parquet")
    storage.quarantine(root, "p=bad/x.parquet", "20261101T000000Z-abcdef", f"unreadable, owner {HOSTILE[1]}")
    lease.acquire(root, "dataset", holder="test:dashboard", purpose="browser test", ttl_s=3600)

    port = free_port()
    env = {**os.environ, "SEEDANCE__COST__OUT_URI": chargeback["out"], "SEEDANCE__COMPACTION__DEFAULT_URI": str(lake),
           "SEEDANCE__TRAINING__LOG_DIR": training_logs["root"], "SEEDANCE__SIGNALS__ROOT": findings_root["root"]}
    env.pop("SEEDANCE_WORKSPACE", None)
    services = AirflowServices(home, env)
    browser = None
    try:
        services.start("api-server", "api-server", "--port", str(port))
        services.wait_healthy(port)
        token = admin_token(airflow_db, port)
        browser = Browser()
        base = f"http://127.0.0.1:{port}"
        cookie = [{"name": "_token", "value": token, "url": base + "/"}]
        pages = {}
        for name, path in PAGES.items():
            pages[name] = browser.open(base + path, cookies=cookie)
            pages[name].save(f"dashboard-{name}")
        yield {"base": base, "pages": pages, "report": report, "dag_run": dag_run, "lake": lake, "browser": browser,
               "token": token}
    finally:
        if browser:
            browser.close()
        services.stop()


def test_every_page_loads_logged_in_with_no_script_and_saves_a_screenshot(dashboard):
    for name, page in dashboard["pages"].items():
        assert "Not authenticated" not in page.facts["text"], name
        assert page.facts["scripts"] == 0 and page.facts["images"] == 0 and page.facts["handlers"] == 0, name
        assert page.png.startswith(b"\x89PNG") and len(page.png) > 5000, name
    assert dashboard["pages"]["cost"].facts["title"] == "Seedance — Cost recovery"
    assert "Cost recovery — 2024-09" in dashboard["pages"]["report"].facts["text"]


def test_cost_figures_match_the_published_months_to_the_cent(dashboard, chargeback):
    page = dashboard["pages"]["cost"]
    cells = Cells(page.html)
    expected = expected_cost_cells(chargeback["summaries"])
    assert len(expected) > 6
    for (owner, month), text in expected.items():
        assert cells.get(owner=owner, month=month) == text, (owner, month)
    over = chargeback["summaries"]["2024-09"]["over_budget"]
    assert over and cells.get(owner=over[0]["owner"]) == f"{Decimal(over[0]['spend']):,.2f} USD"
    for item in chargeback["summaries"]["2024-09"]["idle"]:
        assert item["resource_id"] in page.facts["text"]
    assert "2024-08 – 2024-09" in page.facts["text"] and "movers against the previous month" in page.facts["text"]


def test_hostile_owner_names_are_shown_as_text_never_run(dashboard):
    for name in ("cost", "report"):
        page = dashboard["pages"][name]
        for owner in HOSTILE:
            assert owner in page.facts["text"], (name, owner)
        assert page.facts["scripts"] == 0 and page.facts["images"] == 0 and page.facts["handlers"] == 0
    negative = Cells(dashboard["pages"]["cost"].html).get(owner=HOSTILE[1], month=MONTHS[1])
    assert negative == "-4.13 USD"  # -4.125 rounded half-up to the cent, a negative owner shown


def test_savings_come_from_the_compaction_runs_report(dashboard):
    """The month's row sums the reports of every compaction run that ended in it (other test files in
    this worker may have run the DAG too): read here from the runs' XComs, not through the dashboard."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from seedance_tasks.dag_support import read_xcom

    report, dag_run = dashboard["report"], dashboard["dag_run"]
    page = dashboard["pages"]["savings"]
    month = dag_run.end_date.strftime("%Y-%m")
    assert report["partitions_compacted"] == 2
    with create_session() as session:
        runs = [run for run in session.query(DagRun).filter(DagRun.dag_id == "seedance_compaction")
                if run.end_date is not None and run.end_date.strftime("%Y-%m") == month]
        session.expunge_all()
    savings = [found["estimated_monthly_saving"] for run in runs
               if (found := read_xcom(run, "report")) and not found.get("dry_run") and found.get("partitions_compacted")]
    assert report["estimated_monthly_saving"] in savings
    usd = sum(Decimal(saving["usd"]) for saving in savings)
    requests = sum(saving["s3_requests"] for saving in savings)
    cells = Cells(page.html)
    assert cells.get(pipeline="compaction", month=month) == f"{usd:,.2f} USD"
    assert f"{requests:,}" in page.facts["text"]


def test_data_safety_shows_quarantine_lease_and_the_last_runs(dashboard):
    text = dashboard["pages"]["safety"].facts["text"]
    assert f"unreadable, owner {HOSTILE[1]}" in text and "p=bad/x.parquet" in text
    assert "test:dashboard" in text and "browser test" in text
    assert dashboard["dag_run"].run_id in text and "success" in text


def test_training_shows_each_runs_cost_to_the_cent_its_energy_source_and_the_hostile_run_as_text(
        dashboard, training_logs):
    from seedance_tasks.dashboard.svg import money
    from seedance_tasks.telemetry.samples import summarise

    page = dashboard["pages"]["training"]
    cells = Cells(page.html)
    for name, folder in training_logs["folders"].items():
        summary = summarise(folder / "telemetry")  # what the training DAG's summary reports
        assert cells.get(run=name, figure="cost") == money(training_logs["cost"][name], "USD")
        assert cells.get(run=name, figure="cost") == money(summary["cost_usd"], "USD")
        assert cells.get(run=name, figure="per-1000-steps") == money(summary["usd_per_1000_steps"], "USD")
    assert RUN_NAMES[0] in page.facts["text"] and HOSTILE[1] in page.facts["text"]  # run label, folder name
    assert "estimated (TDP x utilisation, not measured)" in page.facts["text"] and "rapl (measured)" in page.facts["text"]
    assert "cost so far over steps" in page.facts["text"] and "<polyline" in page.html
    overview = dashboard["pages"]["overview"].facts["text"]
    total = sum(training_logs["cost"].values(), Decimal(0))
    assert "Training cost so far (USD, 2 runs)" in overview and money(total, "USD") in overview


def test_open_findings_show_money_at_stake_to_the_cent_the_fix_and_the_hostile_key_as_text(dashboard, findings_root):
    from seedance_tasks.dashboard.svg import money

    page = dashboard["pages"]["findings"]
    cells = Cells(page.html)
    night = findings_root["nights"][NIGHTS[-1]]
    written = [f for signal in night["signals"] for f in signal["findings"]]
    assert len(written) >= 2
    for finding in written:
        assert cells.get(finding=finding["id"]) == money(Decimal(finding["at_stake"]), finding["currency"])
    surge = f"cost-surge:owner={HOSTILE[0]}"
    assert surge in page.facts["text"] and "seedance_cost_recovery" in page.facts["text"]
    assert NIGHTS[0] in page.facts["text"]  # first seen the night before
    assert f"Open cost findings\n{len(written)}" in dashboard["pages"]["overview"].facts["text"]


def test_a_request_without_login_is_refused(dashboard):
    for path in PAGES.values():
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(dashboard["base"] + path, timeout=30)
        assert refused.value.code == 401
    dom = dump_dom(dashboard["base"] + PAGES["cost"])
    assert "Not authenticated" in dom and "PeoriaData" not in dom


def test_every_response_forbids_script_and_a_planted_report_html_runs_none(dashboard, chargeback):
    """report.html is a file of the output root, served as it is: one planted there with a script and
    an onerror handler is shown, sandboxed, and runs neither (Content-Security-Policy)."""
    from seedance_tasks.ui import PAGE_POLICY, REPORT_POLICY

    folder = Path(chargeback["out"]) / "month=2001-01"  # no summary.json: no month of the cost page
    folder.mkdir()
    (folder / "report.html").write_text("<!doctype html><title>planted</title><p>planted report</p>"
                                        "<script>document.title='ran'</script><img src=x onerror=\"document.title='ran'\">")
    path = "/seedance/cost/report?root=0&month=2001-01"
    try:
        page = dashboard["browser"].open(dashboard["base"] + path,
                                         cookies=[{"name": "_token", "value": dashboard["token"], "url": dashboard["base"] + "/"}])
        policies = {}
        for name in (*PAGES.values(), path):
            request = urllib.request.Request(dashboard["base"] + name, headers={"Cookie": f"_token={dashboard['token']}"})
            with urllib.request.urlopen(request, timeout=30) as response:
                policies[name] = response.headers["Content-Security-Policy"]
    finally:
        shutil.rmtree(folder)
    assert "planted report" in page.facts["text"] and page.facts["title"] == "planted"  # shown, nothing ran
    assert policies.pop(path) == REPORT_POLICY and policies.pop(PAGES["report"]) == REPORT_POLICY
    assert set(policies.values()) == {PAGE_POLICY}
