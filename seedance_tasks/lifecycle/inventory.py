"""What the lifecycle reads and writes of a checkpoint store: manifests, file locations, restore times.

Manifests are the store's (`seedance_tasks.checkpoint.store`); the lifecycle only ever changes
their `files[name]` entries (`tier`, `uri`, `storage_class`) and `tags`, never `id`, tensors or
chain, and writes them whole and atomically. The time of a checkpoint's last restore is kept
beside the store, in `STORE/_seedance/restored/<run>/step-<N>.json`, so a restore never rewrites
a manifest.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from datetime import UTC, datetime

from seedance_tasks import storage
from seedance_tasks.checkpoint import store as ckpt
from seedance_tasks.storage import Location

RESTORED_DIR = f"{storage.SEEDANCE_DIR}/restored"


@dataclass(frozen=True)
class FileRef:
    """One data file of a checkpoint: the root it lives under and its path relative to that root."""

    root: str  # URI of the root (the store, or a tier's location)
    rel: str

    @property
    def uri(self) -> str:
        return posixpath.join(self.root, self.rel) if self.root.startswith("s3://") else f"{self.root.rstrip('/')}/{self.rel}"

    def location(self) -> tuple[Location, str]:
        return storage.resolve(self.root), self.rel


def manifests(store: Location, run: str) -> list[dict]:
    """Manifests of every committed checkpoint of `run`, by step."""
    return [ckpt.read_manifest(store, run, step) for step in ckpt.committed_steps(store, run)]


def manifest_rel(run: str, step: int) -> str:
    return posixpath.join(run, ckpt.step_dir(step), ckpt.MANIFEST)


def write_manifest(store: Location, manifest: dict) -> None:
    """Replace a committed manifest atomically (readers see the old one or the new one)."""
    storage.write_json_atomic(store.fs, ckpt.manifest_path(store, manifest["run"], manifest["step"]), manifest)


def file_ref(store: Location, manifest: dict, name: str) -> FileRef:
    """Where data file `name` of `manifest` lives now, as (root, relative path)."""
    entry = manifest["files"][name]
    if entry.get("uri"):
        root = entry.get("root")
        if root and entry["uri"].startswith(root.rstrip("/") + "/"):
            return FileRef(root, entry["uri"][len(root.rstrip("/")) + 1:])
        parent, base = posixpath.split(entry["uri"])
        return FileRef(parent, base)
    return FileRef(store.uri, posixpath.join(manifest["run"], ckpt.step_dir(manifest["step"]), name))


def tier_rel(manifest: dict, name: str) -> str:
    """Path of a data file below a tier's root: `<run>/step-<N>/<manifest id>/<name>` (never reused)."""
    return posixpath.join(manifest["run"], ckpt.step_dir(manifest["step"]), manifest["id"], name)


def tier_of(manifest: dict) -> str:
    """The coldest tier holding one of the checkpoint's files."""
    tiers = {entry.get("tier") or "hot" for entry in manifest["files"].values()}
    for tier in ("cold", "warm", "hot"):
        if tier in tiers:
            return tier
    return "hot"


def stored_bytes(manifest: dict) -> int:
    return sum(int(entry.get("size") or 0) for entry in manifest["files"].values())


def restored_path(store: Location, run: str, step: int) -> str:
    return store.join(RESTORED_DIR, run, f"{ckpt.step_dir(step)}.json")


def record_restore(store: Location, run: str, step: int, when: datetime | None = None) -> None:
    """Note that `run`/`step` was just restored (tiering counts a checkpoint's age from then)."""
    when = when or datetime.now(UTC)
    storage.write_json_atomic(store.fs, restored_path(store, run, step), {"run": run, "step": step, "at": when.isoformat()})


def last_restored(store: Location, run: str) -> dict[int, datetime]:
    """{step: time of its last restore} for the steps of `run` restored since they were saved."""
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(store.join(RESTORED_DIR, run), recursive=False, allow_not_found=True)
    found = {}
    for info in store.fs.get_file_info(selector):
        name = posixpath.basename(info.path)
        match = ckpt.STEP_DIR.match(name.removesuffix(".json"))
        if info.type != pafs.FileType.File or not match:
            continue
        try:
            found[int(match.group(1))] = datetime.fromisoformat(storage.read_json(store.fs, info.path)["at"])
        except (ValueError, KeyError, OSError):
            continue
    return found


def age_s(manifest: dict, restored: datetime | None, now: datetime) -> float:
    """Seconds since the checkpoint was saved or, if later, last restored."""
    created = datetime.fromisoformat(manifest["created_at"])
    if restored and restored > created:
        created = restored
    return (now - created).total_seconds()


def set_tags(store_uri: str, run: str, step: int, add: list[str] = (), remove: list[str] = ()) -> dict:
    """Add/remove tags of a committed checkpoint (a tagged checkpoint is kept by GC); returns its tags."""
    store = storage.resolve(store_uri)
    manifest = ckpt.read_manifest(store, run, int(step))
    tags = (set(manifest.get("tags") or []) | {t for t in add if t}) - set(remove)
    if sorted(tags) != manifest.get("tags"):
        manifest["tags"] = sorted(tags)
        write_manifest(store, manifest)
    return {"store": store.uri, "run": run, "step": int(step), "tags": sorted(tags)}


def note_restore(store: Location, run: str, step: int) -> None:
    """Record a restore if `lifecycle.record_restores` (called by the checkpoint reader); never raises."""
    try:
        from seedance_tasks.config import load_settings

        if load_settings().lifecycle.record_restores:
            record_restore(store, run, step)
    except Exception:  # a read-only store or a bad config must not fail the restore itself
        import logging

        logging.getLogger(__name__).debug("could not record the restore of %s/%s", run, step, exc_info=True)
