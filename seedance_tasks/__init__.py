"""Seedance: the library behind the Airflow pipelines and the `seedance` command.

Every job is importable and runs without Airflow; the DAG files in `dags/` only wire these
functions into tasks.
"""

__version__ = "0.1.0"
