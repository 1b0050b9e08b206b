"""The Seedance dashboard in Airflow's UI: cost, savings and data safety, server-rendered.

`sources` finds what to report on (configured and demo roots), `cost`, `savings` and `safety`
read what the pipelines wrote (never recomputing it), `airflow_runs` reads DAG runs and their
report XComs from the metadata DB (the plugin runs in the API server), `svg` draws the charts
(inline SVG: no script, no network) and `pages` lays out the HTML. `seedance_tasks.ui` serves it.
"""
