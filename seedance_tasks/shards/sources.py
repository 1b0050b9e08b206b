"""Samples to pack into shards, from a directory of sample files or from a Parquet dataset.

A directory holds files in WebDataset's convention: `KEY.jpg`, `KEY.json`, `KEY.cls` ... grouped
by key (the path up to the first dot of the file name, subdirectories included). A Parquet
dataset holds one row per sample: a key column and one column per member (encoded as `cells`
says: bytes as they are, strings as UTF-8, numbers as their decimal text, anything else as JSON).

Each source yields `(key, members)` for good samples and reports bad ones (`Rejected`): a sample
missing a required member, a file or row group that cannot be read, a sample the caller's check
refuses (an image that does not decode). Nothing is dropped silently. A source never reads
outside its root: a symbolic link in it (to a file or a directory) is not followed, and is
reported once; so is a FIFO, socket or device file (never opened), an S3 key with a `.` or `..`
component (never read), and a hidden name (`_`/`.` prefix, e.g. a camera's `_DSC0001.JPG`: shard
readers skip such names, so it is not packed; a hidden folder is reported once, Seedance's own
`_seedance/` not at all; in a Parquet dataset only hidden `.parquet` files, not `_SUCCESS` and kin).
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import random
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from seedance_tasks import storage
from seedance_tasks.errors import InputError, UsageError
from seedance_tasks.parallel import ordered_map
from seedance_tasks.shards.buckets import refuse_missing_bucket
from seedance_tasks.shards.cells import CellError, cell_bytes, column_values
from seedance_tasks.shards.checks import size_problem
from seedance_tasks.shards.tario import check_member_name, extension_problem, sample_name_problem, split_key
from seedance_tasks.storage import Location

READ_CHUNK = 16  # samples per read task: amortises the thread pool's per-task cost on small files
SYMLINK_REASON = "symbolic link: not followed (a source is never read outside its root)"
UNDECODABLE_REASON = "file name is not UTF-8 (shown with \\xNN escapes): not read; rename it to pack it"
DOT_KEY_REASON = ("S3 key with a `.` or `..` component: not read (it names another place than it is listed at; "
                  "rename it without them to pack it)")
SPECIAL_REASON = "{kind}, not a regular file: never opened (reading a FIFO or a device can block or never end)"
HIDDEN_REASON = ("hidden name (starts with `_` or `.`): not packed, as shard readers skip such names; "
                 "rename it without the prefix (e.g. DSC0001.JPG for _DSC0001.JPG) to pack it")
HIDDEN_FOLDER_REASON = ("hidden folder (name starts with `_` or `.`), {count} file(s): not packed, as shard readers "
                        "skip such names; rename it without the prefix to pack its samples")

log = logging.getLogger(__name__)

Check = Callable[[str, dict], "str | None"]  # (key, members) -> why the sample is refused, or None


@dataclass
class Rejected:
    """A sample (or a whole file) that did not go into a shard, and why."""

    key: str | None
    source: str
    reason: str

    def to_dict(self) -> dict:
        return {"key": self.key, "source": self.source, "reason": self.reason}


@dataclass
class Source:
    """A listed source: its kind, its files (for the fingerprint) and how to read its samples."""

    uri: str
    kind: str  # "files" or "parquet"
    location: Location
    files: list[Any]  # pyarrow FileInfo
    required: list[str]
    key_column: str = "__key__"
    rejected: list[Rejected] = field(default_factory=list)
    units: list[Any] = field(default_factory=list)  # files: (key, {ext: path}) per complete sample

    def fingerprint_items(self) -> list:
        return [[self.location.relative(item.path), item.size, item.mtime_ns] for item in self.files]


def open_source(uri: str, *, required: list[str] | None = None, key_column: str = "__key__",
                max_member_size: int | None = None) -> Source:
    """List `uri` once and decide its kind: Parquet if it holds `.parquet` files, else sample files.

    A sample file above `max_member_size` bytes (by its listed size) rejects its sample before
    any of it is read, so one huge stray file never fills memory.

    Raises InputError if it holds nothing, UsageError if it mixes Parquet with other files or is
    one file that is not Parquet.
    """
    location = storage.resolve(uri)
    kind = location.fs.get_file_info(location.path).type
    if kind == pafs.FileType.File and not location.path.endswith(".parquet"):
        raise UsageError(f"{uri} is a file, not a dataset directory",
                         hint="point SRC at the directory of sample files (or at a Parquet file or dataset)")
    if kind not in (pafs.FileType.File, pafs.FileType.Directory, pafs.FileType.NotFound):
        raise UsageError(f"{uri} is a {special_kind(location.path)}, not a dataset directory",
                         hint="point SRC at the directory of sample files (or at a Parquet file or dataset)")
    listing, hidden = _listing(location)
    files = listing.files
    unread = [Rejected(None, relative, SYMLINK_REASON) for relative in listing.symlinks]
    unread += [Rejected(None, relative, UNDECODABLE_REASON) for relative in listing.undecodable]
    unread += [Rejected(None, relative, SPECIAL_REASON.format(kind=special_kind(location.join(relative))))
               for relative in listing.special]
    unread += [Rejected(None, relative, DOT_KEY_REASON) for relative in listing.dot_keys]
    skipped = [f"{len(listing.symlinks)} symbolic link(s), not followed"] if listing.symlinks else []
    if listing.undecodable:
        skipped.append(f"{len(listing.undecodable)} name(s) that are not UTF-8, not read")
    if listing.special:
        skipped.append(f"{len(listing.special)} FIFO(s), socket(s) or device(s), not opened")
    if listing.dot_keys:
        skipped.append(f"{len(listing.dot_keys)} key(s) with a `.` or `..` component, not read")
    parquet = [item for item in files if item.path.endswith(".parquet")]
    if parquet:  # Parquet tools write `_SUCCESS`, `_metadata`, `.crc` files: only a hidden Parquet file is news
        hidden = {relative: count for relative, count in hidden.items() if relative.endswith(".parquet")}
    unread += _report_hidden(uri, hidden)
    if hidden:
        skipped.append(f"{len(hidden)} hidden name(s) (`_`/`.` prefix), not packed")
    if not files:
        refuse_missing_bucket(location, f"no sample files under {uri}", output=False)
        raise InputError(
            f"no sample files under {uri}" + (f" ({'; '.join(skipped)})" if skipped else ""),
            hint="rename the hidden files without their `_`/`.` prefix to pack them" if hidden
            else "point SRC at a directory of samples or Parquet files",
        )
    if parquet:
        others = [item.path for item in files if not item.path.endswith(".parquet")]
        if others:
            raise UsageError(
                f"{uri} mixes Parquet files with other files (e.g. {location.relative(others[0])})",
                hint="a source is either Parquet (one row per sample) or sample files, not both",
            )
        return Source(uri, "parquet", location, parquet, list(required or []), key_column, rejected=unread)
    return _files_source(uri, location, files, required, unread, max_member_size)


def _listing(location: Location) -> tuple[storage.Listing, dict[str, int]]:
    """One listing of the source (`storage.list_tree`, hidden names included, then set apart) and
    its hidden names, relative: a hidden file as it is, a hidden folder once (`dir/.thumbs/`,
    with the number of files it holds). Seedance's own `_seedance/` at the top is neither listed nor reported."""
    full = storage.list_tree(location, include_hidden=True)
    files, dot_keys, hidden = [], list(full.dot_keys), []
    for item in full.files:
        if item.path.rstrip("/") == location.path.rstrip("/"):  # the source is this one file
            files.append(item)
            continue
        relative = location.relative(item.path)
        if location.is_s3 and any(part in (".", "..") for part in relative.split("/")):
            dot_keys.append(relative)  # as the listing without hidden names reports it: never read
        elif storage.is_hidden(relative):
            hidden.append(relative)
        else:
            files.append(item)
    unlisted = {name: [relative for relative in getattr(full, name) if not storage.is_hidden(relative)]
                for name in ("symlinks", "undecodable", "special")}
    hidden += [relative for name in unlisted for relative in getattr(full, name) if storage.is_hidden(relative)]
    return storage.Listing(files, dot_keys=sorted(dot_keys), **unlisted), _hidden_names(hidden)


