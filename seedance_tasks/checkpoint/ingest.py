"""The inbox: raw checkpoints trainers drop as `INBOX/<run>/<name with step>.pt|.pth|.safetensors`.

`scan` lists what is ready (not hidden, older than `inbox_min_age`, a step number in the name:
the last integer of the file name, e.g. `step-000120.pt` -> 120). `ingest_one` compresses one
file into the store, verifies the stored checkpoint by decoding it (sha256 of every chunk), and
only then moves the raw file to `INBOX/_seedance/trash/<run-id>/` (purged later by age). Every
step is repeatable: after a crash between commit and retire, the next run finds the step stored,
checks that its content equals the raw file, verifies and retires. A file that cannot be read
safely (a pickle that needs code, a corrupt file) is quarantined under
`INBOX/_seedance/quarantine/`, and the other files go on.
"""

from __future__ import annotations

import os
import re
import tempfile
from datetime import UTC, datetime
from typing import Any

from seedance_tasks import storage
from seedance_tasks.errors import InputError, RefusedError

SUFFIXES = (".pt", ".pth", ".safetensors")
_STEP = re.compile(r"(\d+)(?!.*\d)")


def parse_name(relative: str) -> tuple[str, int] | None:
    """(run, step) of an inbox file `run/<...step...>.pt`, or None if it does not follow the layout."""
    parts = relative.split("/")
    if len(parts) != 2 or not parts[1].lower().endswith(SUFFIXES):
        return None
    stem = parts[1].rsplit(".", 1)[0]
    match = _STEP.search(stem)
    return (parts[0], int(match.group(1))) if match else None


def scan(inbox_uri: str, min_age_s: float, now: datetime | None = None, run: str | None = None) -> dict:
    """What is ready in the inbox: {"ready": [{path, run, step, size}], "skipped": [{path, reason}]}.

    Sorted by (run, step) so that each checkpoint can delta against the one before it. With
    `run`, only that run's folder is listed.
    """
    inbox = storage.resolve(inbox_uri)
    now = now or datetime.now(UTC)
    ready, skipped = [], []
    for info in storage.list_files(inbox.child(run) if run else inbox):
        relative = inbox.relative(info.path)
        parsed = parse_name(relative)
        if parsed is None:
            skipped.append({"path": relative, "reason": "not INBOX/<run>/<name with step>.pt|.pth|.safetensors"})
            continue
        age = (now - info.mtime.astimezone(UTC)).total_seconds() if info.mtime else min_age_s
        if age < min_age_s:
            skipped.append({"path": relative, "reason": f"younger than {min_age_s:g} s (may still be written)"})
            continue
        ready.append({"path": relative, "run": parsed[0], "step": parsed[1], "size": info.size})
    ready.sort(key=lambda item: (item["run"], item["step"]))
    return {"inbox": inbox.uri, "ready": ready, "skipped": skipped}


def _local_copy(inbox, relative: str) -> tuple[str, bool]:
    """A local path of the inbox file (downloaded to a temp file from S3); (path, is_temporary)."""
    if not inbox.is_s3:
        return inbox.join(relative), False
    suffix = "." + relative.rsplit(".", 1)[-1]
    handle, temp = tempfile.mkstemp(prefix=".seedance-inbox-", suffix=suffix)
    with os.fdopen(handle, "wb") as out:
        out.write(storage.read_bytes(inbox.fs, inbox.join(relative)))
    return temp, True


def ingest_one(item: dict, inbox_uri: str, store_uri: str, settings, *, run_id: str | None = None,
               codec: str | None = None, keyframe_every: int | None = None, lossy: str | None = None) -> dict:
    """Compress one inbox file into the store, verify it, then retire the raw file; a small summary.

    Ready files of the same run with lower steps are stored first (whichever mapped task runs
    first), so that deltas always go forward in step order; each task verifies and retires only
    its own file. Status: `stored` (stored from this file, by this task or a sibling), `already
    stored` (the same content was stored before from elsewhere), `quarantined` (unreadable or
    unsafe file; reason given), `conflict` (the step is stored with other content; the raw file is
    left in place for a person to look at).
    """
    from seedance_tasks.checkpoint.store import manifest_path, read_manifest, same_content, summary, verify

    inbox = storage.resolve(inbox_uri)
    store = storage.resolve(store_uri)
    run_id = run_id or storage.new_run_id()
    relative, run, step = item["path"], item["run"], int(item["step"])
    options = {"settings": settings, "codec": codec, "keyframe_every": keyframe_every, "lossy": lossy}
    for earlier in scan(inbox_uri, settings.inbox_min_age, run=run)["ready"]:
        if earlier["step"] < step and not storage.is_file(store.fs, manifest_path(store, run, earlier["step"])):
            try:
                _store(inbox, store_uri, earlier, options)
            except (RefusedError, InputError):
                pass  # that file's own task quarantines it
    result: dict[str, Any] = {"path": relative, "run": run, "step": step}
    source = inbox.uri_of(inbox.join(relative))
    try:
        if storage.is_file(store.fs, manifest_path(store, run, step)):
            state = _read(inbox, relative)
            manifest = read_manifest(store, run, step)
            if not same_content(state, manifest):
                return {**result, "status": "conflict",
                        "reason": f"step {step} of run {run} is already stored with different content"}
            result["status"] = "stored" if manifest.get("source", {}).get("file") == source else "already stored"
            stored = summary(manifest, store.uri)
        else:
            stored = _store(inbox, store_uri, item, options)
            result["status"] = "stored"
    except (RefusedError, InputError) as exc:
        target = storage.quarantine(inbox, relative, run_id, exc.message)
        return {**result, "status": "quarantined", "reason": exc.message, "quarantined_to": inbox.uri_of(target)}
    result.update({key: stored[key] for key in ("kind", "base", "raw_bytes", "stored_bytes", "ratio", "lossy")})
    result["verified"] = verify(store_uri, run, step, workers=settings.workers)["ok"]
    result["retired_to"] = inbox.uri_of(storage.move_to_trash(inbox, relative, run_id))
    return result


def _read(inbox, relative: str):
    from seedance_tasks.checkpoint.files import read_checkpoint

    local, temporary = _local_copy(inbox, relative)
    try:
        return read_checkpoint(local)
    finally:
        if temporary:
            os.unlink(local)


def _store(inbox, store_uri: str, item: dict, options: dict) -> dict:
    """Read one inbox file safely and save it as its run/step; the save summary."""
    from seedance_tasks.checkpoint.store import save_state

    state = _read(inbox, item["path"])
    source = {"file": inbox.uri_of(inbox.join(item["path"])), "size": item.get("size")}
    return save_state(state, store_uri, item["run"], int(item["step"]), source=source, **options)


def report(results: list[dict]) -> dict:
    """One summary over the ingested files: counts by status, bytes in and stored, overall ratio."""
    stored = [r for r in results if r.get("status") == "stored"]
    raw = sum(r.get("raw_bytes", 0) for r in stored)
    kept = sum(r.get("stored_bytes", 0) for r in stored)
    by_status: dict[str, int] = {}
    for item in results:
        by_status[item.get("status", "?")] = by_status.get(item.get("status", "?"), 0) + 1
    return {
        "files": len(results),
        "by_status": by_status,
        "raw_bytes": raw,
        "stored_bytes": kept,
        "ratio": round(raw / kept, 4) if kept else None,
        "runs": sorted({r["run"] for r in results}),
        "problems": [
            {"path": r["path"], "status": r["status"], "reason": r.get("reason")}
            for r in results if r.get("status") in ("quarantined", "conflict")
        ],
    }
