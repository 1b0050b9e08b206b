"""Leases: one writer per dataset, whoever starts it (the CLI, a DAG, a second Airflow deployment).

A lease is one small JSON record, `<root>/_seedance/leases/<name>.json`, created exclusively:
on local disk by hard-linking a fully written temp file to that name (fails if it exists), on S3
by a conditional PUT (`If-None-Match: *`). Its holder renews it (a heartbeat thread, every third
of the TTL) while the work runs. A record whose heartbeat is older than its TTL is stale, and
anyone may take it over, atomically: on S3 a PUT conditional on the stale record's ETag, locally
a rename of the stale record to a unique name followed by an exclusive create. A record held by
a process on this host that has died is stale at once. A holder that
finds another holder's record when it renews has lost the lease (`LeaseLostError`); callers
check it right before every point of no return.

Ownership is by holder string: every task, map index and retry of one Airflow DAG run share one
holder (`dag_support.airflow_lease_holder()`), so a retried task takes its own lease back.
"""

from __future__ import annotations

import json
import logging
import math
import os
import posixpath
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime

from seedance_tasks import faults, storage
from seedance_tasks.errors import ConfigError, IntegrityError, SeedanceError
from seedance_tasks.storage import Location

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 600.0
_POLL_S = 0.5


class LeaseHeldError(SeedanceError):
    """Another writer holds the dataset's lease and its heartbeat is fresh."""

    exit_code = 5
    retryable = True  # the holder finishes or its lease expires; a later try can succeed


class LeaseLostError(IntegrityError):
    """Our lease was taken over (our heartbeat had gone stale): stop before changing anything."""


@dataclass(frozen=True)
class LeaseRecord:
    """Who holds a lease, since when, and until when it counts without a heartbeat."""

    name: str
    holder: str
    purpose: str
    host: str
    pid: int
    acquired_at: datetime
    heartbeat_at: datetime
    ttl_s: float
    token: str
    pid_bound: bool = True  # held by that process; False: kept for the next task of the holder

    def stale(self, now: datetime | None = None) -> bool:
        """True once the heartbeat is older than the TTL, or its process on this host has died."""
        if ((now or datetime.now(UTC)) - self.heartbeat_at).total_seconds() > self.ttl_s:
            return True
        return self.pid_bound and self.host == socket.gethostname() and not _alive(self.pid)

    def to_bytes(self) -> bytes:
        data = asdict(self)
        data["acquired_at"] = self.acquired_at.isoformat()
        data["heartbeat_at"] = self.heartbeat_at.isoformat()
        return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> LeaseRecord:
        """Parse a lease record, untrusted: IntegrityError naming the file `where` and the key
        unless every field is sound (strings bounded, pid a positive process id, times ISO and
        the heartbeat not in the future, ttl_s a finite number of seconds in (0, MAX_TTL_S]), so
        that a damaged record can neither crash a run nor hold a lake forever."""
        if len(raw) > _MAX_RECORD_BYTES:
            raise _damaged(where, f"is {len(raw):,} bytes, not a lease record (a few hundred bytes)")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise _damaged(where, f"is not valid JSON ({_first_line(exc)})") from None
        if not isinstance(data, dict):
            raise _damaged(where, "must hold a JSON object")
        heartbeat_at, ttl_s = _field_time(data, "heartbeat_at", where), _field_ttl(data, where)
        if (heartbeat_at - datetime.now(UTC)).total_seconds() > ttl_s + _CLOCK_SKEW_S:
            raise _damaged(where, f"heartbeat_at {heartbeat_at.isoformat()} is more than its TTL ahead of "
                                  "this host's clock (a lease dated ahead would outlive its holder)")
        pid_bound = data.get("pid_bound", True)
        if not isinstance(pid_bound, bool):
            raise _damaged(where, f"pid_bound must be true or false, got {pid_bound!r:.80}")
        return cls(
            name=_field_text(data, "name", where), holder=_field_text(data, "holder", where),
            purpose=_field_text(data, "purpose", where, default=""), host=_field_text(data, "host", where, default="?"),
            pid=_field_pid(data, where), acquired_at=_field_time(data, "acquired_at", where),
            heartbeat_at=heartbeat_at, ttl_s=ttl_s, token=_field_text(data, "token", where),
            pid_bound=pid_bound,
        )

    def describe(self) -> str:
        return (f"{self.holder} ({self.purpose or 'no purpose given'}) on host {self.host}, pid {self.pid}, "
                f"since {self.acquired_at.isoformat(timespec='seconds')}, "
                f"last heartbeat {self.heartbeat_at.isoformat(timespec='seconds')}")