def _hidden_names(relatives: list[str]) -> dict[str, int]:
    """{each hidden file of `relatives` as it is, and each hidden folder once as `path/`: how many
    of `relatives` it is or holds}, sorted by name."""
    names: dict[str, int] = {}
    for relative in relatives:
        parts = relative.split("/")
        first = next(number for number, part in enumerate(parts) if part.startswith(("_", ".")))
        if first == 0 and parts[0] == storage.SEEDANCE_DIR:
            continue
        name = relative if first == len(parts) - 1 else "/".join(parts[: first + 1]) + "/"
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items()))


def _report_hidden(uri: str, hidden: dict[str, int]) -> list[Rejected]:
    """The rejections of the hidden names of a source (`_hidden_names`), and one warning naming them."""
    if not hidden:
        return []
    log.warning("%d hidden name(s) under %s not packed (starting with `_` or `.`: shard readers skip them), "
                "e.g. %s\n  hint: rename them without the prefix to pack them; the build report lists them all",
                len(hidden), uri, ", ".join(list(hidden)[:5]))
    return [Rejected(None, relative, HIDDEN_FOLDER_REASON.format(count=count) if relative.endswith("/")
                     else HIDDEN_REASON) for relative, count in hidden.items()]


def special_kind(path: str) -> str:
    """What the local entry at `path` is, in words (`FIFO (named pipe)`, `socket`, `character device`,
    ...), from its lstat: the entry is never opened."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "file that could not be examined"
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symbolic link")):
        if test(mode):
            return name
    return "special file"


def _files_source(uri: str, location: Location, files: list, required: list[str] | None,
                  rejected: list[Rejected], max_member_size: int | None) -> Source:
    source = Source(uri, "files", location, files, [], rejected=rejected)
    groups: dict[str, dict[str, str]] = {}
    too_large: dict[str, str] = {}  # key -> why, from the listed sizes
    for item in files:
        relative = location.relative(item.path)
        key, ext = split_key(relative)
        if key is None or not ext:
            source.rejected.append(Rejected(None, relative, "file name has no extension, so no sample key"))
            continue
        groups.setdefault(key, {})[ext] = item.path
        if (problem := size_problem(f"{key}.{ext}", item.size or 0, max_member_size)) is not None:
            too_large.setdefault(key, problem)
    if required is None:  # the extensions at least half of the samples have (`JPG` counts as `jpg`, as readers see it)
        counts: dict[str, int] = {}
        for members in groups.values():
            for ext in {ext.lower() for ext in members}:
                counts[ext] = counts.get(ext, 0) + 1
        required = sorted(ext for ext, count in counts.items() if 2 * count >= len(groups))
    source.required = list(required)
    units = []
    for key in sorted(groups):
        missing = _missing(source.required, groups[key])
        if (problem := too_large.get(key) or sample_name_problem(key, groups[key])) is not None:
            source.rejected.append(Rejected(key, uri, problem))
        elif missing:
            source.rejected.append(Rejected(key, uri, f"incomplete: no {', '.join(missing)} member"))
        else:
            units.append((key, groups[key]))
    source.units = units
    return source


def _missing(required: list[str], exts) -> list[str]:
    """The required extensions a sample with members `exts` lacks, ignoring case as readers do."""
    have = {ext.lower() for ext in exts}
    return [ext for ext in required if ext.lower() not in have]


def _read(fs, path: str) -> bytes:
    if isinstance(fs, pafs.LocalFileSystem):  # plain open() is cheaper per small file
        with open(path, "rb", buffering=0) as handle:
            return handle.readall()
    return storage.read_bytes(fs, path)


def _read_file_sample(fs, unit: tuple[str, dict[str, str]],
                      check: Check | None) -> tuple[str, dict[str, bytes] | None, str | None]:
    key, paths = unit
    members = {}
    for ext, path in paths.items():
        try:
            members[ext] = _read(fs, path)
        except (OSError, pa.ArrowException) as exc:  # pyarrow refuses some S3 keys (`a//b.jpg`) as invalid paths
            return key, None, f"unreadable member {posixpath.basename(path)}: {exc}"
    problem = check(key, members) if check else None  # on the reading thread: PIL releases the GIL
    return (key, None, problem) if problem else (key, members, None)


def _parquet_units(source: Source) -> list[tuple]:
    """(path, relative, row group, first row of the group in its file, footer) of every row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    units = []
    for item in source.files:
        relative = (posixpath.basename(item.path) if item.path == source.location.path  # SRC is this one file
                    else source.location.relative(item.path))
        try:
            metadata = pq.ParquetFile(source.location.fs.open_input_file(item.path)).metadata
        except (OSError, pa.ArrowException) as exc:
            source.rejected.append(Rejected(None, relative, f"unreadable Parquet file: {exc}"))
            continue
        first = 0
        for group in range(metadata.num_row_groups):
            units.append((item.path, relative, group, first, metadata))
            first += metadata.row_group(group).num_rows
    return units


