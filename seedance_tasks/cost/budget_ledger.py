"""The budget ledger: every action the cost actions workflow took or decided, one typed JSON file
under the cost outputs root (`OUT/_seedance/cost/budget-ledger.json`), read by the dashboard.

One entry per action key (`isolate:2024-08:i-…`, `confirm:2024-08:alpha`,
`deduct:2024-08:alpha:USD`, `freeze:alpha:2024-09`…): a key is recorded once, so a retried task
or a re-run month finds what was done and does it no second time. The file carries a SHA-256 of
its entries: a file edited by hand (or truncated) is refused with the reason, never half-read.
Updates hold the ledger's lease (`OUT/_seedance/leases/budget-ledger.json`, so concurrent tasks
of one run, e.g. two owners answering at once, never lose each other's entries) and replace the
file atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from pydantic import Field, ValidationError, field_serializer

from seedance_tasks import lease, storage
from seedance_tasks.cost.workdays import MONTH_PATTERN
from seedance_tasks.errors import InputError, IntegrityError
from seedance_tasks.settings_base import StrictModel
from seedance_tasks.storage import Location

FORMAT = "seedance.budget-ledger/1"
LEDGER_PATH = f"{storage.SEEDANCE_DIR}/cost/budget-ledger.json"
LEASE_NAME = "budget-ledger"
Kind = Literal["anchor", "isolation", "flag", "confirmation", "deduction", "freeze"]


class LedgerTamperedError(IntegrityError):
    """The ledger's content does not match its checksum: edited outside Seedance."""

    retryable = False


class Entry(StrictModel):
    """One action: what (`kind`), for which month and owner, how much (with currency)."""

    key: str = Field(..., min_length=1)
    kind: Kind
    month: str = Field(..., pattern=MONTH_PATTERN)
    owner: str | None = None
    amount: Decimal | None = Field(None, description="money; a deduction is positive, the charge rounded half-up "
                                 "to the currency's minor unit (`money.rounded`)")
    currency: str | None = Field(None, pattern=r"^[A-Z]{3}$")
    at: datetime
    details: dict[str, Any] = Field(default_factory=dict)

    @field_serializer("amount")
    def _amount(self, value: Decimal | None) -> str | None:
        return None if value is None else format(value, "f")


class LedgerFile(StrictModel):
    """The on-disk document: format tag, entries in the order recorded, checksum of the entries."""

    format: Literal["seedance.budget-ledger/1"]
    entries: list[Entry]
    sha256: str = Field(..., pattern=r"^[0-9a-f]{64}$")


def _digest(entries: list[dict[str, Any]]) -> str:
    canonical = json.dumps(entries, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _dump(entry: Entry) -> dict[str, Any]:
    return entry.model_dump(mode="json")


class BudgetLedger:
    """The ledger of one cost outputs root. Reads are lock-free; `record`/`update` hold its lease."""

    def __init__(self, root: Location | str, *, lock_wait_s: float = 60.0):
        self.root = storage.resolve(root) if isinstance(root, str) else root
        self.path = self.root.join(LEDGER_PATH)
        self.lock_wait_s = lock_wait_s

    @property
    def uri(self) -> str:
        return self.root.uri_of(self.path)

    def load(self) -> dict[str, Entry]:
        """Every entry by key ({} when there is no ledger yet). A file that is not the ledger's
        format, or whose entries do not match its checksum, raises (InputError, LedgerTamperedError)."""
        if not storage.is_file(self.root.fs, self.path):
            return {}
        raw = storage.read_bytes(self.root.fs, self.path)
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LedgerTamperedError(f"budget ledger {self.uri} is not JSON ({exc})",
                                      hint="restore it from a backup; it is never rewritten from scratch") from None
        try:
            document = LedgerFile.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(f"'{'.'.join(str(p) for p in item['loc'])}': {item['msg']}" for item in exc.errors()[:5])
            raise InputError(f"budget ledger {self.uri} is malformed: {problems}",
                             hint="restore it from a backup; do not edit it by hand") from None
        if _digest(data["entries"]) != document.sha256:
            raise LedgerTamperedError(
                f"budget ledger {self.uri} was modified outside Seedance: its entries do not match its sha256",
                hint="restore the ledger from a backup (or the trash); amounts are never edited by hand: "
                     "record a correction through the workflow instead")
        entries: dict[str, Entry] = {}
        for index, entry in enumerate(document.entries):
            if entry.key in entries:
                raise InputError(f"budget ledger {self.uri}: entries[{index}] repeats key {entry.key!r}",
                                 hint="restore it from a backup")
            entries[entry.key] = entry
        return entries

    def get(self, key: str) -> Entry | None:
        """The entry recorded under `key`, or None."""
        return self.load().get(key)

    def update(self, change: Callable[[dict[str, Entry]], list[Entry]]) -> list[Entry]:
        """Under the ledger's lease: call `change(entries)`; the entries it returns whose key is new
        are appended and the file replaced atomically. Returns the entries actually added."""
        holder = f"ledger:{os.getpid()}:{secrets.token_hex(4)}"
        with lease.holding(self.root, LEASE_NAME, holder=holder, purpose="budget ledger update",
                           wait_s=self.lock_wait_s):
            entries = self.load()
            added = [entry for entry in change(dict(entries)) if entry.key not in entries]
            unique: dict[str, Entry] = {}
            for entry in added:
                unique.setdefault(entry.key, entry)
            if unique:
                rows = [_dump(entry) for entry in [*entries.values(), *unique.values()]]
                storage.write_json_atomic(self.root.fs, self.path,
                                          {"format": FORMAT, "entries": rows, "sha256": _digest(rows)})
            return list(unique.values())

    def record(self, entry: Entry) -> bool:
        """Add `entry` unless its key is there already; True if added now."""
        return bool(self.update(lambda _entries: [entry]))


def entry(key: str, kind: str, month: str, *, owner: str | None = None, amount: Decimal | None = None,
          currency: str | None = None, at: datetime | None = None, **details: Any) -> Entry:
    """A validated ledger entry (`at` defaults to now, UTC)."""
    return Entry(key=key, kind=kind, month=month, owner=owner, amount=amount, currency=currency,
                 at=at or datetime.now(UTC), details=details)
