"""The Assets of the cost pipeline, shared by the DAGs that emit and consume them (cheap to import)."""

from __future__ import annotations

from airflow.sdk import Asset

COST_STATEMENTS = Asset(name="seedance_cost_statements", uri="seedance://cost/statements")
"""A closed month's published chargeback; extra: month, basis, totals, unallocated, URIs (`out`, `summary`)."""
