"""What every Seedance DAG file shares. Cheap to import: DAG files are parsed all the time."""

from __future__ import annotations

from datetime import timedelta

DEFAULT_ARGS = {
    "owner": "seedance",
    "retries": 2,
    "retry_delay": timedelta(minutes=2),
    "retry_exponential_backoff": True,
}


def tags(*area: str) -> list[str]:
    """The tags of a Seedance DAG: `seedance` plus its area(s)."""
    return ["seedance", *area]
