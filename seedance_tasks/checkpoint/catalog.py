"""The checkpoint catalog: which checkpoints a store holds, their manifests, commits, tags, restores.

The one place that reads, commits and rewrites manifests (`manifest.parse` validates each read),
so the lifecycle (GC, tiering, thaw) is a client of this module and never touches a manifest's
bytes itself. Committing a step is an exclusive create: on local disk a complete temp manifest
hard-linked to `manifest.json` (fails if one is there), on S3 a PUT with `If-None-Match: *`. Of
two saves of one step exactly one commits; the other learns it and removes its own files.

Symlinks are never followed: a run folder, step folder or manifest that is a symlink is not a
checkpoint of this store (it is logged once and left alone), so nothing outside the store is
listed, tiered or collected through one.

Restore records (`STORE/_seedance/restored/<run>/step-<N>.json`) note when a checkpoint was last
restored (tiering counts age from then), so a restore never rewrites a manifest.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Iterable
from datetime import UTC, datetime

import pyarrow.fs as pafs

from seedance_tasks import faults, storage
from seedance_tasks.checkpoint.manifest import (
    MANIFEST,
    STEP_DIR,
    file_ref,
    manifest_rel,
    parse,
    seal,
    step_dir,
    to_bytes,
    trusted_roots,
)
from seedance_tasks.errors import IntegrityError, InternalError, RefusedError, UsageError
from seedance_tasks.storage import Location

log = logging.getLogger(__name__)
RESTORED_DIR = f"{storage.SEEDANCE_DIR}/restored"
ARCHIVE_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})  # need a restore request before a GET
_warned: set[str] = set()


def check_run_name(run: str) -> str:
    """`run` if it is one plain path component; UsageError otherwise."""
    if not isinstance(run, str) or not run or run.startswith((".", "_")) or "/" in run or "\\" in run \
            or "\x00" in run or run in {".", ".."}:
        raise UsageError(f"bad run name {run!r}", hint="a run is one path component, not starting with . or _")
    return run


def check_store_uri(uri: object, what: str = "store") -> str:
    """`uri` if it names a store the same way on every machine: an absolute local path,
    `file:///...` or `s3://bucket/...`. UsageError naming `what` otherwise: a relative path would
    resolve against the working folder of whichever process reads it (an Airflow worker's is not
    the user's), so checkpoints would be written, or looked for, somewhere nobody chose."""
    if not isinstance(uri, str) or not uri.strip():
        raise UsageError(f"{what} {uri!r} is not a path or URI", hint="give an absolute path, file:///path or "
                         "s3://bucket/prefix")
    if "://" not in uri and not os.path.isabs(os.path.expanduser(uri)):
        raise UsageError(f"{what} {uri!r} is a relative path: it would be taken from the working folder of the "
                         "process that runs it, which is not yours", hint="give an absolute path, file:///path or "
                         "s3://bucket/prefix")
    return uri


def _warn_link(where: str) -> None:
    if where not in _warned:
        _warned.add(where)
        log.warning("skipping symlink %s in a checkpoint store (never followed)", where)


def is_link(store: Location, rel: str) -> bool:
    """True if `rel` below a local store is a symlink (S3 has none)."""
    return not store.is_s3 and os.path.islink(store.join(rel))


class DamagedManifestsError(IntegrityError):
    """Some manifests could not be read; the pass went on with the others (what it did is in its
    result) and fails at its end. A retry cannot fix it: a person moves or restores them."""

    retryable = False


def existing_store(store_uri: str) -> Location:
    """The store at `store_uri`, if it is there: a local path that is not a folder (a mistyped
    --store, an unmounted disk) is a UsageError, not an empty store. An S3 prefix is not checked
    (S3 cannot tell an empty prefix from a missing one), but its bucket must exist: a misspelt or
    deleted bucket is a UsageError, not a store with nothing to do. Saving creates a store;
    reading needs one."""
    store = storage.resolve(store_uri)
    if store.is_s3:
        bucket = store.path.split("/", 1)[0]
        try:
            missing = store.fs.get_file_info(bucket).type == pafs.FileType.NotFound
        except OSError:  # not allowed to ask (a policy granting only the prefix): the first read tells
            missing = False
        if missing:
            raise UsageError(f"checkpoint store {store.uri}: bucket {bucket!r} does not exist",
                             hint="check the bucket name in --store (or lifecycle.store / checkpoint.store) and "
                             "the AWS account and endpoint it is read with")
    if not store.is_s3 and not os.path.isdir(store.path):
        what = "is a file, not a folder" if os.path.exists(store.path) else "does not exist"
        raise UsageError(f"checkpoint store {store.uri} {what}",
                         hint="check the --store path (or lifecycle.store / checkpoint.store); a store is created "
                         "by its first save (`seedance ckpt put`, checkpoint.save)")
    return store


def damaged_entry(store: Location, run: str, step: int, exc: IntegrityError) -> dict:
    """{store, run, step, manifest, error, hint} of a manifest that could not be read (for reports)."""
    return {"store": store.uri, "run": run, "step": int(step), "manifest": store.uri_of(manifest_path(store, run, step)),
            "error": exc.message, "hint": exc.hint or f"seedance ckpt verify --store {store.uri} --run {run} "
            f"--step {step} says what is wrong"}


def damaged_error(damaged: list[dict], what: str) -> DamagedManifestsError:
    """The error a pass raises (or the CLI reports) at its end for `damaged` manifests; `what`
    says what was done with their runs ("left out of the listing", "nothing of it was collected")."""
    first = damaged[0]
    more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
    return DamagedManifestsError(
        f"{len(damaged)} damaged manifest(s): {first['error']}{more}; {what}",
        hint=f"{first['hint']}; `seedance ckpt verify --store {first['store']} --run {first['run']}` checks the rest of the run",
    )


# --------------------------------------------------------------------------- listing


def runs(store: Location) -> list[str]:
    """Run names in the store: folders, not hidden, not symlinks."""
    if not store.is_s3:
        try:
            entries = list(os.scandir(store.path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = []
        for entry in entries:
            if storage.is_hidden(entry.name):
                continue
            if entry.is_symlink():
                _warn_link(entry.path)
            elif entry.is_dir(follow_symlinks=False):
                found.append(entry.name)
        return sorted(found)
    selector = pafs.FileSelector(store.path, recursive=False, allow_not_found=True)
    return sorted(
        posixpath.basename(info.path)
        for info in store.fs.get_file_info(selector)
        if info.type == pafs.FileType.Directory and not storage.is_hidden(posixpath.basename(info.path))
    )


def committed_steps(store: Location, run: str) -> list[int]:
    """The committed steps of `run` (those with a manifest), ascending; symlinks are skipped."""
    check_run_name(run)
    if is_link(store, run):
        _warn_link(store.join(run))
        return []
    listing = storage.list_tree(store.child(run))
    for link in listing.symlinks:
        _warn_link(store.join(run, link))
    steps = set()
    for info in listing.files:
        parent, name = posixpath.split(store.child(run).relative(info.path))
        match = STEP_DIR.match(parent)
        if name == MANIFEST and match:
            steps.add(int(match.group(1)))
    return sorted(steps)


def stray_files(store: Location, run: str, committed: Iterable[dict]) -> list[dict]:
    """Files in `run`'s step folders that no committed manifest names: what interrupted saves left
    (a step folder without a manifest, the losing attempt's `data-<attempt>-*` files, a temp
    manifest). `committed`: the run's parsed manifests. Each as {"rel", "bytes", "mtime"}
    (mtime: a UTC datetime or None); symlinks are neither listed nor followed."""
    check_run_name(run)
    if is_link(store, run):
        return []
    named = set()
    for manifest in committed:
        named.add(manifest_rel(run, manifest["step"]))
        named.update(ref.rel for ref in (file_ref(store, manifest, name) for name in manifest["files"])
                     if ref.root == store.uri)
    strays = []
    for info in storage.list_tree(store.child(run), include_hidden=True).files:
        rel = posixpath.join(run, store.child(run).relative(info.path))
        folder = posixpath.dirname(rel)
        if posixpath.dirname(folder) != run or not STEP_DIR.match(posixpath.basename(folder)) or rel in named:
            continue
        strays.append({"rel": rel, "bytes": int(info.size or 0),
                       "mtime": info.mtime.astimezone(UTC) if info.mtime else None})
    return strays


def manifest_path(store: Location, run: str, step: int) -> str:
    return store.join(manifest_rel(run, step))


def read_manifest(store: Location, run: str, step: int, roots: Iterable[str] | None = None) -> dict:
    """The validated manifest of a committed checkpoint; IntegrityError if missing, unreadable or
    refused. `roots`: the trusted roots of data files (default `manifest.trusted_roots`)."""
    check_run_name(run)
    path = manifest_path(store, run, step)
    if is_link(store, run) or is_link(store, posixpath.join(run, step_dir(step))) or is_link(store, manifest_rel(run, step)):
        raise IntegrityError(f"checkpoint {run}/{step_dir(step)} in {store.uri} is reached through a symlink; refused",
                             hint="a store holds its checkpoints itself; replace the symlink by the folder")
    try:
        raw = storage.read_bytes(store.fs, path)
    except FileNotFoundError:
        raise IntegrityError(
            f"checkpoint {run}/{step_dir(step)} is missing (no {path})",
            hint=f"`seedance ckpt ls --store {store.uri} --run {run}` lists what is stored",
        ) from None
    return parse(raw, where=store.uri_of(path), run=run, step=step,
                 roots=list(roots) if roots is not None else trusted_roots(store.uri))


def manifests(store: Location, run: str, roots: Iterable[str] | None = None) -> list[dict]:
    """Validated manifests of every committed checkpoint of `run`, by step; IntegrityError on the
    first one that cannot be read (`read_run` goes on past it)."""
    roots = list(roots) if roots is not None else trusted_roots(store.uri)
    return [read_manifest(store, run, step, roots) for step in committed_steps(store, run)]


def read_run(store: Location, run: str, roots: Iterable[str] | None = None) -> tuple[list[dict], list[dict]]:
    """(validated manifests of `run` by step, `damaged_entry` of each one that could not be read).

    Never raises for a damaged manifest: the caller decides (a listing shows the others; GC and
    tiering leave the whole run alone). A manifest removed since it was listed is left out.
    """
    roots = list(roots) if roots is not None else trusted_roots(store.uri)
    found, damaged = [], []
    for step in committed_steps(store, run):
        try:
            found.append(read_manifest(store, run, step, roots))
        except IntegrityError as exc:
            if storage.is_file(store.fs, manifest_path(store, run, step)):
                damaged.append(damaged_entry(store, run, step, exc))
    return found, damaged


# --------------------------------------------------------------------------- commit and rewrite


def commit_manifest(store: Location, manifest: dict) -> bool:
    """Commit a new checkpoint: create its manifest exclusively. False if the step has one already.

    Local disk: a complete temp file hard-linked to the name, then its folder flushed to the disk;
    S3: `If-None-Match: *`.
    """
    path = manifest_path(store, manifest["run"], manifest["step"])
    sealed = seal(manifest)
    try:  # what is committed must read back: the writer never leaves a manifest the reader refuses
        parse(sealed, where=store.uri_of(path), run=manifest["run"], step=manifest["step"], roots=[store.uri])
    except IntegrityError as exc:
        raise InternalError(f"checkpoint {manifest['run']}/{step_dir(manifest['step'])} was not committed: its "
                            f"manifest would not read back ({exc.message})",
                            hint="nothing was committed; report this with the message") from None
    raw = to_bytes(sealed)
    faults.point("ckpt.commit.before")
    if store.is_s3:
        created = _put_if_absent(path, raw)
    else:
        temp = storage.hidden_sibling(path)
        try:
            with open(temp, "wb") as handle:
                handle.write(raw)
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.link(temp, path)
                created = True
            except FileExistsError:
                created = False
        finally:
            if os.path.exists(temp):
                os.unlink(temp)
        if created:  # the new name on disk too: a save that returned survives a power loss
            storage.make_durable(store.fs, [path])
    faults.point("ckpt.commit.after")
    return created


def _put_if_absent(path: str, raw: bytes) -> bool:
    from botocore.exceptions import ClientError

    bucket, _, key = path.partition("/")
    try:
        storage.boto3_client("s3").put_object(Bucket=bucket, Key=key, Body=raw, ContentType="application/json",
                                              IfNoneMatch="*")
        return True
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code", "") in ("PreconditionFailed", "ConditionalRequestConflict",
                                                              "412", "409"):
            return False
        raise


def replace_manifest(store: Location, manifest: dict, roots: Iterable[str] | None = None) -> None:
    """Rewrite a committed manifest (tiering, tags) atomically, after checking it is valid and that
    the stored one is still the same checkpoint (same id). Callers hold the run's lease."""
    roots = list(roots) if roots is not None else trusted_roots(store.uri)
    path = manifest_path(store, manifest["run"], manifest["step"])
    checked = parse(dict(manifest), where=store.uri_of(path), run=manifest["run"], step=manifest["step"], roots=roots)
    current = read_manifest(store, manifest["run"], manifest["step"], roots)
    if current["id"] != checked["id"]:
        raise IntegrityError(f"{manifest['run']}/{step_dir(manifest['step'])} was replaced while it was being changed",
                             hint="run again: the new checkpoint is planned afresh")
    faults.point("ckpt.manifest.replace.before")
    storage.write_bytes_atomic(store.fs, path, to_bytes(checked))
    faults.point("ckpt.manifest.replace.after")


def set_tags(store_uri: str, run: str, step: int, add: Iterable[str] = (), remove: Iterable[str] = ()) -> dict:
    """Add/remove tags of a committed checkpoint (GC keeps tagged ones); returns its tags."""
    store = storage.resolve(store_uri)
    manifest = read_manifest(store, run, int(step))
    tags = (set(manifest.get("tags") or []) | {t for t in add if t}) - set(remove)
    if sorted(tags) != manifest.get("tags"):
        manifest["tags"] = sorted(tags)
        replace_manifest(store, manifest)
    return {"store": store.uri, "run": run, "step": int(step), "tags": sorted(tags)}


# --------------------------------------------------------------------------- restore records


def restored_rel(run: str, step: int) -> str:
    return posixpath.join(RESTORED_DIR, run, f"{step_dir(step)}.json")


def record_restore(store: Location, run: str, step: int, when: datetime | None = None) -> None:
    """Note that `run`/`step` was just restored (tiering counts a checkpoint's age from then)."""
    when = when or datetime.now(UTC)
    storage.write_json_atomic(store.fs, store.join(restored_rel(run, step)),
                              {"run": run, "step": int(step), "at": when.isoformat()})


def last_restored(store: Location, run: str) -> dict[int, datetime]:
    """{step: time of its last restore} for the steps of `run` restored since they were saved."""
    selector = pafs.FileSelector(store.join(RESTORED_DIR, check_run_name(run)), recursive=False, allow_not_found=True)
    found = {}
    for info in store.fs.get_file_info(selector):
        match = STEP_DIR.match(posixpath.basename(info.path).removesuffix(".json"))
        if info.type != pafs.FileType.File or not match:
            continue
        try:
            found[int(match.group(1))] = datetime.fromisoformat(storage.read_json(store.fs, info.path)["at"])
        except (ValueError, KeyError, TypeError, OSError):
            continue
    return found


def note_restore(store: Location, run: str, step: int) -> None:
    """Record a restore if `lifecycle.record_restores` (called by the reader); never raises."""
    try:
        from seedance_tasks.config import load_settings

        if load_settings().lifecycle.record_restores:
            record_restore(store, run, step)
    except Exception:  # a read-only store or a bad config must not fail the restore itself
        log.debug("could not record the restore of %s/%s", run, step, exc_info=True)


# --------------------------------------------------------------------------- archive classes


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

    Returns quietly if the object is not archived (the caller then reports its own error).
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
            f"data file {where} of {run}/{step_dir(step)} is in {found['storage_class']} (archive): "
            f"not readable until restored; {waiting}",
            hint=f"seedance ckpt thaw --store {store_uri} --run {run} --step {step}  (then retry once it is restored)",
        )
