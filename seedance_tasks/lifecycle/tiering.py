"""Hot -> warm -> cold tiering of checkpoint data files: copy, verify sha256, switch, retire.

A checkpoint's tier follows its age since save or, if later, since its last restore
(`lifecycle.tiers.warm_after` / `cold_after`). Tiering only moves checkpoints colder. The
manifest always stays in the store (listing and chains keep working); only its `files[name]`
entries change: `uri` (where the file lives), `root` (the tier location it is under), `tier`,
`storage_class`.

Moving a checkpoint to a tier with its own location (`tiers.<tier>.uri`: a folder, a bucket or
prefix) is one journaled step: record the intent; copy each file (local: hidden name + rename;
S3: one PUT, readable class first) and verify the copy's sha256 against the source's; for an
archive class (GLACIER, DEEP_ARCHIVE) change the verified object's class in place (ETag checked);
switch the manifest (one atomic write); then move the sources to their root's trash. Before the
switch a crash leaves the checkpoint where it was (the next run removes the orphan copies);
after it, the next run retires the sources. A tier without a location on an S3 store is a
storage-class change of the objects in place (S3 CopyObject onto itself), then a manifest update.

Each run is tiered under its lease (`run-<run>`); every attempt has its own journal and first
recovers what earlier attempts on the run left. A journal is untrusted too: its moves are
checked (every copy in the checkpoint's own slot under a trusted root) before a rollback deletes
a copy. Files reached through a symlink are never copied or retired: that checkpoint is skipped
(a dry run reports the same skips). A run whose move fails (disk full, no such bucket) has that
attempt finished from its journal at once and the pass goes on with the other runs; it then
raises TieringFailedError naming the failed runs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
from collections.abc import Callable
from datetime import UTC, datetime

from seedance_tasks import faults, storage
from seedance_tasks import journal as journals
from seedance_tasks.checkpoint import catalog
from seedance_tasks.checkpoint.manifest import FileRef, normal_root, step_dir
from seedance_tasks.errors import IntegrityError, RefusedError, SeedanceError, UsageError
from seedance_tasks.lease import LeaseLostError
from seedance_tasks.lifecycle import costs, inventory, journaled, tier_marks
from seedance_tasks.lifecycle.settings import ARCHIVE_CLASSES, TIERS, LifecycleSettings, TieringSettings
from seedance_tasks.storage import Location

log = logging.getLogger(__name__)

BLOCK = 8 * 1024 * 1024


def desired_tier(age_s: float, tiers: TieringSettings) -> str:
    """The tier a checkpoint of this age (since save or last restore) belongs on."""
    if age_s >= tiers.cold_after:
        return "cold"
    if age_s >= tiers.warm_after:
        return "warm"
    return "hot"


def _rank(tier: str) -> int:
    return TIERS.index(tier) if tier in TIERS else 0


def check_locations(store: Location, tiers: TieringSettings) -> None:
    """Refuse (UsageError naming the key) a tier location that is the store or inside it: files
    tiered there would be named as the retired files next to the manifest, or land among its runs."""
    def real(location: Location) -> str:
        return location.uri.rstrip("/") if location.is_s3 else os.path.realpath(location.uri)

    inside = real(store)
    for name in ("warm", "cold"):  # what tiering writes to (hot is the store)
        uri = tiers.spec(name).uri
        where = real(storage.resolve(uri)) if uri else None
        if where and (where == inside or where.startswith(inside + "/")):
            raise UsageError(
                f"lifecycle.tiers.{name}.uri {uri!r} is {'the store' if where == inside else 'inside the store'} "
                f"{store.uri}: tiering there would break its checkpoints",
                hint=f"give tier {name} a folder or s3:// prefix outside the store (e.g. a sibling of it)")


# --------------------------------------------------------------------------- copy + verify


def _s3_bucket_key(path: str) -> tuple[str, str]:
    bucket, _, key = path.partition("/")
    return bucket, key


def _sha256_of(location: Location, rel: str) -> str:
    digest = hashlib.sha256()
    with location.fs.open_input_stream(location.join(rel)) as stream:
        while block := stream.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


class _HashingReader:
    """A file-like over a pyarrow input stream that hashes what is read through it."""

    def __init__(self, stream):
        self.stream, self.digest = stream, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(BLOCK if size is None or size < 0 else size)
        self.digest.update(data)
        return data


def copy_verified(src: FileRef, dst: FileRef, storage_class: str | None) -> dict:
    """Copy `src` to `dst`, check the copy's sha256 against the source's; returns {sha256, bytes}.

    Local destinations are written under a hidden name and renamed into place; S3 ones are one
    PUT (in a readable class, so the copy can be read back), then moved to an archive class in
    place if `storage_class` is one. On a mismatch the copy is removed and IntegrityError raised.
    """
    src_loc, dst_loc = storage.resolve(src.root), storage.resolve(dst.root)
    final = dst_loc.join(dst.rel)
    with src_loc.fs.open_input_stream(src_loc.join(src.rel)) as stream:
        reader = _HashingReader(stream)
        if dst_loc.is_s3:
            import boto3.s3.transfer

            bucket, key = _s3_bucket_key(final)
            extra = {"StorageClass": storage_class} if storage_class and storage_class not in ARCHIVE_CLASSES else {}
            client = storage.boto3_client("s3")
            client.upload_fileobj(
                reader, bucket, key, ExtraArgs=extra,
                Config=boto3.s3.transfer.TransferConfig(multipart_threshold=5 * 1024**3, use_threads=False),
            )
            written = final
        else:
            dst_loc.fs.create_dir(posixpath.dirname(final), recursive=True)
            written = storage.hidden_sibling(final, "copy")
            with open(written, "wb") as out:
                while block := reader.read(BLOCK):
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())
    source_sha = reader.digest.hexdigest()
    copy_sha = _sha256_of(dst_loc, dst_loc.relative(written))
    if copy_sha != source_sha:
        dst_loc.fs.delete_file(written)
        raise IntegrityError(f"copy of {src.uri} to {dst.uri} does not match its sha256 (source changed or bad write)")
    if not dst_loc.is_s3:
        os.replace(written, final)
    elif storage_class in ARCHIVE_CLASSES:
        set_storage_class(final, storage_class, source_sha)
    return {"sha256": source_sha}


def set_storage_class(path: str, storage_class: str, expected_sha256: str | None = None) -> bool:
    """Change an S3 object's storage class in place (CopyObject onto itself); False if it had it.

    S3 computes the SHA-256 of the object it writes (ChecksumAlgorithm); it must equal
    `expected_sha256` (default: the object's sha256 read before the copy), else IntegrityError.
    """
    import base64

    client = storage.boto3_client("s3")
    bucket, key = _s3_bucket_key(path)
    current = client.head_object(Bucket=bucket, Key=key).get("StorageClass") or "STANDARD"
    if current == storage_class:
        return False
    if current in ARCHIVE_CLASSES:
        raise RefusedError(f"s3://{path} is in {current}; it cannot be copied to {storage_class}",
                           hint="thaw it first (`seedance ckpt thaw`)")
    if expected_sha256 is None:
        expected_sha256 = _sha256_of(storage.resolve(f"s3://{bucket}"), key)
    result = client.copy_object(
        Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": key},
        StorageClass=storage_class, MetadataDirective="COPY", ChecksumAlgorithm="SHA256",
    )
    written = (result.get("CopyObjectResult") or {}).get("ChecksumSHA256")
    if not written or base64.b64decode(written).hex() != expected_sha256:
        raise IntegrityError(f"s3://{path}: the copy in {storage_class} does not match its sha256")
    return True


# --------------------------------------------------------------------------- one checkpoint


def _plan_moves(store: Location, manifest: dict, target: str, settings: LifecycleSettings) -> list[dict]:
    spec = settings.tiers.spec(target)
    tier_root = storage.resolve(spec.uri).uri if spec.uri else None  # absolute: manifests outlive the cwd
    moves = []
    for name in sorted(manifest["files"]):
        src = inventory.file_ref(store, manifest, name)
        dst = FileRef(tier_root, inventory.tier_rel(manifest["run"], manifest["step"], manifest["id"], name)) \
            if tier_root else FileRef(store.uri, posixpath.join(manifest["run"], step_dir(manifest["step"]), name))
        dst_s3 = dst.root.startswith("s3://")
        moves.append({
            "name": name, "src": {"root": src.root, "rel": src.rel}, "dst": {"root": dst.root, "rel": dst.rel},
            "in_place": src.uri == dst.uri, "storage_class": spec.storage_class if dst_s3 else None,
            "src_storage_class": manifest["files"][name].get("storage_class"),
        })
    return moves


def _switch(store: Location, run: str, step: int, manifest_id: str, moves: list[dict], target: str,
            roots: list[str]) -> None:
    """Point the manifest's file entries at their new place (one atomic write, by the catalog)."""
    manifest = catalog.read_manifest(store, run, step, roots)
    if manifest["id"] != manifest_id:
        raise IntegrityError(f"{run}/{step_dir(step)} was replaced while it was being tiered")
    for move in moves:
        entry = manifest["files"][move["name"]]
        dst = FileRef(move["dst"]["root"], move["dst"]["rel"])
        in_store = dst.root == store.uri
        entry.update(
            tier=target, uri=None if in_store else dst.uri, root=None if in_store else dst.root,
            storage_class=move["storage_class"],
        )
    catalog.replace_manifest(store, manifest, roots)


def _switched(store: Location, entry: journals.Journal, roots: list[str]) -> bool | None:
    """True if the journal's manifest already points at the copies; None if the checkpoint is gone."""
    meta = entry.meta
    try:
        manifest = catalog.read_manifest(store, meta["run"], meta["step"], roots)
    except IntegrityError:
        return None
    if manifest["id"] != meta["id"]:
        return None
    for move in meta["moves"]:
        if move["name"] not in manifest["files"] or \
                inventory.file_ref(store, manifest, move["name"]).uri != FileRef(**move["dst"]).uri:
            return False
    return True


def _checked_moves(store: Location, entry: journals.Journal, roots: list[str]) -> list[dict]:
    """The journal's moves, if every copy it names is in its checkpoint's own slot under a trusted
    root (else IntegrityError naming the journal and the field): a rollback deletes those copies."""
    meta, where = entry.meta, f"journal {entry.run_id} under {store.uri}"
    try:
        run, step, manifest_id = catalog.check_run_name(meta["run"]), int(meta["step"]), str(meta["id"])
        moves = list(meta["moves"])
        trusted = {normal_root(root) for root in roots}
        for move in moves:
            name = storage.confine(move["name"], what=f"{where} moves.name")
            root = normal_root(move["dst"]["root"])
            rel = storage.confine(move["dst"]["rel"], what=f"{where} moves.dst.rel")
            expected = posixpath.join(run, step_dir(step), name) if root == normal_root(store.uri) else \
                inventory.tier_rel(run, step, manifest_id, name)
            if root not in trusted or rel != expected or "/" in name:
                raise IntegrityError(f"{where}: moves.dst {move['dst']!r} is not the place of {run}/{step_dir(step)}"
                                     f"/{name} under a trusted root; refused")
    except (KeyError, TypeError, ValueError) as exc:
        raise IntegrityError(f"{where}: its meta is malformed ({type(exc).__name__}: {exc}); refused") from None
    except Exception as exc:  # UsageError of a bad run name
        if isinstance(exc, IntegrityError):
            raise
        raise IntegrityError(f"{where}: {exc}; refused") from None
    return moves


def _set_class_in_place(move: dict) -> None:
    """Give an in-place move's object its tier's storage class (nothing if the tier sets none)."""
    if move["storage_class"]:
        set_storage_class(storage.resolve(move["dst"]["root"]).join(move["dst"]["rel"]), move["storage_class"])


def _skip_reason(moves: list[dict]) -> str | None:
    """Why a checkpoint planned as `moves` is left where it is (files in an archive class that
    would have to be copied, a file reached through a symlink), else None. A dry run asks it
    too, so it reports what an apply would do."""
    blocked = [m["name"] for m in moves if m["src_storage_class"] in ARCHIVE_CLASSES and not m["in_place"]]
    if blocked:
        return f"{len(blocked)} file(s) in an archive class; thaw them to move them"
    for move in moves:
        for side in ("src", "dst"):
            link = storage.through_link(storage.resolve(move[side]["root"]), move[side]["rel"])
            if link:
                return f"{move[side]['root']}/{link} is a symlink (never followed)"
    return None


def move_checkpoint(store: Location, manifest: dict, target: str, settings: LifecycleSettings, trash_id: str,
                    roots: list[str] | None = None, held=None, holder: str | None = None) -> dict:
    """Move one checkpoint's data files to `target` (see the module doc); returns what was done.

    `held`: the run's lease, checked before the manifest switch (the point of no return);
    `holder`: its holder, recorded in the journal (a retry of the same holder reports the move).
    """
    roots = roots if roots is not None else journaled.roots(store, settings)
    run, step = manifest["run"], manifest["step"]
    moves = _plan_moves(store, manifest, target, settings)
    reason = _skip_reason(moves)
    if reason:
        return {"run": run, "step": step, "to": target, "action": "skipped", "reason": reason}
    if all(m["in_place"] for m in moves):
        for move in moves:
            _set_class_in_place(move)
        if held:
            held.check()
        _switch(store, run, step, manifest["id"], moves, target, roots)
        return {"run": run, "step": step, "to": target, "action": "moved", "files": len(moves)}
    for root in sorted({m["dst"]["root"] for m in moves if not m["in_place"]}):
        tier_marks.ensure(store, root, target)  # never onto an unmounted volume's mountpoint
    retires = [m["src"]["rel"] for m in moves if m["src"]["root"] == store.uri and not m["in_place"]]
    external = [{**m["src"], "delete": False} for m in moves if m["src"]["root"] != store.uri and not m["in_place"]]
    entry = journals.Journal.begin(
        store, journaled.new_id(journaled.TIER_KIND, run), journaled.TIER_KIND, [], retires,
        meta={"run": run, "step": step, "id": manifest["id"], "target": target, "moves": moves, "holder": holder},
        trash_id=trash_id, external=external, prune_empty_dirs=True,
    )
    for move in moves:
        if move["in_place"]:
            _set_class_in_place(move)
        else:
            copy_verified(FileRef(**move["src"]), FileRef(**move["dst"]), move["storage_class"])
        faults.point("ckpt.tier.copied")
    if held:
        held.check()
    _switch(store, run, step, manifest["id"], moves, target, roots)
    entry.commit(external_roots=roots)
    return {"run": run, "step": step, "to": target, "action": "moved", "files": len(moves)}


def _drop_copies(moves: list[dict]) -> None:
    """Delete the copies of a tiering step that never switched its manifest (nothing refers to them)."""
    for move in moves:
        if move["in_place"]:
            continue
        dst = storage.resolve(move["dst"]["root"])
        if storage.through_link(dst, move["dst"]["rel"]):
            continue
        path = dst.join(move["dst"]["rel"])
        if storage.is_file(dst.fs, path):
            dst.fs.delete_file(path)
        if not dst.is_s3:
            directory, name = posixpath.split(path)
            for leftover in storage.list_files(storage.resolve(directory), include_hidden=True):
                if posixpath.basename(leftover.path).startswith(f".{name}.copy-"):
                    dst.fs.delete_file(leftover.path)
            journals.prune_empty_dirs(dst, posixpath.dirname(move["dst"]["rel"]))


def recover(store: Location, run: str, roots: list[str]) -> list[dict]:
    """Finish the tiering attempts a killed run left on `run`: forward if the manifest switched,
    else back (the copies are removed). Call under the run's lease."""
    outcomes = []
    prefix = journaled.prefix(journaled.TIER_KIND, run)
    for entry in journals.pending(store, journaled.TIER_KIND, prefix):
        if entry.state != journals.WRITING:
            continue  # past the point of no return: journal.recover rolls it forward below
        try:
            moves = _checked_moves(store, entry, roots)
        except IntegrityError as exc:
            storage.move(store.fs, entry.path, store.join(journals.REFUSED_DIR, f"{entry.run_id}.json"))
            outcomes.append({"run_id": entry.run_id, "kind": entry.kind, "action": "refused", "reason": exc.message})
            continue
        if _switched(store, entry, roots):
            entry.commit(external_roots=roots)
            outcomes.append({"run_id": entry.run_id, "kind": entry.kind, "action": "rolled forward"})
        else:
            _drop_copies(moves)
            entry.rollback()
            outcomes.append({"run_id": entry.run_id, "kind": entry.kind, "action": "rolled back"})
    for item in journals.recover(store, journaled.TIER_KIND, prefix, external_roots=roots):
        outcomes.append({**item, "kind": journaled.TIER_KIND})
    return outcomes


# --------------------------------------------------------------------------- a pass over the store


def plan(store: Location, runs: list[str], settings: LifecycleSettings, now: datetime,
         usable: list[str] = TIERS, roots: list[str] | None = None,
         damaged: list[dict] | None = None) -> tuple[list[dict], list[dict]]:
    """(manifests, moves): each checkpoint whose desired tier (the coldest `usable` one up to the
    tier its age asks for) is colder than where it is. A run with a damaged manifest raises its
    IntegrityError or, given a `damaged` list, has it appended there and gets no moves."""
    found, moves = [], []
    for run in runs:
        restored = inventory.last_restored(store, run)
        if damaged is None:
            manifests = inventory.manifests(store, run, roots)
        else:
            manifests, broken = catalog.read_run(store, run, roots)
            if broken:
                damaged.extend(broken)
                found.extend(manifests)
                continue
        for manifest in manifests:
            found.append(manifest)
            if settings.tiers.keep_latest_hot and manifest is manifests[-1]:
                continue
            age = inventory.age_s(manifest, restored.get(manifest["step"]), now)
            current, wanted = inventory.tier_of(manifest), desired_tier(age, settings.tiers)
            wanted = max((t for t in usable if _rank(t) <= _rank(wanted)), key=_rank)
            if _rank(wanted) > _rank(current):
                moves.append({"run": run, "step": manifest["step"], "from": current, "to": wanted,
                              "bytes": inventory.stored_bytes(manifest), "age_s": round(age, 1), "_manifest": manifest})
    return found, moves


def _moved_earlier(store: Location, entries: list[journals.Journal], roots: list[str]) -> list[dict]:
    """The moves of the tiering attempts of `entries` (`journaled.finished_earlier`) as `moves`
    entries (`from` is not journaled: "earlier attempt"), for the checkpoints still where they put
    them: a retry reports that work once, as its own, instead of finding nothing left to move."""
    found = []
    for entry in entries:
        meta = entry.meta
        try:
            manifest = catalog.read_manifest(store, meta["run"], meta["step"], roots)
        except (IntegrityError, KeyError, TypeError, ValueError, UsageError):
            continue  # collected since, or a journal whose meta does not name a checkpoint
        if manifest["id"] == meta.get("id") and meta.get("target") in TIERS:
            found.append({"run": manifest["run"], "step": manifest["step"], "from": "earlier attempt",
                          "to": meta["target"], "bytes": inventory.stored_bytes(manifest), "age_s": None})
    return found


def _moved(manifest: dict, target: str, settings: LifecycleSettings) -> dict:
    """The manifest as it will be on `target` (for the cost report of a dry run)."""
    spec = settings.tiers.spec(target)
    files = {name: {**entry, "tier": target, "storage_class": spec.storage_class} for name, entry in manifest["files"].items()}
    return {**manifest, "files": files}


class TieringFailedError(SeedanceError):
    """Tiering of some runs failed; each was finished from its journal at once (back to where it
    was, or forward if its manifest had switched) and the other runs were tiered. `result` is the
    pass's report (`failed` lists each failure); exit code and retryability are the first one's."""

    result: dict | None = None


def failed_error(result: dict, first: SeedanceError) -> TieringFailedError:
    """The error a pass raises at its end for the failures in `result["failed"]` (`first`: the
    first one's error, whose hint, exit code and retryability it takes), naming the failed runs."""
    failed = result["failed"]
    runs = list(dict.fromkeys(item["run"] for item in failed))
    shown = "; ".join(
        f"{item['run']}" + (f"/{step_dir(item['step'])} -> {item['to']} ({item['location']})"
                            if item["step"] is not None else "")
        + f": {item['reason']} ({item['recovery']})" for item in failed[:5])
    more = f"; and {len(failed) - 5} more" if len(failed) > 5 else ""
    error = TieringFailedError(
        f"tiering failed for {len(runs)} run(s) ({', '.join(runs)}) of {result['store']}: {shown}{more}; "
        f"the other runs went on ({result['moved']} checkpoint(s) moved)",
        hint=(f"{first.hint}; " if first.hint else "") + "then tier again: a failed run was left where it was",
    )
    error.result, error.exit_code, error.retryable = result, first.exit_code, first.retryable
    return error


def _failed(store: Location, run: str, move: dict | None, exc: Exception, roots: list[str],
            settings: LifecycleSettings) -> tuple[dict, SeedanceError]:
    """The report entry of a run whose tiering raised `exc` (while moving `move`, or before any
    move), and the error it is reported as. Called under the run's lease: the attempt's journal
    is finished at once by `recover` (its copies removed); if that fails too, the next pass does."""
    from seedance_tasks.boundary import classify

    error = classify(exc)
    try:
        actions = sorted({item["action"] for item in recover(store, run, roots)})
        recovery = ", ".join(actions) if actions else "nothing to undo"
    except Exception as again:  # noqa: BLE001 - the run stays journaled; the next pass recovers it
        log.warning("tiering of run %s failed and could not be rolled back now", run, exc_info=True)
        recovery = f"left for the next pass to roll back ({classify(again).message})"
    where = {"step": None, "from": None, "to": None, "location": None} if move is None else {
        "step": move["step"], "from": move["from"], "to": move["to"],
        "location": settings.tiers.spec(move["to"]).uri or store.uri}
    return {"run": run, **where, "action": "failed", "reason": error.message, "recovery": recovery}, error


def tier(
    store_uri: str,
    runs: list[str] | None = None,
    *,
    settings: LifecycleSettings | None = None,
    apply: bool = False,
    now: datetime | None = None,
    trash_id: str | None = None,
    holder: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Move every checkpoint of `runs` (default: all) that is due to a colder tier; dry run unless `apply`.

    Returns {"store", "applied", "moves": [...], "moved", "bytes_moved", "cost": {"before", "after",
    "saving"}, "recovered", "skipped", "failed"}: `moves`, `moved` and `bytes_moved` are what was
    moved (a dry run: what an apply would move); a checkpoint due but left where it is, with why,
    is in `skipped` (a dry run lists what an apply would skip). With `apply`, each run is tiered
    under its lease, held as `holder` (default: this call's run id); LeaseHeldError if another
    holds it. A run whose tiering fails (a copy out of disk space, a bucket that does not exist)
    is rolled back at once and the other runs go on; then TieringFailedError names the failed
    runs, its `result` this report. `on_progress(done, total)` is called as runs are done.
    `moves` includes what an earlier attempt moved that no call reported: one killed past its
    point of no return (finished by this call's recovery), or one of the same `holder` (Airflow's
    retry of a task that failed after its work).
    """
    from seedance_tasks.lifecycle.gc import load_lifecycle_settings
    from seedance_tasks.lifecycle.gc import recover as recover_run

    settings = settings or load_lifecycle_settings()
    store = catalog.existing_store(store_uri)
    check_locations(store, settings.tiers)
    for name in ("warm", "cold"):
        if settings.tiers.spec(name).uri:
            tier_marks.check(store, settings.tiers.spec(name).uri, name)
    now = now or datetime.now(UTC)
    names = journaled.run_names(store, runs)
    usable = [name for name in TIERS if name == "hot" or settings.tiers.spec(name).uri or store.is_s3]
    notes = [
        f"tier {name} has no location and a local store has no storage classes: set lifecycle.tiers.{name}.uri"
        for name in TIERS if name not in usable
    ]
    roots = journaled.roots(store, settings)
    trash_id = trash_id or storage.new_run_id()  # real time: purge dates trash by it
    holder = holder or f"tier-{trash_id}"
    moves, skipped, recovered, damaged, failed, errors = [], [], [], [], [], []
    before, after = costs.Tally(settings), costs.Tally(settings)  # one run's manifests in memory at a time
    for index, run in enumerate(names):
        if on_progress:
            on_progress(index, len(names))
        if not apply:
            run_found, run_moves = plan(store, [run], settings, now, usable, roots, damaged)
            planned = {}
            for move in run_moves:  # what apply would leave where it is is reported, not counted
                reason = _skip_reason(_plan_moves(store, move.pop("_manifest"), move["to"], settings))
                if reason:
                    skipped.append({**{key: move[key] for key in ("run", "step", "to", "from")},
                                    "action": "skipped", "reason": reason})
                else:
                    planned[move["step"]] = move["to"]
                    moves.append(move)
            after.add(_moved(m, planned[m["step"]], settings) if m["step"] in planned else m for m in run_found)
            before.add(run_found)
            continue
        with journaled.run_lease(store, run, holder, "checkpoint tiering") as held:
            move = run_found = None
            try:  # a failure is this run's: it is rolled back and the other runs go on
                earlier = recover_run(store, run, roots)
                recovered.extend(earlier)
                moves.extend(_moved_earlier(
                    store, journaled.finished_earlier(store, journaled.TIER_KIND, run, holder, earlier), roots))
                run_found, run_moves = plan(store, [run], settings, now, usable, roots, damaged)
                before.add(run_found)
                for move in run_moves:
                    outcome = move_checkpoint(store, move.pop("_manifest"), move["to"], settings, trash_id, roots,
                                              held, holder)
                    if outcome["action"] == "moved":
                        moves.append(move)
                    else:
                        skipped.append({**outcome, "from": move["from"]})
                move = None
            except LeaseLostError:
                raise  # another holder has the run now: its recovery, not ours, finishes the journal
            except Exception as exc:  # noqa: BLE001 - reported below, once the other runs are done
                entry, error = _failed(store, run, move, exc, roots, settings)
                failed.append(entry)
                errors.append((error, exc))
            if run_found is not None:  # counted before: counted after, as it is now
                now_found, broken = catalog.read_run(store, run, roots)
                after.add(now_found)
                # one damaged since the plan: reported, and counted as it was (no saving claimed for it)
                listed = {(item["run"], item["step"]) for item in damaged}
                damaged.extend(item for item in broken if (item["run"], item["step"]) not in listed)
                lost = {item["step"] for item in broken}
                after.add(m for m in run_found if m["step"] in lost)
    if on_progress:
        on_progress(len(names), len(names))
    before, after = before.report(), after.report()
    result = {
        "store": store.uri,
        "applied": apply,
        "moves": moves,
        "moved": len(moves),
        "skipped": skipped,
        "failed": failed,
        "bytes_moved": sum(m["bytes"] for m in moves),
        "cost": {"before": before, "after": after, "saving": costs.saving(before, after)},
        "trash_id": trash_id if apply else None,
        "recovered": recovered,
        "notes": notes,
        "damaged": damaged,
    }
    if errors:
        raise failed_error(result, errors[0][0]) from errors[0][1]
    return result
