"""Tar shards, read safely and written fast.

Reading: `iter_members` streams a tar (no seeking, so S3 streams work) and yields regular files
only after checking each header: an absolute name, a `..` component, a link, a device node or a
FIFO is refused (`RefusedError`) before its data is read; nothing is ever extracted to disk.
A member is read only if its declared size is below the limit and below the size of the whole
tar (a sparse member can declare a terabyte in a kilobyte file). The tar must end with its
end-of-archive marker (two zero blocks): one cut exactly at a member boundary, or with a
damaged header after the last good member, is not complete; after the marker only zero padding
may follow (readers stop at the marker: a second tar appended would never be read). Each of these
is a `TarProblem` (an `InputError` with a `kind`) naming the shard, and the member at fault in its
`member` (a hostile one: `HostileMember`, a `RefusedError`). `iter_samples` groups members into
WebDataset samples by key.

Writing: `TarShardWriter` writes POSIX ustar members with integer mtimes (no PAX header per
member, unlike `webdataset.TarWriter`), counts the headers and padding in its size, and hashes
what it writes (sha256), so shard sizes and checksums are known without re-reading.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from seedance_tasks.errors import InputError, RefusedError

BLOCK = tarfile.BLOCKSIZE  # 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
_ZEROS = b"\0" * BLOCK
DEFAULT_MAX_MEMBER_SIZE = 1024**3  # `shards.max_member_size`: no member of a shard is read beyond it
_USTAR_NAME = 100  # bytes of a ustar name field (longer names go to its prefix field or a PAX header)
_USTAR_NUMBER = 8**11  # a ustar size or mtime field holds 11 octal digits
_TAIL_WINDOW = 64 * 1024  # > tarfile's read-ahead (one 10 KiB record) + the 1 KiB end marker


class TarProblem(InputError):
    """A tar that is not a complete, plain shard; `kind` says how (truncated, too-large, unreadable,
    trailing-data), `member` names the member at fault (None when the problem is the whole tar's)."""

    def __init__(self, message: str, *, kind: str = "unreadable", hint: str | None = None,
                 member: str | None = None):
        super().__init__(message, hint=hint or "rebuild or re-fetch this shard")
        self.kind = kind
        self.member = member


class HostileMember(RefusedError):
    """A tar member refused before its data is read (a link, a device, a FIFO, an unsafe name);
    `member` is its name as the tar gives it."""

    def __init__(self, message: str, *, member: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.member = member


_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # as webdataset.tariterators.base_plus_ext
_RESERVED_EXT = re.compile(r"^__.*__$")  # webdataset's and wids' own sample fields: __key__, __url__...


def split_key(name: str) -> tuple[str, str] | tuple[None, None]:
    """`dir/KEY.ext1.ext2` -> (`dir/KEY`, `ext1.ext2`), WebDataset's rule (first dot of the basename)."""
    match = _KEY_EXT.match(name)
    if not match:
        return None, None
    return match.group(1), match.group(2)


def no_key_reason(name: str) -> str:
    """Why `split_key` finds no sample key in the member name `name`."""
    if name.rsplit("/", 1)[-1].startswith("."):
        return "its file name starts with a dot, so it has no sample key"
    return "it has no extension, so no sample key"


def canonical_key(key: str) -> str:
    """`key` as a path names it: `a//b` and `a/./b` are `a/b` (one file once extracted)."""
    return "/".join(part for part in key.split("/") if part not in ("", "."))


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


def extension_problem(exts: Iterable[str]) -> str | None:
    """Why members with these extensions cannot make one sample that readers read back, or None.

    WebDataset's reader lowercases extensions and names its own fields `__key__`, `__url__`...:
    two extensions that differ only in case (`jpg`, `JPG`), or one spelled `__NAME__`, make it
    raise mid-epoch; one that is empty or holds `/` has no key in the member name at all.
    """
    seen: dict[str, str] = {}
    for ext in sorted(exts):
        if not ext or "/" in ext or "\\" in ext or "\0" in ext:
            return f"extension {ext!r} cannot be part of a member name (empty, or holding '/', '\\' or NUL)"
        if _RESERVED_EXT.match(ext):
            return f"extension {ext!r} is spelled like a reader's own field (__key__, __url__...)"
        if (other := seen.get(ext.lower())) is not None:
            if other == ext:
                return f"extension {ext!r} appears twice"
            return (f"extensions {other!r} and {ext!r} differ only in case, and readers lowercase them, so "
                    "they would collide")
        seen[ext.lower()] = ext
    return None


def sample_name_problem(key: str, exts: Iterable[str]) -> str | None:
    """Why a sample `key` with members `exts` cannot be written as `key.ext` members that a
    reader splits back into this key and these extensions (and that are safe names), or None."""
    exts = list(exts)
    if (problem := extension_problem(exts)) is not None:
        return problem
    for ext in exts:
        name = f"{key}.{ext}"
        if (problem := check_member_name(name)) is not None:
            return f"member {name!r}: {problem}"
        if split_key(name) != (key, ext):
            return f"member {name!r} would be read back as another key (a key's file name holds no '.')"
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
        raise HostileMember(
            f"{shard}: member {info.name!r} refused: {problem}", member=info.name,
            hint="this tar is not a plain WebDataset shard; it is never extracted",
        )


def _normalise(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name


def _check_size(info: tarfile.TarInfo, shard: str, file_size: int | None, limit: int) -> None:
    """Refuse a member by its declared size, before a byte of it is allocated."""
    sparse = " (a sparse member)" if info.issparse() else ""
    if file_size is not None and info.size > file_size:
        raise TarProblem(
            f"{shard}: member {info.name!r}{sparse} declares {info.size:,} bytes, more than the whole tar "
            f"({file_size:,} bytes); refused without reading it", kind="too-large", member=info.name,
        )
    if info.size > limit:
        raise TarProblem(
            f"{shard}: member {info.name!r}{sparse} declares {info.size:,} bytes, above the limit of "
            f"{limit:,} bytes; refused without reading it", kind="too-large", member=info.name,
            hint="raise shards.max_member_size if members this large are expected, else rebuild the shard",
        )


def _check_end(marker: bytes, shard: str, last: str | None, offset: int) -> None:
    """The 1024 bytes after the last member must be the end-of-archive marker (two zero blocks)."""
    if marker == END_OF_ARCHIVE:
        return
    after = f"after member {last!r}" if last else "at its start"
    what = "ends" if not marker.strip(b"\0") else "has a damaged header or garbage"
    raise TarProblem(
        f"{shard}: {what} {after} (offset {offset:,}) without the end-of-archive marker (two zero blocks): "
        "the tar is truncated or damaged there", kind="truncated",
    )


TRAILING_HINT = ("readers (webdataset, wids, tar) stop at the first end-of-archive marker, so what follows it is never "
                 "read; split the tars apart (or rebuild the shard) so that each is a shard of its own")
_SCAN_CHUNK = 1024 * 1024


def trailing_problem(shard: str, offset: int, nonzero: int) -> TarProblem:
    """The error of a tar whose bytes after its end-of-archive marker (at `offset`) are not all
    zero padding: the first that is not is at `nonzero` (another tar appended, or garbage)."""
    return TarProblem(
        f"{shard}: holds data after its end-of-archive marker (offset {offset:,}; the first non-zero byte at "
        f"{nonzero:,}): another tar appended to it, or garbage; members there would never be read",
        kind="trailing-data", hint=TRAILING_HINT,
    )


def first_nonzero(data: bytes | memoryview) -> int | None:
    """Where the first byte of `data` that is not zero is, or None if all are."""
    stripped = bytes(data).lstrip(b"\0")
    return len(data) - len(stripped) if stripped else None


def check_padding(read: Callable[[int], bytes], shard: str, marker: int, offset: int) -> None:
    """Raise `trailing_problem` unless every byte `read(size)` gives from `offset` on (to its end,
    an empty read) is zero; `marker` is where the end-of-archive marker starts."""
    while data := read(_SCAN_CHUNK):
        if (found := first_nonzero(data)) is not None:
            raise trailing_problem(shard, marker, offset + found)
        offset += len(data)


class _TailReader:
    """Reads through `stream`, remembering the last bytes read (to check the end marker after tarfile)."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.position = 0
        self.tail = bytearray()

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.position += len(data)
        if len(data) >= _TAIL_WINDOW:
            self.tail = bytearray(data[-_TAIL_WINDOW:])
        else:
            self.tail += data
            if len(self.tail) > _TAIL_WINDOW:
                del self.tail[: len(self.tail) - _TAIL_WINDOW]
        return data

    def rest_is_padding(self, shard: str, marker: int) -> None:
        """Raise `trailing_problem` unless every byte after the end-of-archive marker at `marker`
        (those read ahead already, and the rest of the stream) is zero."""
        after = marker + len(END_OF_ARCHIVE)
        start = len(self.tail) - (self.position - after)
        if (found := first_nonzero(self.tail[max(start, 0) :])) is not None:
            raise trailing_problem(shard, marker, after + found)
        check_padding(self.read, shard, marker, self.position)

    def bytes_at(self, offset: int, size: int) -> bytes:
        """Bytes [offset, offset + size) of the stream (reading on as needed), short at its end."""
        while self.position < offset + size and self.read(BLOCK * 2):
            pass
        start = len(self.tail) - (self.position - offset)
        if start < 0:  # cannot happen with tarfile's bounded read-ahead; refuse rather than guess
            return b""
        return bytes(self.tail[start : start + size])


_COMPRESSED = ((b"\x1f\x8b", "gzip", "gunzip"), (b"BZh", "bzip2", "bunzip2"), (b"\xfd7zXZ\0", "xz", "unxz"),
               (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"))


def not_a_tar(shard: str, head: bytes, reason: object) -> TarProblem:
    """The error of a shard `tarfile` cannot open; `head` (its first bytes) tells a compressed tar,
    which is named as such: shards are read as plain tars, never decompressed on the fly."""
    for magic, name, tool in _COMPRESSED:
        if head.startswith(magic):
            return TarProblem(f"{shard}: is {name}-compressed, not a plain tar (shards are read uncompressed, one "
                              "sequential read each)", hint=f"decompress it ({tool}) to a .tar, or rebuild the shards "
                              "with `seedance shards build`")
    return TarProblem(f"{shard}: not a readable tar ({reason})")


def iter_members(stream: BinaryIO, shard: str, *, file_size: int | None = None,
                 max_member_size: int | None = None) -> Iterator[tuple[str, bytes]]:
    """(name, data) of every regular file in the tar `stream`, in order, checked as it streams.

    Directories are skipped. Raises HostileMember (a RefusedError) on a hostile member (before
    reading its data),
    TarProblem (an InputError) for a member whose declared size exceeds `max_member_size` or the
    tar's own `file_size` (checked before allocating), a tar without its end-of-archive marker
    or with anything but zero padding after it (read to its end), and a truncated or corrupt
    tar; `shard` names the tar in each, and each error's `member` the member at fault (None for the
    whole tar's problems).
    """
    limit = DEFAULT_MAX_MEMBER_SIZE if max_member_size is None else int(max_member_size)
    reader = _TailReader(stream)
    try:
        archive = tarfile.open(fileobj=reader, mode="r|")
    except tarfile.TarError as exc:
        raise not_a_tar(shard, bytes(reader.tail[:8]) if reader.position <= _TAIL_WINDOW else b"", exc) from None
    last: str | None = None
    with archive:
        try:
            for info in archive:
                _refuse_if_hostile(info, shard)
                if info.isdir():
                    continue
                _check_size(info, shard, file_size, limit)
                handle = archive.extractfile(info)
                data = handle.read() if handle is not None else b""
                if len(data) != info.size:
                    raise TarProblem(f"{shard}: member {info.name!r} is truncated", kind="truncated",
                                     hint="the tar is incomplete; rebuild or re-fetch it", member=info.name)
                last = info.name
                yield _normalise(info.name), data
            end = archive.offset
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise TarProblem(f"{shard}: truncated or corrupt tar ({exc})") from None
    _check_end(reader.bytes_at(end, len(END_OF_ARCHIVE)), shard, last, end)
    reader.rest_is_padding(shard, end)


def scan_headers(path: str, shard: str, *, max_member_size: int | None = None) -> int:
    """Check every member header of a local tar by seeking past the data; returns the member count.

    Raises as `iter_members` does (hostile members, declared sizes, the end-of-archive marker),
    but reads only headers, so checking a local shard is cheap.
    """
    limit = DEFAULT_MAX_MEMBER_SIZE if max_member_size is None else int(max_member_size)
    file_size = os.path.getsize(path)
    count, last = 0, None
    try:
        with tarfile.open(path, mode="r:") as archive:
            for info in archive:
                _refuse_if_hostile(info, shard)
                if not info.isdir():
                    _check_size(info, shard, file_size, limit)
                if info.offset_data + info.size > file_size and not info.issparse():
                    raise TarProblem(f"{shard}: member {info.name!r} is truncated", kind="truncated",
                                     member=info.name)
                count += 1
                last = info.name
            end = archive.offset
    except (tarfile.TarError, EOFError) as exc:
        if count == 0:
            with open(path, "rb") as handle:
                raise not_a_tar(shard, handle.read(8), exc) from None
        raise TarProblem(f"{shard}: truncated or corrupt tar ({exc})") from None
    with open(path, "rb") as handle:
        handle.seek(end)
        _check_end(handle.read(len(END_OF_ARCHIVE)), shard, last, end)
        check_padding(handle.read, shard, end, end + len(END_OF_ARCHIVE))
    return count


@dataclass
class TarSample:
    """One WebDataset sample read from a shard: its key and its members by extension."""

    key: str
    members: dict[str, bytes] = field(default_factory=dict)


def iter_samples(members: Iterable[tuple[str, bytes]], shard: str) -> Iterator[TarSample]:
    """Group consecutive members with the same key into samples (WebDataset's rule).

    A member without an extension, or a key.ext seen twice in a row, is a TarProblem (an
    InputError) naming the shard and the member; a key that reappears later is left for the
    caller (verify reports it as a duplicate).
    """
    current: TarSample | None = None
    for name, data in members:
        key, ext = split_key(name)
        if key is None:
            raise TarProblem(f"{shard}: member {name!r}: {no_key_reason(name)}", member=name,
                             hint="every member of a shard is KEY.EXT; rebuild the shard")
        if current is not None and key == current.key:
            if ext in current.members:
                raise TarProblem(f"{shard}: member {name!r} appears twice in sample {key!r}", member=name,
                                 hint="each KEY.EXT once per sample; rebuild the shard")
            current.members[ext] = data
            continue
        if current is not None:
            yield current
        current = TarSample(key, {ext: data})
    if current is not None:
        yield current


def _template(mtime: int) -> tarfile.TarInfo:
    """The header every member of a shard starts from: a regular file, mode 0644, owner 0:0."""
    info = tarfile.TarInfo()
    info.mode = 0o644
    info.mtime = int(mtime)
    info.uname = info.gname = ""
    return info


@functools.lru_cache(maxsize=8)
def _ustar_block(mtime: int) -> bytes:
    """`tarfile`'s ustar header of a nameless empty member of `_template(mtime)`, checksum blank."""
    block = bytearray(_template(mtime).tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict"))
    block[148:156] = b" " * 8
    return bytes(block)


def _header(template: tarfile.TarInfo, name: str, size: int) -> bytes:
    """The header blocks of one member: ustar, or PAX where ustar cannot hold the name (or size).

    The same bytes as `tarfile`'s `tobuf`; a plain ASCII name of up to 100 characters is filled
    into a cached block (a tenth of the time), any other goes through `tarfile`."""
    if len(name) <= _USTAR_NAME and name.isascii() and 0 <= size < _USTAR_NUMBER and 0 <= template.mtime < _USTAR_NUMBER:
        block = bytearray(_ustar_block(template.mtime))
        encoded = name.encode("ascii")
        block[0 : len(encoded)] = encoded
        block[124:136] = b"%011o\0" % size
        block[148:155] = b"%06o\0" % sum(block)
        return bytes(block)
    info = template.replace(name=name, deep=False)
    info.size = size
    try:
        return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")
    except ValueError:  # name too long or not ASCII for ustar: a PAX header carries it
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")


def member_bytes(name: str, size: int, mtime: int = 0) -> int:
    """Exactly the bytes `TarShardWriter` writes for this member: its header blocks (a PAX header
    too where ustar cannot hold the name) plus its data padded to 512."""
    data = -(-size // BLOCK) * BLOCK
    if len(name) <= _USTAR_NAME and name.isascii() and size < _USTAR_NUMBER and 0 <= mtime < _USTAR_NUMBER:
        return BLOCK + data  # the common case, without building the header: one ustar block
    return len(_header(_template(mtime), name, size)) + data


def sample_bytes(key: str, members: dict[str, bytes], mtime: int = 0) -> int:
    """Exactly the bytes a sample takes in a shard written with this `mtime` (headers and padding included)."""
    return sum(member_bytes(f"{key}.{ext}", len(data), mtime) for ext, data in members.items())


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
    then written in one system call; fsynced on close, so a published shard is on disk. Its
    pages leave the page cache once written back (`storage.WriteBack(drop=True)`): a shard is
    read later, elsewhere or by a reader of its own. Has `write`, `writev`, `close`, `closed`."""

    GATHER_BYTES = 1024 * 1024
    GATHER_PARTS = 512  # below IOV_MAX (1024)

    def __init__(self, path: str):
        import pyarrow.fs as pafs

        from seedance_tasks.storage import WriteBack

        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.closed = False
        self._parts: list = []
        self._pending = 0
        self._written = 0
        self._write_back = WriteBack(pafs.LocalFileSystem(), path, drop=True)

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
        self._written += expected
        self._write_back.written(self._written)

    def write(self, data) -> None:
        self.writev([data])

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.flush()
                os.fsync(self.fd)
                self._write_back.durable()
            finally:
                self._write_back.close()
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
        self._template = _template(self.mtime)
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
        header = _header(self._template, name, size)
        remainder = size % BLOCK
        self._write_parts([header, *pieces, _ZEROS[: BLOCK - remainder]] if remainder else [header, *pieces])

    def add_sample(self, key: str, members: dict[str, bytes | tuple]) -> None:
        for ext in sorted(members):
            self.add_member(f"{key}.{ext}", members[ext])
        self.samples += 1

    def close(self) -> None:
        self._write(END_OF_ARCHIVE)
        self._hasher.finish()
