"""Tar shards, read safely and written fast.

Reading: `iter_members` streams a tar (no seeking, so S3 streams work) and yields regular files
only after checking each header: an absolute name, a `..` component, a link, a device node or a
FIFO is refused (`RefusedError`) before its data is read; nothing is ever extracted to disk.
A truncated or corrupt tar is an `InputError` naming the shard. `iter_samples` groups members
into WebDataset samples by key.

Writing: `TarShardWriter` writes POSIX ustar members with integer mtimes (no PAX header per
member, unlike `webdataset.TarWriter`), counts the headers and padding in its size, and hashes
what it writes (sha256), so shard sizes and checksums are known without re-reading.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from seedance_tasks.errors import InputError, RefusedError

BLOCK = tarfile.BLOCKSIZE  # 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # as webdataset.tariterators.base_plus_ext


def split_key(name: str) -> tuple[str, str] | tuple[None, None]:
    """`dir/KEY.ext1.ext2` -> (`dir/KEY`, `ext1.ext2`), WebDataset's rule (first dot of the basename)."""
    match = _KEY_EXT.match(name)
    if not match:
        return None, None
    return match.group(1), match.group(2)


def check_member_name(name: str) -> str | None:
    """Why the member name `name` is unsafe, or None if it is a plain relative path."""
    if not name:
        return "empty member name"
    if name.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", name) or name.startswith("\\"):
        return "absolute path"
    parts = re.split(r"[\\/]+", name)
    if ".." in parts:
        return "'..' in path"
    if "\0" in name:
        return "NUL in name"
    return None


def member_problem(info: tarfile.TarInfo) -> str | None:
    """Why this tar member must be refused (link, device, FIFO, unsafe name), or None."""
    if info.issym():
        return f"symbolic link to {info.linkname!r}"
    if info.islnk():
        return f"hard link to {info.linkname!r}"
    if info.ischr() or info.isblk():
        return "device node"
    if info.isfifo():
        return "FIFO"
    if not (info.isfile() or info.isdir()):
        return f"unsupported member type {info.type!r}"
    return check_member_name(info.name)


def _normalise(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name


def iter_members(stream: BinaryIO, shard: str) -> Iterator[tuple[str, bytes]]:
    """(name, data) of every regular file in the tar `stream`, in order, checked as it streams.

    Directories are skipped. Raises RefusedError on a hostile member (before reading its data)
    and InputError if the tar is truncated or corrupt; `shard` names the tar in both.
    """
    try:
        archive = tarfile.open(fileobj=stream, mode="r|")
    except tarfile.TarError as exc:
        raise InputError(f"{shard}: not a readable tar ({exc})", hint="rebuild or re-fetch this shard") from None
    with archive:
        try:
            for info in archive:
                problem = member_problem(info)
                if problem:
                    raise RefusedError(
                        f"{shard}: member {info.name!r} refused: {problem}",
                        hint="this tar is not a plain WebDataset shard; it is never extracted",
                    )
                if info.isdir():
                    continue
                handle = archive.extractfile(info)
                data = handle.read() if handle is not None else b""
                if len(data) != info.size:
                    raise InputError(f"{shard}: member {info.name!r} is truncated", hint="the tar is incomplete")
                yield _normalise(info.name), data
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise InputError(
                f"{shard}: truncated or corrupt tar ({exc})", hint="rebuild or re-fetch this shard"
            ) from None


def scan_headers(path: str, shard: str) -> int:
    """Check every member header of a local tar by seeking past the data; returns the member count.

    Raises as `iter_members` does, but reads only headers, so checking a local shard is cheap.
    """
    count = 0
    try:
        with tarfile.open(path, mode="r:") as archive:
            for info in archive:
                problem = member_problem(info)
                if problem:
                    raise RefusedError(
                        f"{shard}: member {info.name!r} refused: {problem}",
                        hint="this tar is not a plain WebDataset shard; it is never extracted",
                    )
                count += 1
    except (tarfile.TarError, EOFError) as exc:
        raise InputError(f"{shard}: truncated or corrupt tar ({exc})", hint="rebuild or re-fetch this shard") from None
    return count


@dataclass
class TarSample:
    """One WebDataset sample read from a shard: its key and its members by extension."""

    key: str
    members: dict[str, bytes] = field(default_factory=dict)


def iter_samples(members: Iterable[tuple[str, bytes]], shard: str) -> Iterator[TarSample]:
    """Group consecutive members with the same key into samples (WebDataset's rule).

    A member without an extension, or a key.ext seen twice in a row, is an InputError naming the
    shard; a key that reappears later is left for the caller (verify reports it as a duplicate).
    """
    current: TarSample | None = None
    for name, data in members:
        key, ext = split_key(name)
        if key is None:
            raise InputError(f"{shard}: member {name!r} has no extension, so no sample key")
        if current is not None and key == current.key:
            if ext in current.members:
                raise InputError(f"{shard}: member {name!r} appears twice in sample {key!r}")
            current.members[ext] = data
            continue
        if current is not None:
            yield current
        current = TarSample(key, {ext: data})
    if current is not None:
        yield current


def member_bytes(name: str, size: int) -> int:
    """Bytes a member takes in a ustar archive: a 512-byte header plus data padded to 512."""
    extra = 0 if len(name.encode()) <= 100 else 3 * BLOCK  # PAX header for long names
    return BLOCK + extra + -(-size // BLOCK) * BLOCK


def sample_bytes(key: str, members: dict[str, bytes]) -> int:
    """Bytes a sample takes in a shard (headers and padding included)."""
    return sum(member_bytes(f"{key}.{ext}", len(data)) for ext, data in members.items())


class TarShardWriter:
    """Writes WebDataset samples as a tar to a binary stream; tracks its size and sha256.

    Members are ustar regular files, mode 0644, owner 0:0, mtime `mtime` (an int, so identical
    inputs give identical shards), names `key.ext`. `close()` writes the end-of-archive blocks
    but does not close the stream.
    """

    def __init__(self, stream: BinaryIO, *, mtime: int = 0):
        self.stream = stream
        self.mtime = int(mtime)
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.samples = 0
        self._template = tarfile.TarInfo()
        self._template.mode = 0o644
        self._template.mtime = self.mtime
        self._template.uname = self._template.gname = ""

    def _write(self, data: bytes | memoryview) -> None:
        self.stream.write(data)
        self.sha256.update(data)
        self.size += len(data)

    def add_member(self, name: str, data: bytes | memoryview) -> None:
        problem = check_member_name(name)
        if problem:
            raise RefusedError(f"refusing to write member {name!r}: {problem}")
        info = self._template.replace(name=name, deep=False)
        info.size = len(data)
        try:
            header = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")
        except ValueError:  # name too long or not ASCII for ustar: a PAX header carries it
            header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")
        self._write(header)
        self._write(data)
        remainder = len(data) % BLOCK
        if remainder:
            self._write(b"\0" * (BLOCK - remainder))

    def add_sample(self, key: str, members: dict[str, bytes]) -> None:
        for ext in sorted(members):
            self.add_member(f"{key}.{ext}", members[ext])
        self.samples += 1

    def close(self) -> None:
        self._write(END_OF_ARCHIVE)