MAX_TTL_S = 7 * 86400.0
"""The longest TTL a lease record may carry: longer is taken for damage (it would hold a lake for weeks)."""
MAX_PID = 2**31 - 1  # pid_t is a signed 32-bit integer on Linux and macOS
_MAX_TEXT = 4096
_CLOCK_SKEW_S = 300.0  # how far another host's clock may run ahead of ours
_MAX_RECORD_BYTES = 64 * 1024
_DAMAGED_HINT = "if no run is working on this dataset, move the file away and run again"


def _damaged(where: str, problem: str) -> IntegrityError:
    return IntegrityError(f"lease record {where}: {problem}", hint=_DAMAGED_HINT)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _field_text(data: dict, key: str, where: str, *, default: str | None = None) -> str:
    value = data.get(key, default)
    if value is None:
        raise _damaged(where, f"{key} is missing")
    if not isinstance(value, str) or (default is None and not value) or len(value) > _MAX_TEXT:
        raise _damaged(where, f"{key} must be a {'non-empty ' if default is None else ''}string of at most "
                              f"{_MAX_TEXT} characters, got {value!r:.80}")
    return value


def _field_pid(data: dict, where: str) -> int:
    value = data.get("pid", 0)  # 0: unknown (an old record), only the TTL decides
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_PID or (
            "pid" in data and value == 0):
        raise _damaged(where, f"pid must be a process id from 1 to {MAX_PID}, got {value!r:.80}")
    return value


def _field_time(data: dict, key: str, where: str) -> datetime:
    value = data.get(key)
    if value is None:
        raise _damaged(where, f"{key} is missing")
    try:
        if not isinstance(value, str) or len(value) > 64:
            raise ValueError
        return _parse_time(value)
    except ValueError:
        raise _damaged(where, f"{key} must be an ISO 8601 time such as 2026-01-01T00:00:00+00:00, "
                              f"got {value!r:.80}") from None


