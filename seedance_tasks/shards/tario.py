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
import os
import re
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from seedance_tasks.errors import InputError, RefusedError

BLOCK = tarfile.BLOCKSIZE  # 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
_ZEROS = b"\0" * BLOCK
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


def _refuse_if_hostile(info: tarfile.TarInfo, shard: str) -> None:
    problem = member_problem(info)
    if problem:
        raise RefusedError(
            f"{shard}: member {info.name!r} refused: {problem}",
            hint="this tar is not a plain WebDataset shard; it is never extracted",
        )


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
                _refuse_if_hostile(info, shard)
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
                _refuse_if_hostile(info, shard)
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


class _BackgroundHash:
    """sha256 computed on a second thread (hashlib releases the GIL), overlapping the writes."""

    def __init__(self):
        import queue
        import threading

        self._hash = hashlib.sha256()
        self._queue: queue.Queue = queue.Queue(maxsize=512)
        self._thread = threading.Thread(target=self._run, name="seedance-sha256", daemon=True)
        self._thread.start()
        self._done = False

    def _run(self) -> None:
        while True:
            parts = self._queue.get()
            if parts is None:
                return
            for part in parts:
                self._hash.update(part)

    def update(self, parts: list) -> None:
        self._queue.put(parts)

    def finish(self) -> None:
        if not self._done:
            self._done = True
            self._queue.put(None)
            self._thread.join()

    def result(self):
        self.finish()
        return self._hash


class LocalSink:
    """A local file written with `os.writev`: parts are gathered (not copied) until about 1 MiB,
    then written in one system call; fsynced on close, so a published shard is on disk.
    Has `write`, `writev`, `close`, `closed`."""

    GATHER_BYTES = 1024 * 1024
    GATHER_PARTS = 512  # below IOV_MAX (1024)

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.closed = False
        self._parts: list = []
        self._pending = 0

    def writev(self, parts: list) -> None:
        self._parts.extend(parts)
        self._pending += sum(len(part) for part in parts)
        if self._pending >= self.GATHER_BYTES or len(self._parts) >= self.GATHER_PARTS:
            self.flush()

    def flush(self) -> None:
        if not self._parts:
            return
        parts, expected = self._parts, self._pending
        self._parts, self._pending = [], 0
        written = os.writev(self.fd, parts)
        if written != expected:  # a short write (rare): write the rest plainly
            rest = b"".join(bytes(part) for part in parts)[written:]
            while rest:
                rest = rest[os.write(self.fd, rest):]

    def write(self, data) -> None:
        self.writev([data])

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.flush()
                os.fsync(self.fd)
            finally:
                os.close(self.fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_sink(location_fs, path: str, buffer_size: int = 8 * 1024 * 1024):
    """A writable stream for a new shard: `LocalSink` on local disk, pyarrow's output stream elsewhere."""
    import pyarrow.fs as pafs

    if isinstance(location_fs, pafs.LocalFileSystem):
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        return LocalSink(path)
    return location_fs.open_output_stream(path, buffer_size=buffer_size)


class TarShardWriter:
    """Writes WebDataset samples as a tar to a binary stream; tracks its size and sha256.

    Members are ustar regular files, mode 0644, owner 0:0, mtime `mtime` (an int, so identical
    inputs give identical shards), names `key.ext`. `close()` writes the end-of-archive blocks
    but does not close the stream.
    """

    def __init__(self, stream: BinaryIO, *, mtime: int = 0):
        self.stream = stream
        self.mtime = int(mtime)
        self._hasher = _BackgroundHash()
        self.size = 0
        self.samples = 0
        self._template = tarfile.TarInfo()
        self._template.mode = 0o644
        self._template.mtime = self.mtime
        self._template.uname = self._template.gname = ""
        self._writev = getattr(stream, "writev", None)

    @property
    def sha256(self):
        """The hash of everything written (complete once `close()` has returned)."""
        return self._hasher.result()

    def _write(self, data: bytes | memoryview) -> None:
        self._write_parts([data])

    def _write_parts(self, parts: list) -> None:
        if self._writev is not None:
            self._writev(parts)
        else:
            for part in parts:
                self.stream.write(part)
        self._hasher.update(parts)
        for part in parts:
            self.size += len(part)

    def add_member(self, name: str, data: bytes | memoryview | tuple) -> None:
        """Append one regular file; `data` may be a tuple of byte strings, written back to back."""
        problem = check_member_name(name)
        if problem:
            raise RefusedError(f"refusing to write member {name!r}: {problem}")
        pieces = list(data) if isinstance(data, tuple) else [data]
        size = sum(len(piece) for piece in pieces)
        info = self._template.replace(name=name, deep=False)
        info.size = size
        try:
            header = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")
        except ValueError:  # name too long or not ASCII for ustar: a PAX header carries it
            header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")
        remainder = size % BLOCK
        self._write_parts([header, *pieces, _ZEROS[: BLOCK - remainder]] if remainder else [header, *pieces])

    def add_sample(self, key: str, members: dict[str, bytes | tuple]) -> None:
        for ext in sorted(members):
            self.add_member(f"{key}.{ext}", members[ext])
        self.samples += 1

    def close(self) -> None:
        self._write(END_OF_ARCHIVE)
        self._hasher.finish()
