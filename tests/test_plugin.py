"""The Seedance dashboard as a plugin of Airflow's API server (in process): loaded, behind Airflow's
login on every route, reading the configured roots or the demo workspace's, and saying what to
configure when there is none. The real-browser checks are in tests/dashboard/test_browser.py."""

import pytest

from seedance_tasks import storage
from tests.dashboard.conftest import build_chargeback

ROUTES = ("/seedance/", "/seedance/cost", "/seedance/savings", "/seedance/safety", "/seedance/api/status",
          "/seedance/cost/report?root=0&month=2024-09")


@pytest.fixture(scope="module")
def api_client(airflow_db):
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    return TestClient(create_app())


@pytest.fixture(scope="module")
def auth(api_client):
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="ADMIN"))
    return {"Authorization": f"Bearer {token}"}


def test_plugin_loads_without_errors(airflow_db):
    from airflow import plugins_manager

    plugins, errors = plugins_manager._get_plugins()
    assert not errors, errors
    seedance = [plugin for plugin in plugins if plugin.name == "seedance"]
    assert seedance and seedance[0].external_views[0]["destination"] == "nav"


def test_every_route_needs_a_logged_in_user(api_client):
    for route in ROUTES:
        assert api_client.get(route).status_code == 401, route
        assert api_client.get(route, headers={"Authorization": "Bearer forged"}).status_code in (401, 403), route
        assert api_client.get(route, headers={"Cookie": "_token=forged"}).status_code in (401, 403), route


def test_nothing_configured_says_what_to_configure(api_client, auth, monkeypatch):
    monkeypatch.delenv("SEEDANCE_WORKSPACE", raising=False)
    for route in ("/seedance/", "/seedance/cost", "/seedance/safety"):
        page = api_client.get(route, headers=auth)
        assert page.status_code == 200
        assert "configured" in page.text and "make demo" in page.text, route
    assert "cost.out_uri" in api_client.get("/seedance/cost", headers=auth).text


