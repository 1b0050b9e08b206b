"""The task functions of DAG `seedance_checkpoints` (dags/seedance_checkpoints.py): thin, JSON in/out."""

from __future__ import annotations

import json
import logging
from typing import Any

from seedance_tasks.dag_support import fail_fast, run_settings, skip

log = logging.getLogger(__name__)
SHOWN = 50
"""Items of a list an XCom carries at most (a summary); the full list goes to the task log."""

SETTINGS_PARAMS = {"store": "store", "inbox": "inbox", "min_age": "inbox_min_age", "codec": "codec",
                   "keyframe_every": "keyframe_every"}
"""DAG param -> `checkpoint:` key: the run's settings are config's section, then these params."""


def shown(items: list, what: str) -> list:
    """The first `SHOWN` of `items` for an XCom (the metadata DB keeps every XCom: thousands of
    skipped files or runs would bloat it); all of them, if there are more, logged one a line."""
    if len(items) <= SHOWN:
        return items
    log.info("%d %s (the XCom shows the first %d):", len(items), what, SHOWN)
    for item in items:
        log.info("  %s", json.dumps(item, default=str, ensure_ascii=False))
    return items[:SHOWN]


def _settings(params: dict | None):
    """The run's `checkpoint:` settings (config, then params); `lossy: none` turns config's off.
    UsageError for a `store` or `inbox` param that is a relative path."""
    from seedance_tasks.checkpoint.catalog import check_store_uri

    params = params or {}
    for name in ("store", "inbox"):  # relative: the worker's working folder, which nobody chose
        if params.get(name):
            check_store_uri(params[name], f"the `{name}` param")
    settings = run_settings("checkpoint", params, SETTINGS_PARAMS)
    if params.get("lossy"):
        settings.lossy = None if params["lossy"] == "none" else params["lossy"]
    return settings


@fail_fast
def scan_task(params: dict | None) -> dict[str, Any]:
    """List the inbox files ready to compress (mapped over by `ingest`).

    Skipped, with the reason, when no inbox or store is configured (nothing to do yet).
    """
    from seedance_tasks.checkpoint import ingest

    settings = _settings(params)
    missing = [name for name in ("inbox", "store") if not getattr(settings, name)]
    if missing:
        skip("no checkpoint " + " and no ".join(missing) + ": set the " + "/".join(missing)
             + " param(s), or " + ", ".join(f"checkpoint.{name}" for name in missing) + " in config/seedance.yaml")
    if settings.store.startswith("s3://"):  # a misspelt bucket fails here, once, not in every mapped ingest
        from seedance_tasks.checkpoint.catalog import existing_store

        existing_store(settings.store)
    found = ingest.scan(settings.inbox, settings.inbox_min_age)
    return {"items": found["ready"], "skipped": shown(found["skipped"], "inbox files skipped"),
            "skipped_count": len(found["skipped"]), "inbox": settings.inbox, "store": settings.store}


@fail_fast
def ingest_task(item: dict, params: dict | None, run_id: str | None = None) -> dict[str, Any]:
    """Compress one raw checkpoint into the store, verify it, retire the raw file.

    Holds the run's lease as the DAG run (`dag_support.airflow_lease_holder`), so a retry of this
    task takes it back and finishes what its first attempt left.
    """
    from seedance_tasks.checkpoint import ingest
    from seedance_tasks.dag_support import airflow_lease_holder

    settings = _settings(params)
    return ingest.ingest_one(
        item, settings.inbox, settings.store, settings, run_id=run_id, holder=airflow_lease_holder(),
        codec=settings.codec, keyframe_every=settings.keyframe_every, lossy=settings.lossy,
    )


@fail_fast
def report_task(scanned: dict, results: list[dict], asset=None) -> dict[str, Any]:
    """One summary for the run: counts by status, bytes, ratio, problems (quarantined, conflicts).

    The event on `asset` (the store) carries the store URI, the runs and steps stored and the bytes.
    Lists (skipped files, problems) are cut to their first `SHOWN`, with counts; all are logged.
    """
    from seedance_tasks.checkpoint import ingest

    results = list(results)
    summary = ingest.report(results)
    summary["skipped"] = scanned.get("skipped", [])
    summary["skipped_count"] = scanned.get("skipped_count", len(summary["skipped"]))
    summary["problems_count"] = len(summary["problems"])
    summary["problems"] = shown(summary["problems"], "files quarantined or in conflict")
    summary["store"] = scanned.get("store")
    if asset is not None:
        from seedance_tasks.dag_support import announce

        stored = [r for r in results if r.get("status") == "stored"]
        announce(asset, {
            "store": summary["store"], "runs": summary["runs"],
            "steps": {run: sorted(r["step"] for r in stored if r["run"] == run) for run in summary["runs"]},
            "files": summary["files"], "stored": len(stored), "raw_bytes": summary["raw_bytes"],
            "stored_bytes": summary["stored_bytes"], "ratio": summary["ratio"], "source": "seedance_checkpoints",
        })
    return summary


@fail_fast
def purge_task(params: dict | None) -> dict[str, Any]:
    """Free the inbox trash (retired raw checkpoints) older than `purge_older_than` (empty:
    `storage.trash_retention`)."""
    from seedance_tasks import journal, storage
    from seedance_tasks.config import load_section
    from seedance_tasks.units import parse_duration

    params = params or {}
    settings = _settings(params)
    older = params.get("purge_older_than")
    older_s = parse_duration(older) if older else load_section("storage").trash_retention
    return journal.purge_trash(storage.resolve(settings.inbox), older_s)