def _field_ttl(data: dict, where: str) -> float:
    value = data.get("ttl_s")
    if value is None:
        raise _damaged(where, "ttl_s is missing")
    if (not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
            or not 0 < value <= MAX_TTL_S):
        raise _damaged(where, f"ttl_s must be a number of seconds above 0 and at most {MAX_TTL_S:.0f} "
                              f"(7 days), got {value!r:.80}")
    return float(value)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # unknown: only the TTL decides
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _parse_time(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def default_ttl() -> float:
    """The configured lease TTL (`storage.lease_ttl`), in seconds."""
    from seedance_tasks.config import load_section

    return float(load_section("storage").lease_ttl)


# --------------------------------------------------------------------------- backends


class _LocalBackend:
    """Exclusive create by hard link; takeover by renaming the stale record away first."""

    def __init__(self, path: str):
        self.path = path

    def read(self) -> tuple[bytes, str] | None:
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return None
        return raw, raw.decode(errors="replace")  # the bytes are their own version tag

    def _temp(self, raw: bytes) -> str:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        temp = storage.hidden_sibling(self.path)
        with open(temp, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        return temp

    def create(self, raw: bytes) -> bool:
        temp = self._temp(raw)
        try:
            os.link(temp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(temp)

    def replace(self, raw: bytes, version: str, *, takeover: bool = False) -> bool:
        """Swap the record for `raw` if it still is `version`; False if someone changed it.

        A renewal by the holder swaps in place (no moment without a record); a takeover of a
        stale record moves it aside first, so that of two takers only one can win.
        """
        if not takeover:
            found = self.read()
            if found is None or found[1] != version:
                return False
            os.replace(self._temp(raw), self.path)
            return True
        aside = f"{self.path}.{secrets.token_hex(6)}.old"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        with open(aside, "rb") as handle:
            moved = handle.read().decode(errors="replace")
        if moved != version:  # we moved someone else's fresh record: put it back untouched
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
            os.unlink(aside)
            return False
        os.unlink(aside)
        return self.create(raw)

    def delete(self, version: str) -> None:
        current = self.read()
        if current is not None and current[1] == version:
            aside = f"{self.path}.{secrets.token_hex(6)}.old"
            try:
                os.rename(self.path, aside)
            except FileNotFoundError:
                return
            os.unlink(aside)


class _S3Backend:
    """Conditional PUTs: If-None-Match for create, If-Match (ETag) for renew and takeover."""

    def __init__(self, path: str):
        self.bucket, _, self.key = path.partition("/")
        self.client = storage.boto3_client("s3")

    def read(self) -> tuple[bytes, str] | None:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except self.client.exceptions.NoSuchKey:
            return None
        return response["Body"].read(), response["ETag"]

    def _put(self, raw: bytes, **condition: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self.key, Body=raw,
                                   ContentType="application/json", **condition)
            return True
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409"):
                return False
            raise

    def create(self, raw: bytes) -> bool:
        return self._put(raw, IfNoneMatch="*")

    def replace(self, raw: bytes, version: str, *, takeover: bool = False) -> bool:
        return self._put(raw, IfMatch=version)

    def delete(self, version: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=version)
        except ClientError:  # changed or gone since: not ours to delete any more
            pass


def _backend(root: Location, name: str):
    rel = f"{storage.LEASE_DIR}/{storage.confine(name, what='lease name')}.json"
    storage.refuse_linked_state(root, rel)
    path = root.join(rel)
    return _S3Backend(path) if root.is_s3 else _LocalBackend(path)


# --------------------------------------------------------------------------- the lease


class Lease:
    """A held lease: renew it, check it before a point of no return, release it."""

    def __init__(self, root: Location, record: LeaseRecord, backend, version: str):
        self.root, self.record, self._backend, self._version = root, record, backend, version
        self._lock = threading.Lock()
        self.lost: LeaseLostError | None = None

    @property
    def where(self) -> str:
        return self.root.uri_of(self.root.join(storage.LEASE_DIR, f"{self.record.name}.json"))

    def _lost(self, current: LeaseRecord | None) -> LeaseLostError:
        who = current.describe() if current else "nobody (the record is gone)"
        self.lost = LeaseLostError(
            f"lease {self.where} is no longer held by {self.record.holder}: now {who}",
            hint="this run paused longer than the lease TTL and another run took over; "
                 "nothing more was changed. Raise storage.lease_ttl if runs pause that long",
        )
        return self.lost

    def renew(self, *, pid_bound: bool = True) -> None:
        """Push the heartbeat forward; LeaseLostError if another holder owns the lease now.

        `pid_bound=False` detaches the record from this process: it then lasts until its TTL
        even after the process exits (a DAG task handing the lease to the next task).
        """
        with self._lock:
            if self.lost:
                raise self.lost
            found = self._backend.read()
            current = LeaseRecord.from_bytes(found[0], self.where) if found else None
            if current is None or current.holder != self.record.holder:
                raise self._lost(current)
            renewed = replace(current, heartbeat_at=datetime.now(UTC), pid=os.getpid(), host=socket.gethostname(),
                              pid_bound=pid_bound)
            raw = renewed.to_bytes()
            if not self._backend.replace(raw, found[1]):
                again = self._backend.read()
                current = LeaseRecord.from_bytes(again[0], self.where) if again else None
                if current is None or current.holder != self.record.holder:
                    raise self._lost(current)
                return  # a sibling task of the same holder renewed it at the same moment
            self.record = renewed
            self._version = self._backend.read()[1] if self.root.is_s3 else raw.decode()

    def check(self) -> None:
        """Raise LeaseLostError unless the lease is still ours (renews it on the way)."""
        self.renew()

    def release(self) -> None:
        """Remove the lease record if it is still ours; never touches another holder's."""
        with self._lock:
            found = self._backend.read()
            if found is None:
                return
            current = LeaseRecord.from_bytes(found[0], self.where)
            if current.holder == self.record.holder:
                self._backend.delete(found[1])


def acquire(root: Location, name: str, *, holder: str, purpose: str, ttl_s: float | None = None,
            wait_s: float = 0.0, detached: bool = False) -> Lease:
    """Take the lease `name` of `root` for `holder`, or raise LeaseHeldError naming who has it.

    Re-entrant for the same holder; a stale record (heartbeat older than its TTL, or its process
    dead on this host) is taken over atomically. With `wait_s` > 0, waits up to that long for the
    holder to finish. `detached=True` makes the lease outlive this process until its TTL (a DAG
    task that hands it to the next task of its run); else it dies with the process.
    """
    configured = ttl_s is None
    ttl_s = default_ttl() if ttl_s is None else float(ttl_s)
    if not (math.isfinite(ttl_s) and 0 < ttl_s <= MAX_TTL_S):
        raise ConfigError(f"{'storage.lease_ttl' if configured else 'lease TTL'} {ttl_s:g} s is not between "
                          f"0 and {MAX_TTL_S:.0f} s (7 days)",
                          hint="set storage.lease_ttl in config/seedance.yaml to at most 7d (10m is the default)")
    backend = _backend(root, name)
    deadline = time.monotonic() + max(wait_s, 0.0)
    where = root.uri_of(root.join(storage.LEASE_DIR, f"{name}.json"))
    while True:
        now = datetime.now(UTC)
        record = LeaseRecord(name, holder, purpose, socket.gethostname(), os.getpid(), now, now, ttl_s,
                             secrets.token_hex(8), pid_bound=not detached)
        raw = record.to_bytes()
        faults.point("lease.acquire")
        found = backend.read()
        if found is None:
            if backend.create(raw):
                return _held(root, record, backend, raw)
            continue  # someone created it between our read and our create: look again
        current = LeaseRecord.from_bytes(found[0], where)
        if current.holder == holder or current.stale(now):
            if current.holder == holder:
                record = replace(record, acquired_at=current.acquired_at, token=current.token)
                raw = record.to_bytes()
            else:
                log.warning("taking over the stale lease %s of %s", where, current.describe())
            if backend.replace(raw, found[1], takeover=current.holder != holder):
                return _held(root, record, backend, raw)
            continue
        if time.monotonic() >= deadline:
            expiry = f"its lease to expire ({current.ttl_s:.0f} s after its last heartbeat)"
            raise LeaseHeldError(
                f"{root.uri} is being written by another run: lease {where} is held by {current.describe()}",
                hint=f"wait for it to finish and run again (a command with a --wait option can wait for it), or, if it "
                     f"died, for {expiry}",
                airflow_hint=f"Airflow retries this task after its retry delay: by then the other run may have "
                             f"finished or, if it died, {expiry}; if every retry is refused, clear the task "
                             "once the other run is done",
            )
        time.sleep(min(_POLL_S, max(deadline - time.monotonic(), 0.01)))


def _held(root: Location, record: LeaseRecord, backend, raw: bytes) -> Lease:
    version = backend.read()[1] if root.is_s3 else raw.decode()
    return Lease(root, record, backend, version)


@contextmanager
def holding(root: Location, name: str, *, holder: str, purpose: str, ttl_s: float | None = None,
            wait_s: float = 0.0, release: bool = True) -> Iterator[Lease]:
    """Hold the lease for the block, renewing it every third of its TTL; release it on exit.

    With release=False the lease is kept when the block ends (the next task of the same DAG run
    takes it back); it expires by its TTL if nobody does. A lease still bound to its process is
    stale as soon as that process has died on this host (a killed CLI run blocks nobody).
    """
    held = acquire(root, name, holder=holder, purpose=purpose, ttl_s=ttl_s, wait_s=wait_s)
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(held.record.ttl_s / 3):
            try:
                held.renew()
            except LeaseLostError:
                log.error("%s", held.lost)
                return
            except Exception:  # a storage hiccup: the next beat tries again, the TTL has slack
                log.warning("lease heartbeat for %s failed; retrying", held.where, exc_info=True)

    thread = threading.Thread(target=heartbeat, name=f"lease-{name}", daemon=True)
    thread.start()
    try:
        yield held
    finally:
        stop.set()
        thread.join()
        if release:
            held.release()
        elif not held.lost:
            try:
                held.renew(pid_bound=False)
            except LeaseLostError:
                pass


def overlapping(root: Location, rel: str, *, holder: str, name: str) -> tuple[str, LeaseRecord] | None:
    """(folder URI, record) of a fresh lease `name` of another holder on a dataset that overlaps
    `root/rel`: one rooted at a folder above `root` (a lake that holds this one) or at a folder
    from `root` down to `root/rel` (a lake inside this one that holds `rel`), `root`'s own lease
    aside; None if there is none. A damaged record raises its IntegrityError.

    Leases are per root, and roots nest (`seedance compact lake` beside `seedance compact
    lake/date=1`): a writer holding its own lease calls this right before its point of no
    return, so that of two writers on overlapping roots at most one rewrites the shared files
    (each takes its lease before it looks for the other's). A folder that cannot be looked
    into (permissions) holds no lease this writer could honour and is passed over.
    """
    folders, path = [], root.path.rstrip("/") or "/"
    while True:  # the folders above the root, up to the filesystem's root or the bucket
        parent = posixpath.dirname(path)
        if not parent or parent == path or (root.is_s3 and "/" not in path):
            break
        folders.append(parent)
        path = parent
    parts = [part for part in (rel or "").split("/") if part]
    folders += [root.join(*parts[:end]) for end in range(1, len(parts) + 1)]
    for folder in folders:
        record_path = posixpath.join(folder, storage.LEASE_DIR, f"{name}.json")
        try:
            raw = storage.read_bytes(root.fs, record_path)
        except OSError:  # none there (FileNotFoundError), or a folder we may not read
            continue
        record = LeaseRecord.from_bytes(raw, root.uri_of(record_path))
        if record.holder != holder and not record.stale():
            return root.uri_of(folder), record
    return None


def current(root: Location, name: str) -> LeaseRecord | None:
    """The lease record `name` of `root`, or None if nobody holds it."""
    backend = _backend(root, name)
    found = backend.read()
    return LeaseRecord.from_bytes(found[0], root.uri_of(root.join(storage.LEASE_DIR, f"{name}.json"))) if found else None


def list_leases(root: Location, damaged: list[IntegrityError] | None = None) -> list[LeaseRecord]:
    """Every lease record under `root` (held or stale), for reports and the dashboard. A damaged
    record raises its IntegrityError, or, given a `damaged` list, is appended to it and skipped."""
    records = []
    for info in storage.list_files(root.child(storage.LEASE_DIR), include_hidden=True):
        name = info.path.rsplit("/", 1)[-1]
        if name.endswith(".json") and not name.startswith("."):
            try:
                records.append(LeaseRecord.from_bytes(storage.read_bytes(root.fs, info.path), root.uri_of(info.path)))
            except IntegrityError as exc:
                if damaged is None:
                    raise
                damaged.append(exc)
    return records