def key_problem(key: str) -> str | None:
    """Why `key` cannot name a sample in a shard (WebDataset splits member names at '/' and '.'), or None."""
    if not key:
        return "empty key"
    if "/" in key or "." in key or key.startswith("_"):
        return "key contains '/', '.' or a hidden prefix"
    problem = check_member_name(key)
    return f"key cannot name tar members ({problem})" if problem else None


def _place_key(relative: str, group: int, row: int) -> str:
    """The key of a row of a file without a key column, from its place: the file's path without
    `.parquet` (with `%`, `/`, `.` and `\\` escaped as %XX, so no two files give one key), the
    row group and the row."""
    stem = relative[: -len(".parquet")] if relative.endswith(".parquet") else relative
    escaped = "".join(f"%{ord(char):02X}" if char in "%/.\\" else char for char in stem)
    return f"{escaped}-{group:04d}-{row:08d}"


def _row_key(columns: dict[str, list], key_column: str, relative: str, group: int, row: int) -> tuple[str | None, str | None]:
    """A row's key and why it is bad (or None); without a key column, the key is made from the row's place."""
    if key_column not in columns:
        key = _place_key(relative, group, row)
        return key, key_problem(key)
    value = columns[key_column][row]
    if value is None:
        return None, f"null key (column {key_column!r})"
    if isinstance(value, CellError):
        return None, f"column {key_column!r}: cannot read the key ({value.reason})"
    if isinstance(value, bytes):  # a string column written without its UTF-8 annotation
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None, f"column {key_column!r}: the key {value!r} is not UTF-8 text"
    key = str(value)
    return key, key_problem(key)


