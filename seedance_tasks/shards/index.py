"""Where shards are, and the index that describes them.

`resolve_shards(uri)` turns any WebDataset source into a list of shards: a directory of tars
(with or without our index), an index file, a single tar, or a brace pattern
(`data-{000000..000099}.tar`), on local disk or `s3://`. The index, `shardindex.json` beside the
shards, is in the form webdataset's `wids` reader loads (`wids_version: 1`, a `shardlist` of
`{"url", "nsamples"}` with URLs relative to the index) plus `filesize` and `sha256` per shard, so
loaders plan epochs and verify checksums without opening a tar.
"""

from __future__ import annotations

import posixpath
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from seedance_tasks import storage
from seedance_tasks.errors import InputError, RefusedError, SeedanceError, UsageError
from seedance_tasks.shards.buckets import refuse_missing_bucket
from seedance_tasks.storage import Location

INDEX_NAME = "shardindex.json"
COMPRESSED_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst", ".tzst")
WIDS_VERSION = 1
MAX_PATTERN_SHARDS = 100_000  # a brace pattern is expanded in memory: refuse one that names more
_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")  # braceexpand's own ranges
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")
_ALPHABET = string.ascii_uppercase + string.ascii_lowercase
ENTRY_HINT = "each shardlist entry must be an object with a relative `url` and an integer `nsamples`"
INDEX_HINT = "rebuild it with `seedance shards build`, or point at the directory of tars (--no-index)"


@dataclass
class ShardRef:
    """One shard: where it is, and what the index (if any) says about it."""

    uri: str
    location: Location
    name: str  # basename, e.g. prefix-000000.tar
    size: int | None = None
    nsamples: int | None = None
    sha256: str | None = None

    def to_dict(self) -> dict:
        return {"uri": self.uri, "name": self.name, "size": self.size, "nsamples": self.nsamples, "sha256": self.sha256}


@dataclass
class ListingProblem:
    """Something wrong with the list of shards itself: a bad index or entry, a shard not there."""

    shard: str  # the shard, or the index where there is no shard to name
    kind: str  # index, refused, duplicate, missing
    message: str  # about `shard`, which it does not repeat
    hint: str

    def to_dict(self) -> dict:
        """As one of verify's problems."""
        return {"shard": self.shard, "key": None, "kind": self.kind, "problem": self.message}

    def error(self) -> SeedanceError:
        """As the error `resolve_shards` raises when it is strict."""
        cls = RefusedError if self.kind == "refused" else InputError
        return cls(f"{self.shard}: {self.message}", hint=self.hint)


@dataclass
class ShardSet:
    """The shards of a source, in order, the index they came from (None: found by listing), and
    the problems of the listing itself (left for the caller only when `resolve_shards` is lenient)."""

    source: str
    shards: list[ShardRef]
    index_uri: str | None = None
    problems: list[ListingProblem] = field(default_factory=list)


def _expression_count(expr: str) -> int:
    """How many strings braceexpand makes of one group `{expr}`: a range, a comma list, or a literal."""
    if match := _INT_RANGE.match(expr):
        first, last, step = match.groups()
        return abs(int(last) - int(first)) // (int(step or 0) or 1) + 1
    if match := _CHAR_RANGE.match(expr):
        first, last, step = match.groups()
        step, i, j = int(step or 0) or 1, _ALPHABET.index(first), _ALPHABET.index(last)
        return len(_ALPHABET[i : j + 1 : step] if i < j else _ALPHABET[i : (j or -len(_ALPHABET)) - 1 : -step])
    parts, start, depth, pos = [], 0, 0, 0
    while pos < len(expr):
        if expr[pos] == "\\":
            pos += 2
            continue
        if expr[pos] in "{}":
            depth += 1 if expr[pos] == "{" else -1
        elif expr[pos] == "," and depth == 0:
            parts.append(expr[start:pos])
            start = pos + 1
        pos += 1
    if depth or not parts:  # not a list: the braces are kept as text around what is inside
        return pattern_size(expr)
    return sum(pattern_size(part) for part in [*parts, expr[start:]])


def pattern_size(pattern: str) -> int:
    """Exactly how many names `braceexpand(pattern)` makes, counted without making any of them.

    Follows braceexpand's grammar (integer and letter ranges with steps, comma lists, groups nested
    in either, backslash escapes): the product of the top-level groups' counts, a list counting the
    sum of its items'. ValueError where braceexpand cannot expand it either (unbalanced braces).
    """
    count, start, depth, pos = 1, 0, 0, 0
    while pos < len(pattern):
        if pattern[pos] == "\\":
            pos += 2
            continue
        if pattern[pos] == "{":
            start = pos if depth == 0 else start
            depth += 1
        elif pattern[pos] == "}":
            depth -= 1
            if depth == 0:
                count *= _expression_count(pattern[start + 1 : pos])
                start = pos + 1
        pos += 1
    if depth:
        raise ValueError("unbalanced braces")
    return count


