"""The task functions of DAG `seedance_checkpoints` (dags/seedance_checkpoints.py): thin, JSON in/out."""

from __future__ import annotations

from typing import Any

from seedance_tasks.dag_support import fail_fast
from seedance_tasks.errors import UsageError


def _settings(params: dict | None):
    from seedance_tasks.config import load_settings, settings_with

    params = params or {}
    overrides = {
        "store": params.get("store") or None,
        "inbox": params.get("inbox") or None,
        "inbox_min_age": params.get("min_age") or None,
    }
    settings = settings_with(load_settings(), "checkpoint", **overrides)
    if not settings.inbox or not settings.store:
        raise UsageError(
            "the checkpoint DAG needs an inbox and a store",
            hint="pass inbox/store in the run's parameters or set checkpoint.inbox/checkpoint.store in config",
        )
    return settings


@fail_fast
def scan_task(params: dict | None) -> dict[str, Any]:
    """List the inbox files ready to compress (mapped over by `ingest`)."""
    from seedance_tasks.checkpoint import ingest

    settings = _settings(params)
    found = ingest.scan(settings.inbox, settings.inbox_min_age)
    return {"items": found["ready"], "skipped": found["skipped"], "inbox": settings.inbox, "store": settings.store}


@fail_fast
def ingest_task(item: dict, params: dict | None, run_id: str | None = None) -> dict[str, Any]:
    """Compress one raw checkpoint into the store, verify it, retire the raw file.

    Holds the run's lease as the DAG run (`dag_support.airflow_lease_holder`), so a retry of this
    task takes it back and finishes what its first attempt left.
    """
    from seedance_tasks.checkpoint import ingest
    from seedance_tasks.dag_support import airflow_lease_holder

    params = params or {}
    settings = _settings(params)
    lossy = params.get("lossy") or None
    return ingest.ingest_one(
        item, settings.inbox, settings.store, settings, run_id=run_id, holder=airflow_lease_holder(),
        codec=params.get("codec") or None, keyframe_every=params.get("keyframe_every") or None,
        lossy=None if lossy == "none" else lossy,
    )


@fail_fast
def report_task(scanned: dict, results: list[dict]) -> dict[str, Any]:
    """One summary for the run: counts by status, bytes, ratio, problems (quarantined, conflicts)."""
    from seedance_tasks.checkpoint import ingest

    summary = ingest.report(list(results))
    summary["skipped"] = scanned.get("skipped", [])
    summary["store"] = scanned.get("store")
    return summary


@fail_fast
def purge_task(params: dict | None) -> dict[str, Any]:
    """Free the inbox trash (retired raw checkpoints) older than `purge_older_than`."""
    from seedance_tasks import journal, storage
    from seedance_tasks.units import parse_duration

    params = params or {}
    settings = _settings(params)
    return journal.purge_trash(storage.resolve(settings.inbox), parse_duration(params.get("purge_older_than") or "7d"))