def _columns_problem(names: list[str], key_column: str) -> str | None:
    """Why the columns `names` cannot be a row's key and members (a name twice, or one no member
    name can carry), or None."""
    if names.count(key_column) > 1:
        return f"the key column {key_column!r} appears {names.count(key_column)} times"
    problem = extension_problem(name for name in names if name != key_column)
    return f"column names cannot name members: {problem}" if problem else None


def _row_members(columns: dict[str, list], key_column: str, row: int) -> tuple[dict[str, bytes], str | None]:
    """The row's members (null cells left out), or why one of its cells cannot be encoded."""
    members = {}
    for name, values in columns.items():
        value = values[row]
        if name == key_column or value is None:
            continue
        if isinstance(value, CellError):
            return {}, f"column {name!r}: cannot encode the value ({value.reason})"
        members[name] = cell_bytes(value)
    return members, None


def _parquet_samples(source: Source, shuffle: bool, seed: int,
                     check: Check | None) -> Iterator[tuple[str, dict[str, bytes]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    key_column = source.key_column
    rng = random.Random(seed)
    seen: set[int] = set()  # 64-bit digests of the keys yielded: a repeated key would merge two samples
    units = _parquet_units(source)  # (file, row group) pairs: a block shuffle keeps memory to one row group
    if shuffle:
        rng.shuffle(units)
    for path, relative, group, first, metadata in units:
        try:  # the footer read above is reused: each row group costs only its own column chunks
            table = pq.ParquetFile(source.location.fs.open_input_file(path), metadata=metadata).read_row_group(group)
        except (OSError, pa.ArrowException) as exc:
            source.rejected.append(Rejected(None, f"{relative}#rowgroup{group}", f"unreadable row group: {exc}"))
            continue
        if (problem := _columns_problem(table.column_names, key_column)) is not None:
            source.rejected.append(Rejected(None, f"{relative}#rowgroup{group}", problem))
            continue
        payload = [field.name for field in table.schema if field.name != key_column and is_bytes_type(field.type)]
        required = source.required or payload
        columns = {name: column_values(table.column(name)) for name in table.column_names}
        order = list(range(table.num_rows))
        if shuffle:
            rng.shuffle(order)
        for row in order:
            where = f"{relative}#row{first + row}"
            key, problem = _row_key(columns, key_column, relative, group, row)
            members, bad_cell = ({}, None) if problem else _row_members(columns, key_column, row)
            missing = _missing(required, members)
            if problem or bad_cell:
                source.rejected.append(Rejected(key, where, problem or bad_cell))
            elif missing:
                source.rejected.append(Rejected(key, where, f"incomplete: no {', '.join(missing)}"))
            elif not members:  # it would be counted as a sample and write nothing
                source.rejected.append(Rejected(key, where, "empty: no column other than the key has a value"))
            elif (digest := _key_digest(key)) in seen:
                source.rejected.append(Rejected(key, where, "duplicate key: an earlier row has it "
                                                "(a reader would merge the two samples)"))
            elif check and (problem := check(key, members)):
                source.rejected.append(Rejected(key, where, problem))
            else:
                seen.add(digest)
                yield key, members


def is_bytes_type(type_: pa.DataType) -> bool:
    """Whether a column of `type_` holds raw bytes (an image...): binary in any of Arrow's layouts
    (large, view, fixed size: another writer's choice, e.g. polars' binary_view)."""
    return (pa.types.is_binary(type_) or pa.types.is_large_binary(type_) or pa.types.is_binary_view(type_)
            or pa.types.is_fixed_size_binary(type_))


def _key_digest(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def iter_source_samples(
    source: Source, *, shuffle: bool = False, seed: int = 0, read_workers: int = 4, check: Check | None = None
) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Good samples of `source` as (key, {ext: bytes}); bad ones are appended to `source.rejected`.

    Sample files are read (and `check`ed: a reason it returns rejects the sample) by
    `read_workers` threads ahead of the caller. With `shuffle`, sample files are fully shuffled
    by `seed`; Parquet is block-shuffled (row groups, then rows within).
    """
    if source.kind == "parquet":
        yield from _parquet_samples(source, shuffle, seed, check)
        return
    units = list(source.units)
    if shuffle:
        random.Random(seed).shuffle(units)
    fs = source.location.fs
    chunks = [units[i : i + READ_CHUNK] for i in range(0, len(units), READ_CHUNK)]
    for chunk in ordered_map(
        lambda part: [_read_file_sample(fs, unit, check) for unit in part], chunks,
        threads=read_workers, ahead=4 * read_workers, name="seedance-read",
    ):
        for key, members, error in chunk:
            if error:
                source.rejected.append(Rejected(key, source.uri, error))
            else:
                yield key, members