def _expand(uri: str) -> Iterator[str]:
    """The names a brace pattern makes, one at a time; UsageError if it makes too many to list."""
    import braceexpand  # builds each range in memory: sized first

    try:
        size = pattern_size(uri)
        names = braceexpand.braceexpand(uri) if size <= MAX_PATTERN_SHARDS else None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"the pattern {uri} cannot be expanded: {exc}",
                         hint="balance its braces (escape a literal one as \\{), or point at the directory") from None
    if names is None:
        raise UsageError(
            f"the pattern {uri} names {size:,} shards, more than {MAX_PATTERN_SHARDS:,}",
            hint="check its ranges, split it into smaller patterns, or point at the directory or its shardindex.json",
        )
    yield from names


def _ref(location: Location, size: int | None = None, **known) -> ShardRef:
    return ShardRef(location.uri, location, posixpath.basename(location.path), size, **known)


def _load_index(index: Location) -> tuple[list | None, ListingProblem | None]:
    """The index's shardlist, or why it is not a shard index."""
    try:
        data = storage.read_json(index.fs, index.path)
    except FileNotFoundError:
        raise InputError(f"index {index.uri} not found", hint="check the path or URI") from None
    except ValueError as exc:
        return None, ListingProblem(index.uri, "index", f"not valid JSON: {exc}", INDEX_HINT)
    if not isinstance(data, dict) or data.get("wids_version") != WIDS_VERSION or not isinstance(
        data.get("shardlist"), list
    ):
        return None, ListingProblem(index.uri, "index",
                                    "not a shard index (wids_version 1 with a shardlist)", INDEX_HINT)
    return data["shardlist"], None


def _url_problem(index: Location, entry) -> ListingProblem | None:
    """Why a shardlist entry's url cannot name a shard beside the index, or None."""
    url = entry.get("url") if isinstance(entry, dict) else None
    if not isinstance(url, str) or not url:
        return ListingProblem(index.uri, "index", f"bad shardlist entry {entry!r}", ENTRY_HINT)
    if "\0" in url or not storage.is_utf8(url):
        return ListingProblem(index.uri, "index", f"shard URL {url!r} holds a NUL or a character that is not text",
                              "URLs must be relative paths of published shards; rebuild the index")
    if url.startswith("/") or ".." in url.split("/"):
        return ListingProblem(index.uri, "refused", f"shard URL {url!r} leaves the index's directory",
                              "an index lists only shards in its own directory or below; rebuild it")
    if "://" in url or storage.is_hidden(posixpath.normpath(url)):
        return ListingProblem(index.uri, "index", f"shard URL {url!r} is not a visible relative path",
                              "URLs must be relative to the index and name published (not hidden) shards")
    base = Location(index.fs, posixpath.dirname(index.path), index.scheme)
    if (link := storage.through_link(base, posixpath.normpath(url))) is not None:
        return ListingProblem(index.uri, "refused", f"shard URL {url!r} passes through the symlink {link!r}, "
                              "which may lead out of the index's directory; not followed",
                              "list only the shards themselves, not links to them; rebuild the index")
    return None


def _figure(entry: dict, name: str, kinds: tuple[type, ...], uri: str,
            problems: list[ListingProblem]) -> int | str | None:
    """An entry's `nsamples`, `filesize` or `sha256`, or None (and a problem) if it has the wrong type."""
    value = entry.get(name)
    wrong = isinstance(value, bool) or not isinstance(value, kinds) or (isinstance(value, int) and value < 0)
    if value is None or not wrong:
        return value
    problems.append(ListingProblem(uri, "index", f"the index gives it {name} {value!r}", ENTRY_HINT))
    return None


def read_index(index: Location) -> ShardSet:
    """The shards an index file lists (URLs relative to the index's directory), with its figures.

    Problems of the index (not JSON, not a shard index, a bad entry, a URL leaving the index's
    directory, a shard listed twice) are in the ShardSet's `problems`; the entries that are fine
    are listed all the same.
    """
    shard_set = ShardSet(index.uri, [], index.uri)
    shardlist, problem = _load_index(index)
    if problem:
        shard_set.problems.append(problem)
        return shard_set
    base = posixpath.dirname(index.path)
    listed: set[str] = set()
    for entry in shardlist:
        if (problem := _url_problem(index, entry)) is not None:
            shard_set.problems.append(problem)
            continue
        location = Location(index.fs, posixpath.normpath(posixpath.join(base, entry["url"])), index.scheme)
        if location.path in listed:
            shard_set.problems.append(ListingProblem(location.uri, "duplicate",
                                                     f"listed twice in {index.uri}", INDEX_HINT))
            continue
        listed.add(location.path)
        figures = {name: _figure(entry, name, kinds, location.uri, shard_set.problems)
                   for name, kinds in (("filesize", (int,)), ("nsamples", (int,)), ("sha256", (str,)))}
        shard_set.shards.append(_ref(location, figures.pop("filesize"), **figures))
    return shard_set


