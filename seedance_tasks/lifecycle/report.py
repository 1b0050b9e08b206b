"""The store-wide view: cost by tier now, trash waiting for a purge, and the purge of every root."""

from __future__ import annotations

from seedance_tasks import journal, storage
from seedance_tasks.checkpoint import catalog
from seedance_tasks.lifecycle import costs, journaled
from seedance_tasks.lifecycle.settings import TIERS, LifecycleSettings


def roots(store_uri: str, settings: LifecycleSettings) -> list[str]:
    """The store and every tier location (the roots whose trash holds retired checkpoint files)."""
    found = [storage.resolve(store_uri).uri]
    for tier in TIERS:
        uri = settings.tiers.spec(tier).uri
        root = storage.resolve(uri).uri if uri else None
        if root and root not in found:
            found.append(root)
    return found


def store_report(store_uri: str, settings: LifecycleSettings | None = None) -> dict:
    """Bytes and monthly cost per tier of every committed checkpoint, plus the bytes in trash."""
    from seedance_tasks.lifecycle.gc import load_lifecycle_settings

    settings = settings or load_lifecycle_settings()
    store = catalog.existing_store(store_uri)
    trusted = journaled.roots(store, settings)
    found, damaged = [], []
    for run in catalog.runs(store):  # a damaged manifest is reported (`damaged`), the others still counted
        run_found, run_damaged = catalog.read_run(store, run, trusted)
        found.extend(run_found)
        damaged.extend(run_damaged)
    result = {"store": store.uri, **costs.report(found, settings), "damaged": damaged}
    trash = 0
    for root in roots(store_uri, settings):
        location = storage.resolve(root)
        trash += sum(item.size or 0 for item in storage.list_files(location.child(storage.TRASH_DIR), include_hidden=True))
    result["trash_bytes"] = trash
    return result


def purge(store_uri: str, older_than_s: float, settings: LifecycleSettings | None = None) -> dict:
    """`journal.purge_trash` on the store and on every tier location; sums what was freed."""
    from seedance_tasks.lifecycle.gc import load_lifecycle_settings

    settings = settings or load_lifecycle_settings()
    results = [journal.purge_trash(storage.resolve(root), older_than_s) for root in roots(store_uri, settings)]
    return {
        "roots": [r["trash"] for r in results],
        "purged": sum(len(r["purged"]) for r in results),
        "files": sum(r["files"] for r in results),
        "bytes": sum(r["bytes"] for r in results),
    }
