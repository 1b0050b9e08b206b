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
from dataclasses import dataclass

import pyarrow.fs as pafs

from seedance_tasks import storage
from seedance_tasks.errors import InputError, UsageError
from seedance_tasks.storage import Location

INDEX_NAME = "shardindex.json"
WIDS_VERSION = 1


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
class ShardSet:
    """The shards of a source, in order, and the index they came from (None: found by listing)."""

    source: str
    shards: list[ShardRef]
    index_uri: str | None = None


def _expand(uri: str) -> list[str]:
    import braceexpand

    return list(braceexpand.braceexpand(uri))


def _ref(location: Location, size: int | None = None, **known) -> ShardRef:
    return ShardRef(location.uri, location, posixpath.basename(location.path), size, **known)


def read_index(index: Location) -> ShardSet:
    """The shards an index file lists (URLs relative to the index's directory), with its figures."""
    try:
        data = storage.read_json(index.fs, index.path)
    except FileNotFoundError:
        raise InputError(f"index {index.uri} not found") from None
    except ValueError as exc:
        raise InputError(f"index {index.uri} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("wids_version") != WIDS_VERSION or not isinstance(
        data.get("shardlist"), list
    ):
        raise InputError(
            f"{index.uri} is not a shard index (wids_version 1 with a shardlist)",
            hint="rebuild it with `seedance shards build`, or point at the directory of tars",
        )
    base = posixpath.dirname(index.path)
    shards = []
    for entry in data["shardlist"]:
        url = entry.get("url") if isinstance(entry, dict) else None
        if not isinstance(url, str) or storage.is_hidden(url) or "://" in url:
            raise InputError(f"{index.uri}: bad shard entry {entry!r}", hint="URLs must be relative to the index")
        if url.startswith("/") or ".." in url.split("/"):
            raise InputError(f"{index.uri}: shard URL {url!r} leaves the index's directory")
        location = Location(index.fs, posixpath.join(base, url), index.scheme)
        shards.append(
            _ref(location, entry.get("filesize"), nsamples=entry.get("nsamples"), sha256=entry.get("sha256"))
        )
    return ShardSet(index.uri, shards, index.uri)


def resolve_shards(uri: str, *, use_index: bool = True) -> ShardSet:
    """Every shard of `uri`, in order. Raises InputError if there is none.

    `uri` may be a directory (its `shardindex.json` if present and `use_index`, else every visible
    `*.tar` below it, sorted), an index `.json` file, one `.tar`, or a brace pattern of tars.
    """
    if "{" in uri and ".." in uri:
        refs = []
        for expanded in _expand(uri):
            location = storage.resolve(expanded)
            info = location.fs.get_file_info(location.path)
            if info.type == pafs.FileType.NotFound:
                raise InputError(f"shard {expanded} (from the pattern {uri}) not found")
            refs.append(_ref(location, info.size))
        return ShardSet(uri, refs)
    location = storage.resolve(uri)
    info = location.fs.get_file_info(location.path)
    if info.type == pafs.FileType.NotFound:
        raise InputError(f"no shards at {uri}: nothing there", hint="check the path or URI")
    if info.type == pafs.FileType.File:
        if location.path.endswith(".json"):
            return read_index(location)
        if not location.path.endswith(".tar"):
            raise UsageError(f"{uri} is neither a .tar shard nor a shard index")
        return ShardSet(uri, [_ref(location, info.size)])
    index = location.child(INDEX_NAME)
    if use_index and storage.is_file(location.fs, index.path):
        return read_index(index)
    refs = [
        _ref(Location(location.fs, item.path, location.scheme), item.size)
        for item in storage.list_files(location)
        if item.path.endswith(".tar")
    ]
    if not refs:
        raise InputError(f"no .tar shards under {uri}", hint="build them with `seedance shards build`")
    return ShardSet(uri, refs)


def index_document(entries: list[dict], meta: dict | None = None, name: str | None = None) -> dict:
    """A wids-compatible index: entries are {"url", "nsamples", "filesize", "sha256"}."""
    doc = {"wids_version": WIDS_VERSION, "shardlist": entries}
    if name:
        doc["name"] = name
    if meta:
        doc["seedance"] = meta
    return doc
