"""The Seedance page in Airflow's UI: loaded as a plugin, behind Airflow's login, showing the
quarantine and trash of the configured dataset."""

import pytest

from seedance_tasks import storage


@pytest.fixture(scope="module")
def api_client(airflow_db):
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    return TestClient(create_app())


def test_plugin_loads_without_errors(airflow_db):
    from airflow import plugins_manager

    plugins, errors = plugins_manager._get_plugins()
    assert not errors, errors
    assert "seedance" in [plugin.name for plugin in plugins]


def test_page_needs_a_logged_in_user(api_client):
    assert api_client.get("/seedance/").status_code == 401
    assert api_client.get("/seedance/", headers={"Authorization": "Bearer forged"}).status_code in (401, 403)


def test_page_shows_quarantine_and_trash(api_client, tmp_path, monkeypatch):
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    lake = tmp_path / "lake"
    (lake / "p=1").mkdir(parents=True)
    (lake / "p=1" / "bad.parquet").write_text("<script>x</script>")
    root = storage.resolve(lake)
    storage.quarantine(root, "p=1/bad.parquet", "20261101T000000Z-abcdef", "not a readable Parquet file <b>")
    (lake / "p=1" / "old.parquet").write_bytes(b"x" * 100)
    storage.move_to_trash(root, "p=1/old.parquet", "20261102T000000Z-fedcba")
    monkeypatch.setenv("SEEDANCE__COMPACTION__DEFAULT_URI", str(lake))

    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="ADMIN"))
    page = api_client.get("/seedance/", headers={"Authorization": f"Bearer {token}"})
    assert page.status_code == 200
    assert "p=1/bad.parquet" in page.text and "not a readable Parquet file &lt;b&gt;" in page.text
    assert "20261102T000000Z-fedcba" in page.text and "<b>" not in page.text
    status = api_client.get("/seedance/api/status", headers={"Authorization": f"Bearer {token}"}).json()
    assert status[0]["trash"] == [{"run_id": "20261102T000000Z-fedcba", "files": 1, "bytes": 100}]
