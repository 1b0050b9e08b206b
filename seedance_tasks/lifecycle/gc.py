"""Retention GC: drop the checkpoints a run's policy does not keep, crash-safely.

Per run, one journaled step: the journal lists every manifest to remove (newest first, so a
delta always leaves before its base) and then every data file. Applying it moves each manifest
to the store's trash first -- the checkpoint leaves the listing -- and then its data files, to
the trash of the root they live under (store or tier location); archive-class S3 objects, which
S3 cannot copy, are deleted instead. The bytes are freed by `seedance trash purge`. A kept
checkpoint and every base in its chain are never in the journal. A kill -9 at any point leaves
every kept checkpoint restorable; the next run rolls the journal forward.
"""

from __future__ import annotations

import posixpath
from datetime import UTC, datetime

from seedance_tasks import journal as journals
from seedance_tasks import storage
from seedance_tasks.checkpoint import store as ckpt
from seedance_tasks.lifecycle import costs, inventory, journaled, policy
from seedance_tasks.lifecycle.settings import ARCHIVE_CLASSES, LifecycleSettings
from seedance_tasks.storage import Location


def load_lifecycle_settings(**overrides) -> LifecycleSettings:
    from seedance_tasks.config import load_settings, settings_with

    return settings_with(load_settings(), "lifecycle", **overrides)


def recover(store: Location) -> list[dict]:
    """Finish the GC and tiering steps a killed run left under `store` (roll forward or back)."""
    from seedance_tasks.lifecycle import tiering

    outcomes = []
    for entry in journaled.pending(store, journaled.GC_KIND):
        journaled.roll_forward(entry)  # nothing is touched before the journal is complete
        outcomes.append({"run_id": entry.run_id, "kind": entry.kind, "action": "rolled forward"})
    outcomes.extend(tiering.recover(store))
    return outcomes


def _removal(store: Location, manifests: list[dict]) -> tuple[list[str], list[dict]]:
    """(in-store paths to retire: manifests newest first, then data; files under other roots)."""
    newest_first = sorted(manifests, key=lambda m: -m["step"])
    retires = [inventory.manifest_rel(m["run"], m["step"]) for m in newest_first]
    external = []
    for manifest in newest_first:
        for name, entry in sorted(manifest["files"].items()):
            ref = inventory.file_ref(store, manifest, name)
            archived = entry.get("storage_class") in ARCHIVE_CLASSES
            if ref.root == store.uri and not archived:
                retires.append(ref.rel)
            else:
                external.append({"root": ref.root, "rel": ref.rel, "delete": archived})
        restored = inventory.restored_path(store, manifest["run"], manifest["step"])
        if storage.is_file(store.fs, restored):
            retires.append(store.relative(restored))
    return retires, external


def plan_run(store: Location, run: str, rules: policy.RetentionPolicy, now: datetime) -> dict:
    """What GC would do to `run`: kept steps with reasons, garbage steps with bytes."""
    found = inventory.manifests(store, run)
    kept = policy.select(found, rules, now)
    garbage = [m for m in found if m["step"] not in kept]
    return {
        "run": run,
        "policy": rules.model_dump(mode="json"),
        "checkpoints": len(found),
        "kept": [{"step": step, "reasons": reasons} for step, reasons in kept.items()],
        "delete": [
            {"step": m["step"], "kind": m["kind"], "bytes": inventory.stored_bytes(m), "tier": inventory.tier_of(m)}
            for m in garbage
        ],
        "bytes_freed": sum(inventory.stored_bytes(m) for m in garbage),
        "unrestorable_kept": policy.missing_bases(found, kept),
        "_manifests": found,
        "_garbage": garbage,
    }


def collect(
    store_uri: str,
    runs: list[str] | None = None,
    *,
    settings: LifecycleSettings | None = None,
    apply: bool = False,
    now: datetime | None = None,
    trash_id: str | None = None,
    **policy_overrides,
) -> dict:
    """GC `runs` (default: every run) of the store; a dry run unless `apply`.

    Returns {"store", "applied", "runs": [...], "checkpoints_deleted", "bytes_freed", "cost":
    {"before", "after", "saving"}, "trash_id", "recovered"}. Policy options (keep_last, keep_every,
    keep_best, metric, metric_mode, keep_tagged, min_age) override the config per call; a bad
    policy raises UsageError before anything is read.
    """
    settings = settings or load_lifecycle_settings()
    store = storage.resolve(store_uri)
    now = now or datetime.now(UTC)
    names = runs or ckpt.runs(store)
    rules = {run: policy.policy_with(settings, run, **policy_overrides) for run in names}
    recovered = recover(store) if apply else []
    trash_id = trash_id or storage.new_run_id()  # real time: purge dates trash by it
    plans = [plan_run(store, run, rules[run], now) for run in names]
    before = costs.report([m for p in plans for m in p["_manifests"]], settings)
    if apply:
        for plan in plans:
            if not plan["_garbage"]:
                continue
            retires, external = _removal(store, plan["_garbage"])
            entry = journals.Journal.begin(
                store, storage.new_run_id(), journaled.GC_KIND, [], retires,
                meta={"run": plan["run"], "steps": [m["step"] for m in plan["_garbage"]], "external": external},
                trash_id=trash_id,
            )
            journaled.roll_forward(entry)
    after = costs.report([m for p in plans for m in p["_manifests"] if m not in p["_garbage"]], settings)
    for plan in plans:
        plan.pop("_manifests")
        plan.pop("_garbage")
    return {
        "store": store.uri,
        "applied": apply,
        "runs": plans,
        "checkpoints_deleted": sum(len(p["delete"]) for p in plans),
        "checkpoints_kept": sum(len(p["kept"]) for p in plans),
        "bytes_freed": sum(p["bytes_freed"] for p in plans),
        "cost": {"before": before, "after": after, "saving": costs.saving(before, after)},
        "trash_id": trash_id if apply else None,
        "trash": posixpath.join(store.uri, storage.TRASH_DIR) if apply else None,
        "recovered": recovered,
    }
