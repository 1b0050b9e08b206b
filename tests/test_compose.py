"""docker-compose.yaml cannot run here (no Docker engine): check the file's wiring by reading it."""

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
AIRFLOW_SERVICES = {
    "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-worker", "airflow-triggerer",
    "airflow-init",
}


def _compose():
    return yaml.safe_load((REPO / "docker-compose.yaml").read_text())


def test_services_present():
    services = set(_compose()["services"])
    assert AIRFLOW_SERVICES | {"postgres", "redis", "minio"} <= services


def test_airflow_services_share_secrets_and_use_celery_on_postgres_and_redis():
    services = _compose()["services"]
    for name in AIRFLOW_SERVICES:
        env = services[name]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == "${AIRFLOW_JWT_SECRET:?set AIRFLOW_JWT_SECRET in .env}", name
        assert env["AIRFLOW__CORE__FERNET_KEY"].startswith("${AIRFLOW_FERNET_KEY"), name
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://"), name
        assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://"), name
        assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "false", name
        assert services[name]["build"] == "." and services[name]["image"] == "seedance-airflow:latest"
        mounts = {volume.split(":")[1] for volume in services[name]["volumes"]}
        assert {"/opt/airflow/dags", "/opt/airflow/plugins"} <= mounts, name


def test_no_secret_literals():
    text = (REPO / "docker-compose.yaml").read_text()
    for key in ("JWT_SECRET:", "FERNET_KEY:", "POSTGRES_PASSWORD:", "AWS_SECRET_ACCESS_KEY:"):
        for line in text.splitlines():
            if key in line and "${" not in line and not line.strip().startswith("#"):
                raise AssertionError(f"literal secret in docker-compose.yaml: {line.strip()}")


def test_image_installs_the_pinned_requirements_and_the_library():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "FROM apache/airflow:3.3.2" in dockerfile
    assert "pip install --no-cache-dir -r /opt/seedance/requirements.txt" in dockerfile
    assert "COPY --chown=airflow:root seedance_tasks" in dockerfile
    requirements = (REPO / "requirements.txt").read_text().splitlines()
    pins = [line for line in requirements if line and not line.startswith("#")]
    assert all("==" in line for line in pins), [line for line in pins if "==" not in line]
    assert "apache-airflow==3.3.2" in pins and "torch==2.13.0" in pins
    assert any(line.startswith("apache-airflow-providers-celery==") for line in pins)
