"""Retention GC: drop the checkpoints a run's policy does not keep, crash-safely.

Per run, under the run's lease (`run-<run>`, so a second GC, a tiering pass or an ingest of the
same run waits or is refused naming the holder), one journaled step: the journal lists every
manifest to remove (newest first, so a delta always leaves before its base) and then every
data file. Applying it moves each manifest to the store's trash first -- the checkpoint leaves
the listing -- and then its data files, to the trash of the root they live under (store or tier
location); archive-class S3 objects, which S3 cannot copy, are deleted instead. The bytes are
freed by `seedance trash purge`. A kept checkpoint and every base in its chain are never in the
journal. Manifests are read through the catalog, so a file outside the store's trusted roots is
never named, and a checkpoint reached through a symlink, or with files under a tier location that
does not exist (an unmounted volume, a deleted bucket), is left alone and reported (`refused`).

Files of interrupted saves (a step folder without a manifest, a losing attempt's data files:
named by no manifest) go to the trash in the same journal once `stray_min_age` old (a day by
default: longer than any save, so a save still writing is never touched).

Attempt-safe: every attempt has its own journal (`gc-<run key>-<time>-<token>`) and first
recovers the journals earlier attempts on the same run left (roll forward past the point of no
return, else back), so a kill -9 or a transient error at any point is finished by the retry.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from datetime import UTC, datetime

import pyarrow.fs as pafs

from seedance_tasks import journal as journals
from seedance_tasks import storage
from seedance_tasks.checkpoint import catalog
from seedance_tasks.lifecycle import costs, inventory, journaled, policy, tier_marks
from seedance_tasks.lifecycle.settings import ARCHIVE_CLASSES, LifecycleSettings
from seedance_tasks.storage import Location


def load_lifecycle_settings(**overrides) -> LifecycleSettings:
    from seedance_tasks.config import load_settings, settings_with

    return settings_with(load_settings(), "lifecycle", **overrides)


def recover(store: Location, run: str, roots: list[str]) -> list[dict]:
    """Finish the GC and tiering attempts a killed run left on `run` (call under its lease)."""
    from seedance_tasks.lifecycle import tiering

    outcomes = [{**item, "kind": journaled.GC_KIND} for item in journals.recover(
        store, journaled.GC_KIND, journaled.prefix(journaled.GC_KIND, run), external_roots=roots)]
    outcomes.extend(tiering.recover(store, run, roots))
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
        restored = inventory.restored_rel(manifest["run"], manifest["step"])
        if storage.is_file(store.fs, store.join(restored)):
            retires.append(restored)
    return retires, external


def _linked(store: Location, manifest: dict) -> str | None:
    """Why a checkpoint must be left alone: a file of it is reached through a symlink (else None)."""
    for name in sorted(manifest["files"]):
        ref = inventory.file_ref(store, manifest, name)
        link = storage.through_link(storage.resolve(ref.root), ref.rel)
        if link:
            return f"{ref.root}/{link} is a symlink (never followed)"
    return None


def _on_missing_root(store: Location, manifest: dict, present: dict[str, str | None]) -> str | None:
    """Why a checkpoint must be left alone: a tier location it has files under does not exist (a
    deleted bucket, an unmounted volume) or is an unmounted volume's empty mountpoint (it lacks
    the tier mark tiering left there: `tier_marks`), so its files can be neither found nor retired
    (else None). `present` caches each root's answer for one plan."""
    for name in sorted(manifest["files"]):
        root = inventory.file_ref(store, manifest, name).root
        if root == store.uri:
            continue
        if root not in present:
            location = storage.resolve(root)
            if location.fs.get_file_info(location.path).type != pafs.FileType.Directory:
                present[root] = f"its tier location {root} does not exist (unmounted, or deleted?): its files were not found"
            else:
                present[root] = tier_marks.problem(store, root)
        if present[root]:
            return present[root]
    return None