def _pattern_shards(uri: str) -> ShardSet:
    shard_set = ShardSet(uri, [])
    for expanded in _expand(uri):
        location = storage.resolve(expanded)
        info = location.fs.get_file_info(location.path)
        if info.type == pafs.FileType.NotFound:
            shard_set.problems.append(ListingProblem(
                location.uri, "missing", f"not found (the pattern {uri} names it)",
                "check the pattern's ranges, or rebuild or re-fetch the missing shard"))
        else:
            shard_set.shards.append(_ref(location, info.size))
    return shard_set


def _listed_shards(uri: str, use_index: bool) -> ShardSet:
    location = storage.resolve(uri)
    info = location.fs.get_file_info(location.path)
    if info.type == pafs.FileType.NotFound:
        refuse_missing_bucket(location, f"no shards at {uri}", output=False)
        raise InputError(f"no shards at {uri}: nothing there", hint="check the path or URI")
    if info.type == pafs.FileType.File:
        if location.path.endswith(".json"):
            return read_index(location)
        if location.path.endswith(COMPRESSED_SUFFIXES):
            raise UsageError(f"{uri} is a compressed tar: shards are read as plain .tar files",
                             hint="decompress it to a .tar (e.g. gunzip), or rebuild with `seedance shards build`")
        if not location.path.endswith(".tar"):
            raise UsageError(f"{uri} is neither a .tar shard nor a shard index",
                             hint="point at a .tar, a shardindex.json, a directory of shards or a brace pattern")
        return ShardSet(uri, [_ref(location, info.size)])
    if info.type != pafs.FileType.Directory:  # a FIFO, a device, a socket: never opened
        raise UsageError(f"{uri} is not a regular file or a directory",
                         hint="point at a .tar, a shardindex.json, a directory of shards or a brace pattern")
    index = location.child(INDEX_NAME)
    if use_index and storage.is_file(location.fs, index.path):
        return read_index(index)
    files = storage.list_files(location)
    refs = [_ref(Location(location.fs, item.path, location.scheme), item.size)
            for item in files if item.path.endswith(".tar")]
    if not refs:
        compressed = sum(1 for item in files if item.path.endswith(COMPRESSED_SUFFIXES))
        if compressed:
            raise InputError(f"no .tar shards under {uri}, only {compressed} compressed tar(s) (.tar.gz, .tgz...): "
                             "shards are read as plain .tar files",
                             hint="decompress them to .tar files (e.g. gunzip), or rebuild with `seedance shards build`")
        raise InputError(f"no .tar shards under {uri}", hint="build them with `seedance shards build`")
    return ShardSet(uri, refs)


def _is_pattern(uri: str) -> bool:
    """Whether `uri` is a brace pattern: a range (`{0..9}`, as always), or a list (`{a,b}`) where
    no file or folder of that very name exists (a name may hold braces)."""
    if "{" not in uri:
        return False
    if ".." in uri:
        return True
    try:
        listed = pattern_size(uri) > 1
    except ValueError:  # unbalanced: a plain name
        return False
    if not listed:
        return False
    location = storage.resolve(uri)
    return location.fs.get_file_info(location.path).type == pafs.FileType.NotFound


def resolve_shards(uri: str, *, use_index: bool = True, strict: bool = True) -> ShardSet:
    """Every shard of `uri`, in order. Raises InputError if there is none.

    `uri` may be a directory (its `shardindex.json` if present and `use_index`, else every visible
    `*.tar` below it, sorted), an index `.json` file, one `.tar`, or a brace pattern of tars (at
    most MAX_PATTERN_SHARDS of them: ranges `{000..099}` and lists `{a,b}`, as webdataset takes
    them). A problem of the listing (a bad index or entry, a shard of the pattern not found)
    raises its error if `strict`; otherwise it is left in `problems` and the other shards are
    listed. A compressed tar (`.tar.gz`...) is not a shard: one named, or a folder holding only
    those, is an error that says so.
    """
    shard_set = _pattern_shards(uri) if _is_pattern(uri) else _listed_shards(uri, use_index)
    if strict and shard_set.problems:
        raise shard_set.problems[0].error()
    return shard_set


def index_document(entries: list[dict], meta: dict | None = None, name: str | None = None) -> dict:
    """A wids-compatible index: entries are {"url", "nsamples", "filesize", "sha256"}."""
    doc = {"wids_version": WIDS_VERSION, "shardlist": entries}
    if name:
        doc["name"] = name
    if meta:
        doc["seedance"] = meta
    return doc
