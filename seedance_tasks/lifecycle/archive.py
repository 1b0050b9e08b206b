"""Archive storage classes (GLACIER, DEEP_ARCHIVE): what is readable, and `thaw` (restore requests).

An object in an archive class answers HEAD but not GET until a restore request has completed;
then a temporary readable copy exists for `lifecycle.thaw_days`. `ckpt get` on such a file
fails with a message that names it and says to run `seedance ckpt thaw`; thaw requests the
restore of every archived file a restore of the checkpoint reads (its chain included).
"""

from __future__ import annotations

from seedance_tasks import storage
from seedance_tasks.checkpoint import store as ckpt
from seedance_tasks.errors import RefusedError
from seedance_tasks.lifecycle import inventory
from seedance_tasks.lifecycle.settings import ARCHIVE_CLASSES, LifecycleSettings


def object_state(uri: str) -> dict:
    """{"storage_class", "state"} of an S3 object: state is readable | archived | restoring | restored."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    head = storage.boto3_client("s3").head_object(Bucket=bucket, Key=key)
    storage_class = head.get("StorageClass") or "STANDARD"
    restore = head.get("Restore") or ""
    if storage_class not in ARCHIVE_CLASSES:
        state = "readable"
    elif 'ongoing-request="true"' in restore:
        state = "restoring"
    elif 'ongoing-request="false"' in restore:
        state = "restored"
    else:
        state = "archived"
    return {"storage_class": storage_class, "state": state, "restore": restore or None}


def explain_unreadable(where: str, run: str, step: int, store_uri: str) -> None:
    """Raise a clear RefusedError if `where` (a data file that failed to read) is an archived object.

    Called by the checkpoint reader when a read fails; returns quietly if the object is not
    archived (the caller then reports its own error).
    """
    if not where.startswith("s3://"):
        return
    try:
        found = object_state(where)
    except Exception:  # the HEAD failing too says nothing more than the read did
        return
    if found["state"] in ("archived", "restoring"):
        waiting = "a restore is in progress" if found["state"] == "restoring" else "it must be restored first"
        raise RefusedError(
            f"data file {where} of {run}/{ckpt.step_dir(step)} is in {found['storage_class']} (archive): "
            f"not readable until restored; {waiting}",
            hint=f"seedance ckpt thaw --store {store_uri} --run {run} --step {step}  (then retry once it is restored)",
        )


def chain_manifests(store, run: str, step: int) -> list[dict]:
    """The manifest of `run`/`step` and of every base its restore reads."""
    manifest = ckpt.read_manifest(store, run, step)
    return [manifest, *(ckpt.read_manifest(store, run, int(base)) for base in manifest.get("chain") or [])]


def thaw(store_uri: str, run: str, step: int | None = None, *, settings: LifecycleSettings | None = None,
         days: int | None = None, retrieval: str | None = None) -> dict:
    """Request the restore of every archived file `run`/`step` (default: latest) and its chain read.

    Idempotent: files already restored or being restored are reported, not requested again.
    Returns {"files": [{"uri", "step", "storage_class", "state", "action"}], "ready": bool}.
    """
    from seedance_tasks.lifecycle.gc import load_lifecycle_settings

    settings = settings or load_lifecycle_settings()
    store = storage.resolve(store_uri)
    step = ckpt.resolve_step(store, run, step)
    days = days or settings.thaw_days
    retrieval = retrieval or settings.thaw_retrieval
    client = None
    rows = []
    for manifest in chain_manifests(store, run, step):
        for name in sorted(manifest["files"]):
            uri = inventory.file_ref(store, manifest, name).uri
            if not uri.startswith("s3://"):
                rows.append({"uri": uri, "step": manifest["step"], "storage_class": None, "state": "readable",
                             "action": "none"})
                continue
            found = object_state(uri)
            action = "none"
            if found["state"] == "archived":
                client = client or storage.boto3_client("s3")
                bucket, _, key = uri.removeprefix("s3://").partition("/")
                client.restore_object(
                    Bucket=bucket, Key=key,
                    RestoreRequest={"Days": days, "GlacierJobParameters": {"Tier": retrieval}},
                )
                action = "restore requested"
                found = object_state(uri)
            rows.append({"uri": uri, "step": manifest["step"], "storage_class": found["storage_class"],
                         "state": found["state"], "action": action})
    return {
        "store": store.uri, "run": run, "step": step, "days": days, "retrieval": retrieval, "files": rows,
        "requested": sum(1 for r in rows if r["action"] != "none"),
        "ready": all(r["state"] in ("readable", "restored") for r in rows),
    }