def _measure(store: Location, manifest: dict) -> None:
    """Set the `size` of each of the manifest's file entries (in memory) to the bytes its file has
    where it lives (0 if it is not there): what GC frees is what it finds, not what an untrusted
    manifest claims."""
    by_root: dict[str, list[tuple[str, str]]] = {}
    for name in manifest["files"]:
        ref = inventory.file_ref(store, manifest, name)
        by_root.setdefault(ref.root, []).append((name, ref.rel))
    for root, items in by_root.items():
        location = storage.resolve(root)
        infos = location.fs.get_file_info([location.join(rel) for _, rel in items])
        for (name, _), info in zip(items, infos, strict=True):
            found = info.type == pafs.FileType.File and info.size is not None
            manifest["files"][name]["size"] = int(info.size) if found else 0


def _strays(store: Location, run: str, found: list[dict], now: datetime, min_age_s: float) -> list[dict]:
    """Files of interrupted saves old enough to go ({"rel", "bytes"}, by path)."""
    return [{"rel": item["rel"], "bytes": item["bytes"]} for item in catalog.stray_files(store, run, found)
            if item["mtime"] is not None and (now - item["mtime"]).total_seconds() >= min_age_s]


def _finished_earlier(entries: list[journals.Journal]) -> dict:
    """What the GC attempts of `entries` (`journaled.finished_earlier`) collected ({"deleted",
    "bytes_freed", "stray_files", "stray_bytes"}, from their journals). An untrusted figure that is
    not a count counts 0."""
    found = {"deleted": 0, "bytes_freed": 0, "stray_files": 0, "stray_bytes": 0}
    for entry in entries:
        meta = entry.meta
        figures = {"deleted": len(meta["steps"]) if isinstance(meta.get("steps"), list) else 0,
                   "bytes_freed": meta.get("bytes_freed"), "stray_files": meta.get("strays"),
                   "stray_bytes": meta.get("stray_bytes")}
        for key, value in figures.items():
            found[key] += value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
    return found


def _earlier(plan: dict, key: str) -> int:
    return plan.get("earlier", {}).get(key, 0)


