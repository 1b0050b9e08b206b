"""Data safety of one root: what is quarantined (and why), what waits in the trash, which leases are held."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from seedance_tasks import storage
from seedance_tasks.dashboard.reading import read_root_file

MAX_REASON_BYTES = 1024**2  # a quarantine reason is a few hundred bytes


def root_status(uri: str, now: datetime | None = None) -> dict[str, Any]:
    """Quarantined files (with reasons), trash runs (files, bytes) and lease records under one root."""
    from seedance_tasks import lease

    root = storage.resolve(uri)
    quarantined, unexplained = [], 0
    for info in storage.list_files(root.child(storage.QUARANTINE_DIR), include_hidden=True):
        if not info.path.endswith(".reason.json"):
            if not storage.is_file(root.fs, info.path + ".reason.json"):
                unexplained += 1
            continue
        try:
            reason = json.loads(read_root_file(root, root.relative(info.path), MAX_REASON_BYTES))
        except (OSError, ValueError) as exc:
            reason = {"file": root.relative(info.path), "reason": f"unreadable reason file: {exc}"}
        if not isinstance(reason, dict):
            reason = {"file": root.relative(info.path), "reason": "unreadable reason file: not a JSON object"}
        quarantined.append({"file": reason.get("file"), "reason": reason.get("reason"),
                            "run_id": reason.get("run_id"), "at": reason.get("at")})
    trash: dict[str, dict] = {}
    trash_root = root.child(storage.TRASH_DIR)
    for info in storage.list_files(trash_root, include_hidden=True):
        run_id = trash_root.relative(info.path).split("/", 1)[0]
        entry = trash.setdefault(run_id, {"run_id": run_id, "files": 0, "bytes": 0})
        entry["files"] += 1
        entry["bytes"] += info.size or 0
    now = now or datetime.now(UTC)
    leases = []
    damaged: list = []
    for record in lease.list_leases(root, damaged):
        leases.append({"name": record.name, "holder": record.holder, "purpose": record.purpose, "host": record.host,
                       "pid": record.pid, "acquired_at": record.acquired_at.isoformat(),
                       "heartbeat_at": record.heartbeat_at.isoformat(), "ttl_s": record.ttl_s,
                       "stale": record.stale(now)})
    return {"uri": root.uri, "quarantined": quarantined, "quarantined_without_reason": unexplained,
            "trash": sorted(trash.values(), key=lambda t: t["run_id"]), "leases": leases,
            "damaged_leases": [{"error": exc.message, "hint": exc.hint} for exc in damaged]}
