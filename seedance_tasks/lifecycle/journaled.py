"""The journaled steps GC and tiering share: retire files (trash or, for archive classes, delete).

Both record their intent in a `seedance_tasks.journal.Journal` of their own kind before touching
anything, with the in-store files to retire in `retires` (manifests first) and the files under
other roots (tier locations) in `meta["external"]`. Rolling forward is idempotent, so `recover`
at the start of every run finishes what a killed run left, whatever the point it died at.
"""

from __future__ import annotations

import os
import posixpath

from seedance_tasks import journal as journals
from seedance_tasks import storage
from seedance_tasks.errors import IntegrityError
from seedance_tasks.storage import Location

GC_KIND = "ckpt-gc"
TIER_KIND = "ckpt-tier"


def retire(root: Location, rel: str, trash_id: str, *, delete: bool = False) -> str:
    """Move `root/rel` to the root's trash (or delete it, for archive objects S3 cannot copy).

    Idempotent: a file already gone (moved earlier, or deleted) counts as done. Returns what
    happened: "trashed", "deleted" or "gone".
    """
    path = root.join(rel)
    if delete:
        if storage.is_file(root.fs, path):
            root.fs.delete_file(path)
            return "deleted"
        return "gone"
    try:
        storage.move_to_trash(root, rel, trash_id)
    except IntegrityError:  # neither in place nor in the trash: an earlier attempt's trash was purged
        return "gone"
    prune_empty_dirs(root, posixpath.dirname(rel))
    return "trashed"


def prune_empty_dirs(root: Location, rel_dir: str) -> None:
    """Remove now-empty local directories from `root/rel_dir` up to (not including) `root`."""
    if root.is_s3:
        return
    while rel_dir and rel_dir not in (".", "/"):
        try:
            os.rmdir(root.join(rel_dir))
        except OSError:
            return
        rel_dir = posixpath.dirname(rel_dir)


def roll_forward(entry: journals.Journal) -> None:
    """Pass the point of no return, retire everything the journal lists, close it. Repeatable."""
    if entry.state == journals.WRITING:
        entry.state = journals.PUBLISHING
        entry._save()
    trash_id = entry.trash_id or entry.run_id
    for rel in entry.retires:
        retire(entry.root, rel, trash_id)
    for item in entry.meta.get("external", []):
        retire(storage.resolve(item["root"]), item["rel"], trash_id, delete=item.get("delete", False))
    entry._finish(journals.DONE)


def pending(store: Location, kind: str) -> list[journals.Journal]:
    return journals.pending(store, kind)