def plan_run(store: Location, run: str, rules: policy.RetentionPolicy, now: datetime,
             roots: list[str] | None = None, stray_min_age_s: float = 86400) -> dict:
    """What GC would do to `run`: kept steps with reasons, garbage steps with bytes, and the files
    of interrupted saves (`strays`) older than `stray_min_age_s`. A run with a damaged manifest,
    or whose policy keeps the best by a metric none of its checkpoints records (a misspelt
    metric would rank nothing and collect the best), is left alone, saying why (`left_alone`)."""
    found, damaged = catalog.read_run(store, run, roots)
    unranked = rules.keep_best and rules.metric and found and \
        all(policy.metric_value(m, rules.metric) is None for m in found)
    if damaged or unranked:  # left alone: its chains and files cannot be told, or "best" is a typo
        why = "the run has a damaged manifest" if damaged else \
            f"no checkpoint records metric {rules.metric!r} that keep_best {rules.keep_best} ranks by"
        return {"run": run, "policy": rules.model_dump(mode="json"), "checkpoints": len(found) + len(damaged),
                "kept": [{"step": m["step"], "reasons": [f"{why}: nothing collected"]} for m in found],
                "delete": [], "bytes_freed": 0, "strays": [], "stray_bytes": 0, "unrestorable_kept": {},
                "refused": [], "damaged": damaged, "left_alone": why, "_manifests": found, "_garbage": []}
    kept = policy.select(found, rules, now)
    garbage, refused, present = [], [], {}
    for manifest in found:
        if manifest["step"] in kept:
            continue
        reason = _linked(store, manifest) or _on_missing_root(store, manifest, present)
        if reason:
            refused.append({"step": manifest["step"], "reason": reason})
        else:
            _measure(store, manifest)
            garbage.append(manifest)
    if refused:  # a checkpoint left alone stays, and so does every base its restore reads
        kept = policy.with_bases(found, {**kept, **{item["step"]: ["left alone"] for item in refused}})
        garbage = [m for m in garbage if m["step"] not in kept]
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
        "strays": (strays := _strays(store, run, found, now, stray_min_age_s)),
        "stray_bytes": sum(item["bytes"] for item in strays),
        "unrestorable_kept": policy.missing_bases(found, kept),
        "refused": refused,
        "damaged": [],
        "left_alone": None,
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
    holder: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    **policy_overrides,
) -> dict:
    """GC `runs` (default: every run) of the store; a dry run unless `apply`.

    Returns {"store", "applied", "runs": [...], "checkpoints_deleted", "bytes_freed", "cost":
    {"before", "after", "saving"}, "trash_id", "recovered"}; the counts and bytes include what an
    earlier attempt collected that no call reported: one killed past its point of no return
    (finished by this call's recovery), or one of the same `holder` (Airflow's retry of a task
    that did its work and failed before returning). The cost is measured by this call. Policy options (keep_last, keep_every,
    keep_best, metric, metric_mode, keep_tagged, min_age) override the config per call; a bad
    policy raises UsageError before anything is read. With `apply`, each run is collected under
    its lease, held as `holder` (default: this call's run id); LeaseHeldError if another holds it.
    `on_progress(done, total)` is called as runs are done.
    """
    settings = settings or load_lifecycle_settings()
    store = catalog.existing_store(store_uri)
    now = now or datetime.now(UTC)
    names = journaled.run_names(store, runs)
    rules = {run: policy.policy_with(settings, run, **policy_overrides) for run in names}
    roots = journaled.roots(store, settings)
    trash_id = trash_id or storage.new_run_id()  # real time: purge dates trash by it
    holder = holder or f"gc-{trash_id}"
    plans, recovered = [], []
    before, after = costs.Tally(settings), costs.Tally(settings)

    def done(plan: dict) -> None:  # counted, then its manifests let go: memory stays one run's
        garbage = {id(m) for m in plan.pop("_garbage")}
        manifests = plan.pop("_manifests")
        before.add(manifests)
        after.add(m for m in manifests if id(m) not in garbage)
        plans.append(plan)

    for index, run in enumerate(names):
        if on_progress:
            on_progress(index, len(names))
        if not apply:
            done(plan_run(store, run, rules[run], now, roots, settings.stray_min_age))
            continue
        with journaled.run_lease(store, run, holder, "checkpoint gc") as held:
            earlier = recover(store, run, roots)
            recovered.extend(earlier)
            plan = plan_run(store, run, rules[run], now, roots, settings.stray_min_age)
            plan["earlier"] = _finished_earlier(journaled.finished_earlier(store, journaled.GC_KIND, run, holder, earlier))
            if plan["_garbage"] or plan["strays"]:
                retires, external = _removal(store, plan["_garbage"])
                retires += [item["rel"] for item in plan["strays"]]
                entry = journals.Journal.begin(
                    store, journaled.new_id(journaled.GC_KIND, run), journaled.GC_KIND, [], retires,
                    meta={"run": run, "steps": [m["step"] for m in plan["_garbage"]],
                          "strays": len(plan["strays"]), "bytes_freed": plan["bytes_freed"],
                          "stray_bytes": plan["stray_bytes"], "holder": holder},
                    trash_id=trash_id, external=external, prune_empty_dirs=True,
                )
                held.check()  # the point of no return: only while the lease is still ours
                entry.commit(external_roots=roots)
            done(plan)
    if on_progress:
        on_progress(len(names), len(names))
    before, after = before.report(), after.report()
    return {
        "store": store.uri,
        "applied": apply,
        "runs": plans,
        "checkpoints_deleted": sum(len(p["delete"]) + _earlier(p, "deleted") for p in plans),
        "checkpoints_kept": sum(len(p["kept"]) for p in plans),
        "bytes_freed": sum(p["bytes_freed"] + _earlier(p, "bytes_freed") for p in plans),
        "stray_files": sum(len(p["strays"]) + _earlier(p, "stray_files") for p in plans),
        "stray_bytes": sum(p["stray_bytes"] + _earlier(p, "stray_bytes") for p in plans),
        "cost": {"before": before, "after": after, "saving": costs.saving(before, after)},
        "trash_id": trash_id if apply else None,
        "trash": posixpath.join(store.uri, storage.TRASH_DIR) if apply else None,
        "recovered": recovered,
        "damaged": [item for p in plans for item in p["damaged"]],
    }
