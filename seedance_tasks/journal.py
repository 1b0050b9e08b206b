"""Publish-then-retire transactions that survive a crash, a retry and a tampered journal.

A run that replaces data records its intent first, in `<root>/_seedance/journal/<run-id>.json`:

1. `begin`: state `writing`, with the files it will publish (hidden staging name -> final name)
   and the files it will retire. The caller then writes and verifies the staged files.
2. `commit`: state `publishing` -- the point of no return -- then every staged file is published
   and only then every retired file is moved to the trash; state `done`, and the journal moves
   to `journal/done/`.

`recover` finishes what a killed attempt left: a `writing` journal is rolled back (its staged
files, which no reader sees, go to the trash), a `publishing` one is rolled forward. Every step
is idempotent, so a crash during recovery is recovered by the next attempt in turn. A journal is
never overwritten: `begin` refuses an id that exists, so each attempt names its own journal and
files, and a new attempt first recovers the journals of the attempts before it.

Journals are untrusted input: `load` validates every field and confines every path to its root
(no `..`, no absolute path, and on local disk no symlink below the root on the way to the file);
a journal that fails is moved to `_seedance/quarantine/journals/` and reported, never obeyed.
Files under other roots (tier locations) are retired only when their root is one the caller
trusts (`external_roots`).
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow.fs as pafs

from seedance_tasks import faults, storage
from seedance_tasks.errors import IntegrityError
from seedance_tasks.storage import Location

log = logging.getLogger(__name__)

JOURNAL_DIR = f"{storage.SEEDANCE_DIR}/journal"
DONE_DIR = f"{JOURNAL_DIR}/done"
REFUSED_DIR = f"{storage.QUARANTINE_DIR}/journals"
WRITING, PUBLISHING, DONE, ROLLED_BACK = "writing", "publishing", "done", "rolled_back"
STATES = (WRITING, PUBLISHING, DONE, ROLLED_BACK)
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,199}$")


def _check_id(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _ID.match(value) or ".." in value:
        raise IntegrityError(f"{what}: {value!r} is not a valid id (letters, digits, . _ = -)")
    return value


@dataclass
class Journal:
    """One attempt's intent: which staged files become visible and which files retire to the trash."""

    root: Location
    run_id: str
    kind: str
    publishes: list[dict[str, Any]] = field(default_factory=list)  # {"staged", "final", "replace"?}
    retires: list[str] = field(default_factory=list)  # relative paths
    state: str = WRITING
    meta: dict[str, Any] = field(default_factory=dict)
    trash_id: str | None = None  # trash folder of retired files; default run_id (runs may share one)
    external: list[dict[str, Any]] = field(default_factory=list)  # {"root": uri, "rel", "delete"}
    prune_empty_dirs: bool = False
    outcome: dict[str, int] = field(default_factory=dict)  # what the roll forward found

    @property
    def path(self) -> str:
        return self.root.join(JOURNAL_DIR, f"{self.run_id}.json")

    @property
    def trash(self) -> str:
        return self.trash_id or self.run_id

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "kind": self.kind,
            "state": self.state,
            "publishes": self.publishes,
            "retires": self.retires,
            "external": self.external,
            "meta": self.meta,
            "trash_id": self.trash_id,
            "prune_empty_dirs": self.prune_empty_dirs,
            "updated_at": datetime.now(UTC).isoformat(),
        }

    def _save(self, *, first: bool = False) -> None:
        """Write the journal; after `begin`, only while it is still pending where we left it.

        An attempt presumed dead may wake up after a newer attempt closed (recovered) its journal:
        it must not write the journal back into `journal/` and resurrect what was undone.
        """
        if not first and not storage.is_file(self.root.fs, self.path):
            raise IntegrityError(
                f"journal {self.run_id} under {self.root.uri} was closed by another attempt "
                "(a retry recovered it); this attempt stops without changing anything more",
                hint="nothing to do: the attempt that recovered it has finished or undone this work",
            )
        storage.write_json_atomic(self.root.fs, self.path, self.to_json())

    @classmethod
    def begin(
        cls,
        root: Location,
        run_id: str,
        kind: str,
        publishes: list[dict[str, Any]],
        retires: list[str],
        meta: dict[str, Any] | None = None,
        trash_id: str | None = None,
        *,
        external: list[dict[str, Any]] | None = None,
        prune_empty_dirs: bool = False,
    ) -> Journal:
        """Record the intent (state `writing`) before any staged file is written.

        Raises IntegrityError if a journal of that id exists already, pending or done: an
        attempt never overwrites the journal of another.
        """
        storage.refuse_linked_state(root, JOURNAL_DIR)
        journal = cls(root, _check_id(run_id, "journal id"), kind, [], [], WRITING, dict(meta or {}),
                      trash_id, [], prune_empty_dirs)
        journal.publishes = [_publish_entry(item, f"journal {run_id}", root) for item in publishes]
        journal.retires = [storage.confine(rel, what=f"journal {run_id} retires", root=root) for rel in retires]
        journal.external = [_external_entry(item, f"journal {run_id}") for item in external or []]
        if find(root, run_id) is not None:
            raise IntegrityError(
                f"journal {run_id} already exists under {root.uri}; an attempt never overwrites another's",
                hint="give each attempt its own journal id; recover() finishes the earlier one",
            )
        journal._save(first=True)
        faults.point("journal.begun")
        return journal

    def add_publish(self, staged: str, final: str, *, replace: bool = False) -> None:
        """Record one more staged file (before it is written), so a rollback finds it."""
        if self.state != WRITING:
            raise ValueError(f"journal {self.run_id} is {self.state}; files are added while writing")
        self.publishes.append(_publish_entry({"staged": staged, "final": final, "replace": replace},
                                             f"journal {self.run_id}", self.root))
        self._save()

    def commit(self, *, external_roots: Collection[str] = ()) -> None:
        """Pass the point of no return, then publish and retire; safe to call again after a crash.

        The staged files reach the disk (fsync) before the point of no return, so a power loss
        after it never leaves a published file empty while what it replaced sits in the trash."""
        if self.state == WRITING:
            storage.make_durable(self.root.fs, [self.root.join(item["staged"]) for item in self.publishes])
            self.state = PUBLISHING
            try:
                self._save()
            except IntegrityError:
                self.state = WRITING  # never passed the point of no return
                raise
            faults.point("journal.publishing")
        if self.state != PUBLISHING:
            raise ValueError(f"journal {self.run_id} is {self.state}; nothing to commit")
        self._roll_forward(external_roots)

    def check_external(self, external_roots: Collection[str]) -> None:
        """IntegrityError unless every external retire lies under one of the trusted roots, and
        (on local disk) reaches its file without passing through a symlink below that root."""
        trusted = {_normal_root(uri) for uri in external_roots}
        for item in self.external:
            if _normal_root(item["root"]) not in trusted:
                raise IntegrityError(
                    f"journal {self.run_id} under {self.root.uri} retires a file under {item['root']}, "
                    "which is not one of this store's configured locations; refused",
                    hint="the journal was edited by someone else; move it away, nothing was changed",
                )
            storage.refuse_symlinks(storage.resolve(item["root"]), item["rel"],  # S3: nothing to check
                                    what=f"journal {self.root.uri_of(self.path)} external.rel")

    def _roll_forward(self, external_roots: Collection[str]) -> None:
        self.check_external(external_roots)  # refuse before anything moves
        fs = self.root.fs
        for item in self.publishes:
            staged, final = self.root.join(item["staged"]), self.root.join(item["final"])
            if item.get("replace") and storage.is_file(fs, staged) and storage.is_file(fs, final):
                storage.move_to_trash(self.root, item["final"], self.trash)  # the old version
            storage.publish(fs, staged, final, replace=bool(item.get("replace")))
        gone = 0
        for relative in self.retires:
            gone += not _retire(self.root, relative, self.trash, delete=False)
            if self.prune_empty_dirs:
                prune_empty_dirs(self.root, posixpath.dirname(relative))
        for item in self.external:
            other = storage.resolve(item["root"])
            gone += not _retire(other, item["rel"], self.trash, delete=bool(item.get("delete")))
            if self.prune_empty_dirs:
                prune_empty_dirs(other, posixpath.dirname(item["rel"]))
        if gone:
            log.info("journal %s: %d retired file(s) were already gone (an earlier attempt retired them)",
                     self.run_id, gone)
        self.outcome = {"already_gone": gone}
        self._finish(DONE)

    def rollback(self) -> None:
        """Abandon a `writing` run: its staged files go to the trash, visible data is untouched."""
        if self.state != WRITING:
            raise ValueError(f"journal {self.run_id} is {self.state}; only a writing run rolls back")
        for item in self.publishes:
            if storage.is_file(self.root.fs, self.root.join(item["staged"])):
                storage.move_to_trash(self.root, item["staged"], self.trash)
        self._finish(ROLLED_BACK)

    def _finish(self, state: str) -> None:
        self.state = state
        self._save()
        storage.move(self.root.fs, self.path, self.root.join(DONE_DIR, f"{self.run_id}.json"))
        faults.point("journal.closed")


