"""Publish-then-retire transactions that survive a crash at any point.

A run that replaces data records its intent first, in `<root>/_seedance/journal/<run-id>.json`:

1. `begin`: state `writing`, with the files it will publish (hidden staging name -> final name)
   and the files it will retire. The caller then writes and verifies the staged files.
2. `commit`: state `publishing` -- the point of no return -- then every staged file is published
   and only then every retired file is moved to the trash; state `done`, and the journal moves
   to `journal/done/`.

`recover` finishes what a killed run left: a `writing` journal is rolled back (its staged files,
which no reader sees, go to the trash), a `publishing` one is rolled forward. Every step is
idempotent, so a crash during recovery is recovered by the next run in turn. Readers may see
new and old files side by side only between publish and retire of a run that crashed there,
until the next run.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow.fs as pafs

from seedance_tasks import storage
from seedance_tasks.storage import Location

JOURNAL_DIR = f"{storage.SEEDANCE_DIR}/journal"
WRITING, PUBLISHING, DONE, ROLLED_BACK = "writing", "publishing", "done", "rolled_back"


@dataclass
class Journal:
    """One run's intent: which staged files become visible and which files retire to the trash."""

    root: Location
    run_id: str
    kind: str
    publishes: list[dict[str, str]] = field(default_factory=list)  # {"staged": rel, "final": rel}
    retires: list[str] = field(default_factory=list)  # relative paths
    state: str = WRITING
    meta: dict[str, Any] = field(default_factory=dict)
    trash_id: str | None = None  # trash folder of retired files; default run_id (runs may share one)

    @property
    def path(self) -> str:
        return self.root.join(JOURNAL_DIR, f"{self.run_id}.json")

    def _save(self) -> None:
        storage.write_json_atomic(
            self.root.fs,
            self.path,
            {
                "run_id": self.run_id,
                "kind": self.kind,
                "state": self.state,
                "publishes": self.publishes,
                "retires": self.retires,
                "meta": self.meta,
                "trash_id": self.trash_id,
                "updated_at": datetime.now(UTC).isoformat(),
            },
        )

    @classmethod
    def begin(
        cls,
        root: Location,
        run_id: str,
        kind: str,
        publishes: list[dict[str, str]],
        retires: list[str],
        meta: dict[str, Any] | None = None,
        trash_id: str | None = None,
    ) -> Journal:
        """Record the intent (state `writing`) before any staged file is written."""
        journal = cls(root, run_id, kind, list(publishes), list(retires), WRITING, dict(meta or {}), trash_id)
        journal._save()
        return journal

    def add_publish(self, staged: str, final: str) -> None:
        """Record one more staged file (before it is written), so a rollback finds it."""
        if self.state != WRITING:
            raise ValueError(f"journal {self.run_id} is {self.state}; files are added while writing")
        self.publishes.append({"staged": staged, "final": final})
        self._save()

    def commit(self) -> None:
        """Pass the point of no return, then publish and retire; safe to call again after a crash."""
        if self.state == WRITING:
            self.state = PUBLISHING
            self._save()
        self._roll_forward()

    def _roll_forward(self) -> None:
        fs = self.root.fs
        for item in self.publishes:
            storage.publish(fs, self.root.join(item["staged"]), self.root.join(item["final"]))
        for relative in self.retires:
            storage.move_to_trash(self.root, relative, self.trash_id or self.run_id)
        self._finish(DONE)

    def rollback(self) -> None:
        """Abandon a `writing` run: its staged files go to the trash, visible data is untouched."""
        if self.state != WRITING:
            raise ValueError(f"journal {self.run_id} is {self.state}; only a writing run rolls back")
        for item in self.publishes:
            if storage.is_file(self.root.fs, self.root.join(item["staged"])):
                storage.move_to_trash(self.root, item["staged"], self.trash_id or self.run_id)
        self._finish(ROLLED_BACK)

    def _finish(self, state: str) -> None:
        self.state = state
        self._save()
        storage.move(self.root.fs, self.path, self.root.join(JOURNAL_DIR, "done", f"{self.run_id}.json"))


def _load(root: Location, path: str) -> Journal:
    data = storage.read_json(root.fs, path)
    return Journal(
        root,
        data["run_id"],
        data["kind"],
        data["publishes"],
        data["retires"],
        data["state"],
        data.get("meta", {}),
        data.get("trash_id"),
    )


def pending(root: Location, kind: str | None = None) -> list[Journal]:
    """Journals of runs that did not finish (oldest first), optionally of one `kind`."""
    selector = pafs.FileSelector(root.join(JOURNAL_DIR), recursive=False, allow_not_found=True)
    journals = []
    for info in sorted(root.fs.get_file_info(selector), key=lambda item: item.path):
        name = posixpath.basename(info.path)
        if info.type != pafs.FileType.File or not name.endswith(".json") or name.startswith("."):
            continue
        journal = _load(root, info.path)
        if kind is None or journal.kind == kind:
            journals.append(journal)
    return journals


def recover(root: Location, kind: str | None = None) -> list[dict[str, str]]:
    """Finish or undo every interrupted run under `root`; returns what was done to each."""
    outcomes = []
    for journal in pending(root, kind):
        if journal.state == WRITING:
            journal.rollback()
            outcomes.append({"run_id": journal.run_id, "action": "rolled back"})
        elif journal.state == PUBLISHING:
            journal.commit()
            outcomes.append({"run_id": journal.run_id, "action": "rolled forward"})
        else:  # finished, but killed before its journal moved to done/
            journal._finish(journal.state)
            outcomes.append({"run_id": journal.run_id, "action": "closed"})
    return outcomes
