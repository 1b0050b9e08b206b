"""`seedance shards verify`: check shards without trusting them.

Every tar is streamed once (so `s3://` costs one GET per shard) and checked: readable to the end
and ending with its end-of-archive marker (a tar cut exactly at a member boundary is truncated)
followed by nothing but zero padding (a second tar appended is never read by readers),
no member with an absolute name, `..`, a link, a device node or a FIFO, no member declaring more
bytes than `shards.max_member_size` or than the whole tar (refused before it is read, so a
sparse tar declaring a terabyte costs nothing), no key seen twice (in the same shard or across
shards; extensions compared ignoring case, as readers lowercase them), no extension a reader
takes for its own field (`__key__`...), with `check_decode` every image member decodes (as
webdataset's `decode("pil")` and wids will), and, where an index lists the shard, sample count,
size and sha256 equal to the index's. A bad shard is reported and the check goes on with the next one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from seedance_tasks.errors import InputError, IntegrityError, RefusedError
from seedance_tasks.shards.checks import image_problem, is_image
from seedance_tasks.shards.index import ShardRef, resolve_shards
from seedance_tasks.shards.tario import (
    canonical_key,
    extension_problem,
    iter_members,
    no_key_reason,
    split_key,
)

READ_CHUNK = 4 * 1024 * 1024


class HashingReader:
    """A read-only stream wrapper that hashes (sha256) and counts every byte read through it."""

    def __init__(self, stream):
        self.stream = stream
        self.sha256 = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size) if size is not None and size >= 0 else self.stream.read()
        self.sha256.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        while self.read(READ_CHUNK):
            pass


def _verify_shard(shard: ShardRef, seen: dict[str, tuple[str, str]], problems: list[dict], *, check_decode: bool,
                  max_member_size: int) -> dict[str, Any]:
    """Check one shard, appending its problems; `seen` maps each canonical key to (shard, key) where first met."""
    def problem(kind: str, message: str, key: str | None = None) -> None:
        problems.append({"shard": shard.uri, "key": key, "kind": kind, "problem": message})

    samples = 0
    result: dict[str, Any] = {"shard": shard.uri, "samples": 0, "size": None, "sha256": None, "ok": True}
    before = len(problems)
    try:
        info = shard.location.fs.get_file_info(shard.location.path)
        if info.type == pafs.FileType.NotFound:
            problem("missing", "not found")
            result["ok"] = False
            return result
        if info.type != pafs.FileType.File:  # a FIFO would block the read forever, a device never end
            directory = info.type == pafs.FileType.Directory
            problem("unreadable" if directory else "refused",
                    f"not a regular file ({'a directory' if directory else 'a FIFO, device or socket'}); not read")
            result["ok"] = False
            return result
        file_size = info.size  # the tar's own, not the index's
        with shard.location.fs.open_input_stream(shard.location.path) as raw:
            reader = HashingReader(raw)
            current_key: str | None = None
            current_exts: set[str] = set()
            for name, data in iter_members(reader, shard.uri, file_size=file_size, max_member_size=max_member_size):
                key, ext = split_key(name)
                if key is None:
                    problem("no-key", f"member {name!r}: {no_key_reason(name)}")
                    continue
                if check_decode and is_image(ext):
                    bad = image_problem(data)
                    if bad:
                        problem("undecodable", f"member {name!r} {bad}", key)
                if (bad_ext := extension_problem([ext])) is not None:
                    problem("bad-name", f"member {name!r}: {bad_ext}", key)
                if key == current_key:
                    if ext.lower() in current_exts:  # readers lowercase extensions: JPG is jpg again
                        problem("duplicate", f"member {name!r} appears twice (extensions compared as readers "
                                "do, ignoring case)", key)
                    current_exts.add(ext.lower())
                    continue
                current_key, current_exts = key, {ext.lower()}
                if (first := seen.get(canonical_key(key))) is not None:
                    where = "earlier in this shard" if first[0] == shard.uri else f"in {first[0]}"
                    spelled = f" (as {first[1]!r})" if first[1] != key else ""
                    problem("duplicate", f"key {key!r} already seen {where}{spelled}", key)
                else:
                    seen[canonical_key(key)] = (shard.uri, key)
                samples += 1
            reader.drain()
    except RefusedError as exc:
        problem("refused", exc.message)
    except InputError as exc:
        problem(getattr(exc, "kind", "unreadable"), exc.message)
    except OSError as exc:
        problem("unreadable", f"cannot read {shard.uri}: {exc}")
    else:
        result.update(size=reader.size, sha256=reader.sha256.hexdigest())
        if shard.nsamples is not None and shard.nsamples != samples:
            problem("count", f"index says {shard.nsamples} samples, the tar holds {samples}")
        if shard.size is not None and shard.size != reader.size:
            problem("size", f"expected {shard.size} bytes, read {reader.size}")
        if shard.sha256 is not None and shard.sha256 != result["sha256"]:
            problem("checksum", f"sha256 {result['sha256']} differs from the index's {shard.sha256}")
    result["samples"] = samples
    result["ok"] = len(problems) == before
    return result


def verify(uri: str, *, use_index: bool = True, check_decode: bool | None = None,
           max_member_size: int | None = None, advance: Callable[[float], None] | None = None,
           on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Check every shard of `uri` (any WebDataset source `resolve_shards` accepts); returns a report.

    The report's `ok` is True only if no shard has a problem; `problems` lists each one with the
    shard, the key where there is one, a kind (refused, unreadable, truncated, trailing-data, too-large,
    undecodable, no-key, bad-name, duplicate, count, size, checksum, missing, index) and a message naming
    the member where there is one. A bad index entry, an entry leaving the index's directory
    (refused) and a shard of a brace pattern that is not there are problems too, and the other
    shards are still checked. `check_decode` and `max_member_size` default to `shards.*` of the
    config. Memory stays bounded by the largest member the limit allows. Never raises for bad shards;
    see `raise_for_problems` for that. `on_progress(shards_done, shards_total)` is called after
    each shard.
    """
    if check_decode is None or max_member_size is None:
        from seedance_tasks.config import load_settings

        configured = load_settings().shards
        check_decode = configured.check_decode if check_decode is None else check_decode
        max_member_size = int(configured.max_member_size) if max_member_size is None else max_member_size
    shard_set = resolve_shards(uri, use_index=use_index, strict=False)
    problems = [item.to_dict() for item in shard_set.problems]
    seen: dict[str, tuple[str, str]] = {}
    per_shard = []
    for shard in shard_set.shards:
        per_shard.append(_verify_shard(shard, seen, problems, check_decode=bool(check_decode),
                                       max_member_size=int(max_member_size)))
        if advance:
            advance(1)
        if on_progress:
            on_progress(len(per_shard), len(shard_set.shards))
    return {
        "source": uri,
        "index": shard_set.index_uri,
        "check_decode": bool(check_decode),
        "ok": not problems,
        "shards": len(per_shard),
        "samples": sum(item["samples"] for item in per_shard),
        "bytes": sum(item["size"] or 0 for item in per_shard),
        "problems": problems,
        "per_shard": per_shard,
    }