def _retire(root: Location, relative: str, trash_id: str, *, delete: bool) -> bool:
    """Retire one file (to the trash, or deleted); False if it was already gone from both places."""
    path = root.join(relative)
    if delete:
        faults.point("journal.delete.before")
        if storage.is_file(root.fs, path):
            root.fs.delete_file(path)
            return True
        return False
    try:
        storage.move_to_trash(root, relative, trash_id)
    except IntegrityError:  # neither in place nor in the trash: retired before, trash purged since
        return False
    return True


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


def _normal_root(uri: str) -> str:
    return storage.resolve(uri).uri.rstrip("/")


def _publish_entry(item: Any, what: str, root: Location) -> dict[str, Any]:
    if not isinstance(item, dict) or not isinstance(item.get("staged"), str) or not isinstance(item.get("final"), str):
        raise IntegrityError(f"{what}: a publish entry must be {{'staged': path, 'final': path}}, got {item!r}")
    staged = storage.confine(item["staged"], what=f"{what} publishes.staged", root=root)
    if not storage.is_hidden(staged):
        raise IntegrityError(f"{what}: staged file {staged!r} is not hidden (`_`/`.` prefix); refused")
    entry: dict[str, Any] = {"staged": staged,
                             "final": storage.confine(item["final"], what=f"{what} publishes.final", root=root)}
    if item.get("replace"):
        entry["replace"] = True
    return entry