def test_the_demo_workspace_roots_are_shown(api_client, auth, tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    (lake / "p=1").mkdir(parents=True)
    (lake / "p=1" / "bad.parquet").write_text("<script>x</script>")
    storage.quarantine(storage.resolve(lake), "p=1/bad.parquet", "20261101T000000Z-abcdef", "not Parquet <b>")
    (tmp_path / "checkpoints" / "store").mkdir(parents=True)
    monkeypatch.setenv("SEEDANCE_WORKSPACE", str(tmp_path))
    page = api_client.get("/seedance/safety", headers=auth)
    assert page.status_code == 200
    assert str(lake) in page.text and str(tmp_path / "checkpoints" / "store") in page.text
    assert "demo workspace" in page.text and "not Parquet &lt;b&gt;" in page.text and "<b>" not in page.text
    overview = api_client.get("/seedance/", headers=auth).text
    assert str(tmp_path / "checkpoints" / "store") in overview and "No pipeline root configured" not in overview


def test_status_shows_quarantine_and_trash_of_the_configured_lake(api_client, auth, tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    (lake / "p=1").mkdir(parents=True)
    (lake / "p=1" / "old.parquet").write_bytes(b"x" * 100)
    storage.move_to_trash(storage.resolve(lake), "p=1/old.parquet", "20261102T000000Z-fedcba")
    monkeypatch.delenv("SEEDANCE_WORKSPACE", raising=False)
    monkeypatch.setenv("SEEDANCE__COMPACTION__DEFAULT_URI", str(lake))
    status = api_client.get("/seedance/api/status", headers=auth).json()
    assert [entry["origin"] for entry in status] == ["config: compaction.default_uri"]
    assert status[0]["trash"] == [{"run_id": "20261102T000000Z-fedcba", "files": 1, "bytes": 100}]
    assert status[0]["leases"] == [] and status[0]["quarantined"] == []


def test_a_bad_config_is_an_error_line_not_a_traceback(api_client, auth, monkeypatch):
    monkeypatch.setenv("SEEDANCE__COMPACTION__TARGET_FILE_SIZE", "lots")
    page = api_client.get("/seedance/safety", headers=auth)
    assert page.status_code == 200 and "error:" in page.text and "Traceback" not in page.text


def test_the_report_route_serves_only_configured_months(api_client, auth, tmp_path, monkeypatch):
    chargeback = build_chargeback(tmp_path)
    monkeypatch.delenv("SEEDANCE_WORKSPACE", raising=False)
    monkeypatch.setenv("SEEDANCE__COST__OUT_URI", chargeback["out"])
    page = api_client.get("/seedance/cost/report?root=0&month=2024-09", headers=auth)
    assert page.status_code == 200 and "Cost recovery &mdash; 2024-09" in page.text
    cost = api_client.get("/seedance/cost", headers=auth).text
    assert "cost/report?root=0&amp;month=2024-09" in cost
    for query in ("root=0&month=../../etc", "root=1&month=2024-09", "root=0&month=2031-01", "root=-1&month=2024-09"):
        assert api_client.get(f"/seedance/cost/report?{query}", headers=auth).status_code in (404, 422), query


def test_a_report_or_summary_behind_a_symlink_is_never_read(api_client, auth, tmp_path, monkeypatch):
    """Whoever can write the output root must not make the server show another file it can read."""
    chargeback = build_chargeback(tmp_path)
    secret = tmp_path / "secret.cfg"
    secret.write_text("sql_alchemy_conn = postgresql://airflow:s3cr3t@db/airflow\n")
    month = tmp_path / chargeback["out"] / "month=2024-09"
    (month / "report.html").unlink()
    (month / "report.html").symlink_to(secret)
    summary = month / "summary.json"
    saved = summary.read_text()
    summary.unlink()
    summary.symlink_to(secret)
    monkeypatch.delenv("SEEDANCE_WORKSPACE", raising=False)
    monkeypatch.setenv("SEEDANCE__COST__OUT_URI", chargeback["out"])
    page = api_client.get("/seedance/cost/report?root=0&month=2024-09", headers=auth)
    assert page.status_code == 404 and "s3cr3t" not in page.text and "symlink" in page.text
    cost = api_client.get("/seedance/cost", headers=auth)
    assert cost.status_code == 200 and "s3cr3t" not in cost.text
    assert "month=2024-09/summary.json: not shown" in cost.text and "is a symlink: not followed" in cost.text
    # a linked month folder is refused the same way; an oversized summary is not read whole
    summary.unlink()
    summary.write_text(saved)
    moved = tmp_path / "elsewhere"
    month.rename(moved)
    month.symlink_to(moved)
    assert api_client.get("/seedance/cost/report?root=0&month=2024-09", headers=auth).status_code == 404
    month.unlink()
    moved.rename(month)
    with summary.open("a") as handle:
        handle.truncate(17 * 1024**2)  # sparse: 17 MiB of NULs after the JSON
    assert "is larger than 16 MiB" in api_client.get("/seedance/cost", headers=auth).text


def test_the_training_and_findings_pages_and_odd_queries_are_refused_without_login_and_never_fail(
        api_client, auth, tmp_path, monkeypatch):
    monkeypatch.delenv("SEEDANCE_WORKSPACE", raising=False)
    monkeypatch.setenv("SEEDANCE__TRAINING__LOG_DIR", str(tmp_path))
    for route in ("/seedance/training", "/seedance/findings", "/seedance/training?run=x",
                  "/seedance/cost/report?root=0&month=../../etc"):
        assert api_client.get(route).status_code == 401, route
    odd = ("root=99999999999999999999999999&month=2024-09", f"root={'9' * 5000}&month=2024-09",
           "root=0&month=2024-09%00", "root=0&month=2024-09%E2%80%AE", "root=0&month=" + "1" * 10_000,
           "root=0&root=1&month=2024-09&month=../x", "root=1e9&month=2024-09", "month=2024-09")
    for query in odd:
        answer = api_client.get(f"/seedance/cost/report?{query}", headers=auth)
        assert answer.status_code in (404, 422), (query[:60], answer.status_code)
    for route in ("/seedance/training?page=-1&limit=99999999999999", "/seedance/?month=../../etc"):
        assert api_client.get(route, headers=auth).status_code == 200, route
