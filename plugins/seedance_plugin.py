"""Airflow plugin: the Seedance dashboard (cost, savings, training, findings, data safety) in the UI; see seedance_tasks/ui.py."""

from airflow.plugins_manager import AirflowPlugin

from seedance_tasks.ui import create_app


class SeedancePlugin(AirflowPlugin):
    name = "seedance"
    fastapi_apps = [{"app": create_app(), "url_prefix": "/seedance", "name": "Seedance"}]
    external_views = [
        {"name": "Seedance", "href": "seedance/", "url_route": "seedance", "destination": "nav", "category": "browse"}
    ]