class BadShards(IntegrityError):
    """Shards whose own bytes are wrong (images that do not decode, duplicate or unreadable names,
    members too large, data after the end marker): reading them again gives the same answer, so a
    DAG task fails at once instead of being retried (exit code 4, as any verify problem)."""

    retryable = False


DATA_KINDS = frozenset({"undecodable", "duplicate", "bad-name", "no-key", "too-large", "trailing-data", "index"})
"""Kinds of problem that are in the bytes themselves: no later read can change them. The others
(count, size, checksum, missing, truncated, unreadable) may be a shard still being written or
replaced, or a storage hiccup, and stay retryable."""

_KIND_HINTS = {
    "undecodable": "images that do not decode as readers decode them: fix or drop those samples and rebuild the "
                   "shards (`seedance shards build` rejects them while check_decode is on), or verify with "
                   "--no-check-decode (shards.check_decode: false) to leave them to preprocessing, which reports "
                   "each as a failed sample",
    "duplicate": "a key or KEY.EXT twice, which readers merge or reject: rebuild the shards from the samples "
                 "(`seedance shards build` writes each key once)",
    "bad-name": "member names readers cannot split back into key and extension: rebuild the shards",
    "no-key": "members without a KEY.EXT name: rebuild the shards",
    "too-large": "members above shards.max_member_size: raise it if they are expected, else rebuild the shards",
    "trailing-data": "data after a tar's end-of-archive marker, which readers never read: split the tars apart or "
                     "rebuild the shards",
}
_DEFAULT_HINT = "rebuild the listed shards (seedance shards build) or re-fetch them"


def raise_for_problems(report: dict[str, Any]) -> None:
    """Raise for a failed report: RefusedError (a hostile tar, or an index naming files outside its
    directory), BadShards (an IntegrityError that no retry fixes: every problem is a `DATA_KINDS`
    one), else IntegrityError. The message counts the problems by kind and quotes the first; the
    hint says what to do about each kind present."""
    problems = report["problems"]
    if not problems:
        return
    first = problems[0]
    counts: dict[str, int] = {}
    for item in problems:
        counts[item["kind"]] = counts.get(item["kind"], 0) + 1
    kinds = ", ".join(f"{count} {kind}" for kind, count in counts.items())
    where = f"{first['shard']}" + (f", key {first['key']!r}" if first.get("key") else "")
    said = first["problem"] if first["problem"].startswith(f"{first['shard']}:") else f"{where}: {first['problem']}"
    summary = f"{len(problems)} problem(s) in {report['source']} ({kinds}); first: {said}"
    if "refused" in counts:
        raise RefusedError(summary, hint="these shards hold hostile members, or the index names files outside its "
                           "directory; nothing is extracted or followed")
    hints = list(dict.fromkeys(_KIND_HINTS.get(kind, _DEFAULT_HINT) for kind in counts))
    hint = "; ".join(hints) + (" (`seedance shards verify --json` lists every problem)" if len(problems) > 1 else "")
    if set(counts) <= DATA_KINDS:
        raise BadShards(summary, hint=hint)
    raise IntegrityError(summary, hint=hint)
