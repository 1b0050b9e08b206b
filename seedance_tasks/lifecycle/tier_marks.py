"""Telling a local tier location from the empty folder it is when its volume is not mounted.

An unmounted filesystem leaves its mountpoint, an empty folder on the root disk: a tier location
there "exists", so tiering would write cold data onto the root disk (hidden by the volume once it
is mounted again) and GC would drop checkpoints whose files it cannot see. So the first time
tiering writes to a local tier location it creates a mark there (`<location>/_seedance/
tier-mark.json`, a random token, created exclusively) and records the token in the store
(`<store>/_seedance/tier-marks/<key>.json`). From then on the location is the one tiering wrote
to only while it holds that mark (`problem`). Before a location has a record, a location below
a mountpoint that `/etc/fstab` declares but that is not mounted is refused too.

S3 locations have no mountpoints and get no mark.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets

from seedance_tasks import storage
from seedance_tasks.errors import RefusedError
from seedance_tasks.storage import Location

MARK = f"{storage.SEEDANCE_DIR}/tier-mark.json"
RECORDS = f"{storage.SEEDANCE_DIR}/tier-marks"
FSTAB = "/etc/fstab"


def _record_rel(root: str) -> str:
    return f"{RECORDS}/{hashlib.sha256(root.rstrip('/').encode()).hexdigest()[:16]}.json"


def _token(fs, path: str) -> str | None:
    """The token of a mark or record file; None if there is none (or it does not read as one)."""
    try:
        value = json.loads(storage.read_bytes(fs, path))
    except (FileNotFoundError, OSError, ValueError):
        return None
    token = value.get("token") if isinstance(value, dict) else None
    return token if isinstance(token, str) and token else None


def _declared_mountpoints() -> set[str]:
    """The mountpoints /etc/fstab declares (but `/` and swap), as real paths."""
    try:
        with open(FSTAB, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return set()
    points = set()
    for line in lines:
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2 and fields[1].startswith("/") and fields[1] != "/":
            points.add(os.path.realpath(fields[1].replace("\\040", " ")))
    return points


def _unmounted_mountpoint(path: str) -> str | None:
    """A mountpoint /etc/fstab declares at or above `path` that is not mounted, else None."""
    declared = _declared_mountpoints()
    current = os.path.realpath(path)
    while True:
        if current in declared and not os.path.ismount(current):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def problem(store: Location, root: str) -> str | None:
    """Why the local tier location `root` must not be read or written now (its mark is missing
    or not the one the store recorded, or its declared filesystem is not mounted), else None.
    Reads only; an S3 root, or one the store never tiered to and that is not below an unmounted
    mountpoint, has none."""
    location = storage.resolve(root)
    if location.is_s3:
        return None
    recorded = _token(store.fs, store.join(_record_rel(location.uri)))
    if recorded is not None:
        mark = _token(location.fs, location.join(MARK))
        if mark == recorded:
            return None
        what = "has no tier mark" if mark is None else "holds another tier mark"
        return (f"tier location {location.uri} {what} ({MARK}) although this store tiered files to it: "
                "its filesystem is not mounted, or the folder was replaced")
    unmounted = _unmounted_mountpoint(location.path)
    if unmounted:
        return f"tier location {location.uri} is below {unmounted}, which {FSTAB} mounts but is not mounted now"
    return None


def check(store: Location, root: str, tier: str) -> None:
    """RefusedError (naming the location, with a hint) if `problem` has something to say."""
    why = problem(store, root)
    if why:
        raise RefusedError(why, hint=f"mount the volume of lifecycle.tiers.{tier}.uri (or point the setting at "
                           "where its files are) and run again; nothing was moved")


def ensure(store: Location, root: str, tier: str) -> None:
    """Before tiering writes under the local location `root`: `check` it, then give it a mark
    and record the mark in the store if it has none yet (nothing for S3)."""
    check(store, root, tier)
    location = storage.resolve(root)
    if location.is_s3:
        return
    record = store.join(_record_rel(location.uri))
    if _token(store.fs, record) is not None:
        return
    mark = location.join(MARK)
    if _token(location.fs, mark) is None:
        location.fs.create_dir(os.path.dirname(mark), recursive=True)
        temp = storage.hidden_sibling(mark)
        with open(temp, "w", encoding="utf-8") as handle:
            json.dump({"token": secrets.token_hex(16)}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temp, mark)  # exclusive: a mark another pass created first is kept
        except FileExistsError:
            pass
        finally:
            os.unlink(temp)
    token = _token(location.fs, mark)
    if token is None:
        raise RefusedError(f"tier location {location.uri}: its tier mark {MARK} is not readable",
                           hint="remove that file if it is damaged, then run again")
    storage.write_json_atomic(store.fs, record, {"root": location.uri, "token": token})
