"""The lifecycle's view of a checkpoint store, read through the checkpoint catalog.

The catalog (`seedance_tasks.checkpoint.catalog`, format in `checkpoint/manifest.py`) owns the
layout, the manifests and the restore records; the lifecycle only reads them here and asks the
catalog to rewrite a manifest (`catalog.replace_manifest`) when it moves files between tiers.
"""

from __future__ import annotations

from datetime import UTC, datetime

from seedance_tasks.checkpoint.catalog import last_restored, manifests, record_restore, restored_rel, set_tags
from seedance_tasks.checkpoint.manifest import (
    FileRef,
    file_ref,
    manifest_rel,
    stored_bytes,
    tier_of,
    tier_rel,
)

__all__ = ["FileRef", "age_s", "aware", "file_ref", "last_restored", "manifest_rel", "manifests", "record_restore",
           "restored_rel", "set_tags", "stored_bytes", "tier_of", "tier_rel"]


def aware(moment: datetime) -> datetime:
    """`moment` with a time zone: a naive time (an untrusted manifest or restore record) is UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def age_s(manifest: dict, restored: datetime | None, now: datetime) -> float:
    """Seconds since the checkpoint was saved or, if later, last restored (naive times read as UTC)."""
    created = aware(datetime.fromisoformat(manifest["created_at"]))
    if restored and aware(restored) > created:
        created = aware(restored)
    return (aware(now) - created).total_seconds()
