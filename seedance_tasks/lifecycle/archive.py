"""Archive storage classes (GLACIER, DEEP_ARCHIVE): what is readable, and `thaw` (restore requests).

An object in an archive class answers HEAD but not GET until a restore request has completed;
then a temporary readable copy exists for `lifecycle.thaw_days`. `ckpt get` on such a file
fails with a message that names it and says to run `seedance ckpt thaw`; thaw requests the
restore of every archived file a restore of the checkpoint reads (its chain included).
"""

from __future__ import annotations

import functools

from seedance_tasks import storage
from seedance_tasks.checkpoint import catalog
from seedance_tasks.checkpoint.catalog import explain_unreadable, object_state  # noqa: F401 - the catalog's
from seedance_tasks.lifecycle import inventory, journaled, policy
from seedance_tasks.lifecycle.settings import LifecycleSettings


def chain_manifests(store, run: str, step: int, roots: list[str] | None = None) -> list[dict]:
    """The validated manifest of `run`/`step` and of every base its restore reads, newest first:
    the steps GC keeps for it (`policy.bases_closure`: the bases of bases too, where a chain stops
    short). IntegrityError naming the first of them that is missing or damaged."""
    read = functools.cache(lambda at: catalog.read_manifest(store, run, at, roots))
    return [read(at) for at in sorted(policy.bases_closure(read, {step: ["thawed"]}), reverse=True)]


def thaw(store_uri: str, run: str, step: int | None = None, *, settings: LifecycleSettings | None = None,
         days: int | None = None, retrieval: str | None = None) -> dict:
    """Request the restore of every archived file `run`/`step` (default: latest) and its chain read.

    Idempotent: files already restored or being restored are reported, not requested again. Only
files under the store's trusted roots are ever named (a manifest naming others is refused).
    A file that is not there (a tier volume not mounted, an object deleted) is `missing`, and the
    checkpoint not ready. Returns {"files": [{"uri", "step", "storage_class", "state", "action"}],
    "requested", "missing", "ready": bool}.
    """
    from seedance_tasks.lifecycle.gc import load_lifecycle_settings

    settings = settings or load_lifecycle_settings()
    store = catalog.existing_store(store_uri)  # a mistyped --store is named as such, not as a missing run
    from seedance_tasks.checkpoint.store import resolve_step

    step = resolve_step(store, catalog.check_run_name(run), step)
    roots = journaled.roots(store, settings)
    days = days or settings.thaw_days
    retrieval = retrieval or settings.thaw_retrieval
    client = None
    rows = []
    for manifest in chain_manifests(store, run, step, roots):  # validated: only trusted roots
        for name in sorted(manifest["files"]):
            ref = inventory.file_ref(store, manifest, name)
            uri = ref.uri
            if not uri.startswith("s3://"):
                location = storage.resolve(ref.root)
                there = storage.is_file(location.fs, location.join(ref.rel))
                rows.append({"uri": uri, "step": manifest["step"], "storage_class": None,
                             "state": "readable" if there else "missing", "action": "none"})
                continue
            found = _object_state(uri)
            if found is None:
                rows.append({"uri": uri, "step": manifest["step"], "storage_class": None, "state": "missing",
                             "action": "none"})
                continue
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
        "missing": sum(1 for r in rows if r["state"] == "missing"),
        "ready": all(r["state"] in ("readable", "restored") for r in rows),
    }


def _object_state(uri: str) -> dict | None:
    """`object_state` of an S3 object, or None if there is no such object (404)."""
    from botocore.exceptions import ClientError

    try:
        return object_state(uri)
    except ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