def _external_entry(item: Any, what: str) -> dict[str, Any]:
    if not isinstance(item, dict) or not isinstance(item.get("root"), str) or not isinstance(item.get("rel"), str):
        raise IntegrityError(f"{what}: an external entry must be {{'root': uri, 'rel': path}}, got {item!r}")
    return {"root": item["root"], "rel": storage.confine(item["rel"], what=f"{what} external.rel"),
            "delete": bool(item.get("delete", False))}


def load(root: Location, path: str) -> Journal:
    """The journal at `path`, validated; IntegrityError naming the file and field if it is not sound."""
    where = root.uri_of(path)
    try:
        data = storage.read_json(root.fs, path)
    except ValueError as exc:
        raise IntegrityError(f"journal {where} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise IntegrityError(f"journal {where} must hold an object")
    run_id = _check_id(data.get("run_id"), f"journal {where} run_id")
    if posixpath.basename(path) != f"{run_id}.json":
        raise IntegrityError(f"journal {where}: its run_id {run_id!r} does not match its file name")
    state = data.get("state")
    if state not in STATES:
        raise IntegrityError(f"journal {where}: state {state!r} is not one of {', '.join(STATES)}")
    kind = data.get("kind")
    if not isinstance(kind, str) or not kind:
        raise IntegrityError(f"journal {where}: kind must be a non-empty string")
    trash_id = data.get("trash_id")
    if trash_id is not None:
        _check_id(trash_id, f"journal {where} trash_id")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise IntegrityError(f"journal {where}: meta must be an object")
    lists = {name: data.get(name, []) for name in ("publishes", "retires", "external")}
    for name, value in lists.items():
        if not isinstance(value, list):
            raise IntegrityError(f"journal {where}: {name} must be a list")
    return Journal(
        root, run_id, kind,
        [_publish_entry(item, f"journal {where}", root) for item in lists["publishes"]],
        [storage.confine(rel, what=f"journal {where} retires", root=root) for rel in lists["retires"]],
        state, meta, trash_id,
        [_external_entry(item, f"journal {where}") for item in lists["external"]],
        bool(data.get("prune_empty_dirs", False)),
    )


def _scan(root: Location) -> tuple[list[Journal], list[tuple[str, str]]]:
    selector = pafs.FileSelector(root.join(JOURNAL_DIR), recursive=False, allow_not_found=True)
    journals, refused = [], []
    for info in sorted(root.fs.get_file_info(selector), key=lambda item: item.path):
        name = posixpath.basename(info.path)
        if info.type != pafs.FileType.File or not name.endswith(".json") or name.startswith("."):
            continue
        try:
            journals.append(load(root, info.path))
        except IntegrityError as exc:
            refused.append((info.path, exc.message))
    return journals, refused


def pending(root: Location, kind: str | None = None, prefix: str | None = None) -> list[Journal]:
    """Valid journals of attempts that did not finish (oldest first), of one `kind`/id `prefix`."""
    journals, _ = _scan(root)
    return [journal for journal in journals
            if (kind is None or journal.kind == kind) and (prefix is None or journal.run_id.startswith(prefix))]


def find(root: Location, run_id: str) -> Journal | None:
    """The journal `run_id`, pending or done, or None if there is none."""
    for directory in (JOURNAL_DIR, DONE_DIR):
        path = root.join(directory, f"{run_id}.json")
        if storage.is_file(root.fs, path):
            return load(root, path)
    return None


def recover(root: Location, kind: str | None = None, prefix: str | None = None, *,
            external_roots: Collection[str] = ()) -> list[dict[str, str]]:
    """Finish or undo every interrupted attempt under `root`; returns what was done to each.

    Only journals of `kind` whose id starts with `prefix` are touched (a mapped task recovers
    its own, never a live sibling's). A journal that fails validation is moved to
    `_seedance/quarantine/journals/` and reported as refused.
    """
    journals, refused = _scan(root)
    selected = []
    for journal in journals:
        if (kind is not None and journal.kind != kind) or (prefix is not None and not journal.run_id.startswith(prefix)):
            continue
        try:
            journal.check_external(external_roots)
        except IntegrityError as exc:
            refused.append((journal.path, exc.message))
            continue
        selected.append(journal)
    outcomes = []
    for path, reason in refused:
        name = posixpath.basename(path)
        if prefix is not None and not name.startswith(prefix):
            continue
        storage.move(root.fs, path, root.join(REFUSED_DIR, name))
        log.error("refused journal %s: %s", root.uri_of(path), reason)
        outcomes.append({"run_id": name.removesuffix(".json"), "action": "refused", "reason": reason})
    for journal in selected:
        if journal.state == WRITING:
            journal.rollback()
            outcomes.append({"run_id": journal.run_id, "action": "rolled back"})
        elif journal.state == PUBLISHING:
            journal.commit(external_roots=external_roots)
            outcomes.append({"run_id": journal.run_id, "action": "rolled forward"})
        else:  # finished, but killed before its journal moved to done/
            journal._finish(journal.state)
            outcomes.append({"run_id": journal.run_id, "action": "closed"})
    return outcomes


def purge_trash(root: Location, older_than_s: float, *, now: datetime | None = None, apply: bool = True) -> dict:
    """`storage.purge_trash`, keeping the trash of every attempt whose journal is still pending.

    Finished journals older than `older_than_s` go too (a retry looks its predecessor up within
    minutes, not weeks); the count is in `journals_purged`.
    """
    now = now or datetime.now(UTC)
    journals, _ = _scan(root)
    result = storage.purge_trash(root, older_than_s, now=now, apply=apply,
                                 keep={journal.trash for journal in journals})
    old = [info for info in storage.list_files(root.child(DONE_DIR), include_hidden=True)
           if info.mtime is not None and (now - info.mtime.astimezone(UTC)).total_seconds() >= older_than_s]
    if apply:
        for info in old:
            root.fs.delete_file(info.path)
    result["journals_purged"] = len(old)
    return result
