"""The checkpoint store: `STORE/RUN/step-N/` = data files + `manifest.json` (written last = commit).

Layout and manifest (format `seedance-checkpoint/2`; `/1` stores are still read), which GC and
tiering rely on:

- `tree`: the checkpoint's tree with tensors replaced by their index (see `tree.py`).
- `tensors[i]`: name, dtype (as given), stored_dtype (differs only under lossy `bf16`), shape,
  `stored_shape` (only for a broadcast tensor, e.g. `x.expand(...)`: its bytes hold each element
  once, broadcast dimensions as 1, and it restores as that expanded again, stride 0 as
  `torch.load` gives it), `stride` (only for a permuted dense layout, e.g. transposed or
  channels_last: the bytes are in logical order and restore into these strides, of the stored
  shape), codec, `base` (the step a delta tensor is taken against, else null), chunk_bytes, and `chunks`:
  `{file, offset, length, raw, blake3}` - where the compressed bytes are and the BLAKE3 digest of
  the raw (stored-dtype) bytes of that chunk (`sha256` in format 1). A tensor is read alone by
  reading only its chunks.
- `files`: `{name: {size, tier, uri}}`; `uri` null means "next to the manifest", otherwise the
  file lives at that URI (another tier). Readers go through `file_location`.
- `base`: `{step, id}` of the checkpoint this one's deltas are against (null for a keyframe),
  `chain`: every step a restore reads besides this one, nearest first (the keyframe last), and
  `depth` = len(chain). GC must keep every step in the `chain` of a kept checkpoint.
- `group`: the steps of this checkpoint's keyframe group so far (keyframe first, this one last);
  the next save picks its base from it (`base_position`: by default `pairs`, so `depth` stays
  <= 2 whatever K). A missing group member only means the next save starts a new keyframe.
- `metrics`, `tags`, `stats` (raw/stored bytes, ratio, seconds), `source`, `created_at`, `id`.

The manifest format is owned by `manifest.py` (typed, validated on every read) and the
listing, commits and rewrites by `catalog.py`. A checkpoint is immutable once committed.
Committing is an exclusive create of the manifest: of two saves of one step exactly one wins;
the other gets StepCommittedError and removes its own data files, which are named for its
attempt (`data-<attempt>-NNNN.bin`), so a step never mixes two saves. A step directory without
a manifest is an interrupted save: invisible to readers.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import posixpath
import re
import secrets
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow.fs as pafs

from seedance_tasks import storage
from seedance_tasks.checkpoint import choices, codecs
from seedance_tasks.checkpoint.catalog import (  # noqa: F401 - re-exported: the store's public API
    check_run_name,
    commit_manifest,
    committed_steps,
    existing_store,
    explain_unreadable,
    manifest_path,
    manifests,
    note_restore,
    read_manifest,
    read_run,
    runs,
)
from seedance_tasks.checkpoint.manifest import (  # noqa: F401
    FORMAT,
    LOSSY_FROM,
    MANIFEST,
    MAX_INT_DIGITS,
    STEP_DIR,
    checked_step,
    chunk_digest,
    dense_layout,
    held_shape,
    oversized_int,
    step_dir,
)
from seedance_tasks.checkpoint.manifest import stored_bytes as data_file_bytes
from seedance_tasks.checkpoint.tree import aliases, flatten, keep_exact, same_tree, unbroadcast, unflatten
from seedance_tasks.errors import IntegrityError, RefusedError, UsageError
from seedance_tasks.storage import Location

LOSSY_DTYPES = set(LOSSY_FROM)  # what a lossy bf16 save downcasts: the dtypes `parse` accepts as downcast
log = logging.getLogger(__name__)


class StepCommittedError(RefusedError):
    """Another save committed this step first (or it was stored before): nothing of ours is left."""


_check_name = check_run_name


def _workers(workers: int) -> int:
    return workers or os.cpu_count() or 1


def file_location(store: Location, run: str, step: int, name: str, entry: dict) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path) of data file `name` of a checkpoint: next to the manifest, or at its `uri`."""
    if entry.get("uri"):
        found = storage.resolve(entry["uri"])
        return found.fs, found.path
    return store.fs, store.join(run, step_dir(step), name)


# --------------------------------------------------------------------------- tensors <-> bytes


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _torch_dtype(name: str, where: str = "a manifest"):
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise IntegrityError(f"unknown dtype {name!r} in {where}",
                             hint="the manifest was edited or damaged, or written with a torch that has this dtype: "
                             "restore it with that torch version")
    return dtype


def _check_shape(entry: dict, where: str) -> None:
    """A tensor's shape must hold exactly its stored bytes (else it could not be rebuilt)."""
    shape, itemsize = entry["shape"], _torch_dtype(entry["stored_dtype"]).itemsize
    held = held_shape(shape, entry.get("stored_shape"))
    if any(size < 0 for size in shape) or held is None or math.prod(held) * itemsize != entry["nbytes"]:
        raise IntegrityError(
            f"manifest {where}: tensors[{entry['name']!r}].shape {str(shape)[:80]} of {entry['stored_dtype']} "
            f"does not hold its nbytes {entry['nbytes']}; refused",
            hint="the manifest was edited or damaged; restore it from the trash or a copy, or save the checkpoint again",
        )


def _raw_bytes(tensor) -> np.ndarray:
    """The tensor's bytes as a flat uint8 array (zero-copy for a contiguous CPU tensor)."""
    import torch

    flat = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    if flat.numel() == 1 and flat.stride() != (1,):  # one element that came in with stride 0 (`t.expand(1)`)
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8).numpy()


@dataclass
class _Prepared:
    name: str
    dtype: str
    stored_dtype: str
    shape: list[int]
    raw: np.ndarray
    width: int
    stored_shape: list[int] | None = None  # a broadcast tensor: the shape of the bytes it stores
    stride: list[int] | None = None  # a permuted dense layout, restored as such
    lossy: str | None = None
    original_bytes: int = 0
    chunk_bytes: int = 0  # raw bytes per chunk, a multiple of the element width
    codec: str = ""
    mask: str = ""
    base: np.ndarray | None = None
    base_step: int | None = None
    reused: choices.Choice | None = None  # the remembered codec choice this save reused
    sampled: bool = False  # codecs were tried on samples of it at this save
    choice_key: tuple = ()  # what its codec choice is remembered under (choices.key)
    chunks: list[dict] = field(default_factory=list)


def _prepare(name: str, tensor, lossy: str | None, lossy_min_elements: int) -> _Prepared:
    import torch

    dtype = _dtype_name(tensor.dtype)
    compact = unbroadcast(tensor)  # an expanded tensor stores each element once, as torch.save does
    stored, applied = compact, None
    if (
        lossy == "bf16"
        and dtype in LOSSY_DTYPES
        and tensor.numel() >= lossy_min_elements
        and not keep_exact(name)
    ):
        stored, applied = compact.detach().to(torch.bfloat16), "bf16"
    permuted = not compact.is_contiguous() and dense_layout(list(compact.shape), list(compact.stride()))
    return _Prepared(
        name=name,
        dtype=dtype,
        stored_dtype=_dtype_name(stored.dtype),
        shape=list(tensor.shape),
        raw=_raw_bytes(stored),
        stored_shape=list(compact.shape) if compact is not tensor else None,
        stride=list(compact.stride()) if permuted else None,
        width=stored.element_size(),
        lossy=applied,
        original_bytes=compact.numel() * compact.element_size(),
    )


# --------------------------------------------------------------------------- base cache (training loops)

_CACHE: dict[tuple[str, str], dict] = {}
_SPARE: dict[tuple[str, str], dict[str, np.ndarray]] = {}  # buffers of a dropped cache entry, for the next snapshot
_IN_FLIGHT: dict[tuple[str, str], int] = {}  # saves of a run running now (spare buffers only go to a lone save)
_CACHE_LOCK = threading.Lock()


def _cache_key(store: Location, run: str) -> tuple[str, str]:
    return (store.uri, run)


# --------------------------------------------------------------------------- save


def base_position(position: int, reference: str) -> int:
    """The position (in its keyframe group) of the base of the checkpoint at `position` >= 1.

    `pairs`: an odd position against the one just before, an even one against the keyframe
    (1->0, 2->0, 3->2, 4->0, 5->4, 6->0, 7->6): a restore reads at most 2 bases whatever K, and
    half the deltas are against a near neighbour. `skip`: `position` with its lowest set bit
    cleared (... 6->4, 7->6): nearer bases, but up to log2(K) of them. `previous`: the one just
    before (a chain as long as the group).
    """
    if reference == "previous":
        return position - 1
    if reference == "skip":
        return position & (position - 1)
    return position - 1 if position % 2 else 0


def _base_for(store: Location, run: str, step: int, keyframe_every: int, reference: str) -> tuple[dict | None, list]:
    """(manifest of the checkpoint to delta against or None for a keyframe, the new group list)."""
    earlier = [s for s in committed_steps(store, run) if s < step]
    if not earlier or keyframe_every <= 1:
        return None, [step]
    previous = read_manifest(store, run, earlier[-1])
    group = list(previous.get("group") or [previous["step"]])
    position = len(group)
    if position >= keyframe_every:
        return None, [step]
    base_step = group[base_position(position, reference)]
    if base_step == previous["step"]:
        return previous, [*group, step]
    try:
        return read_manifest(store, run, base_step), [*group, step]
    except IntegrityError:  # that base was removed since (GC): start a new group
        return None, [step]


def _still_needed(group: list[int], keyframe_every: int, reference: str) -> set[int]:
    """Steps of `group` that a later checkpoint of the same group may take as its base."""
    position = len(group) - 1
    return {
        group[base_position(later, reference)]
        for later in range(position + 1, keyframe_every)
        if base_position(later, reference) <= position
    }


def save_state(
    state: Any,
    store_uri: str,
    run: str,
    step: int,
    *,
    settings,
    codec: str | None = None,
    keyframe_every: int | None = None,
    lossy: str | None = None,
    metrics: dict | None = None,
    tags: Iterable[str] = (),
    source: dict | None = None,
    progress: Callable[[int], None] | None = None,
    attempt: str | None = None,
) -> dict:
    """Store `state` as checkpoint `run`/`step`; returns the summary (bytes, ratio, kind, base, MB/s).

    The data files are written first, under names unique to this attempt (`attempt`, default a
    random token), and the manifest last, by an exclusive create: a crash leaves either the whole
    checkpoint or none, and of two concurrent saves of a step one commits while the other raises
    StepCommittedError (a RefusedError) after removing its own files. A committed step is never
    overwritten.
    """
    started = time.perf_counter()
    codec = codec or settings.codec
    keyframe_every = keyframe_every or settings.keyframe_every
    lossy = lossy if lossy is not None else settings.lossy
    if lossy in ("", "none"):
        lossy = None
    if codec not in ("auto", "delta", *codecs.FULL_CODECS):
        raise UsageError(f"unknown codec {codec!r}", hint="use auto, zstd, lz4, bgzstd or delta")
    if lossy not in (None, "bf16"):
        raise UsageError(f"unknown lossy mode {lossy!r}", hint="the only lossy mode is bf16")
    step = checked_step(step)
    store = storage.resolve(store_uri)
    _check_name(run)
    big = oversized_int(state)  # the reader refuses such a manifest: refuse it before writing anything
    if big is not None:
        raise UsageError(f"{big[0]} holds an int of about {big[1]} digits; a checkpoint holds ints of at most "
                         f"{MAX_INT_DIGITS} digits", hint="store it as a string, or as a tensor")
    attempt = attempt or secrets.token_hex(6)
    if not re.fullmatch(r"[0-9a-z]{1,32}", attempt):
        raise UsageError(f"bad save attempt token {attempt!r}", hint="letters and digits only")
    if storage.is_file(store.fs, manifest_path(store, run, step)):
        raise _already_stored(store, run, step)
    skeleton, named = flatten(state)
    prepared = [_prepare(name, tensor, lossy, settings.lossy_min_elements) for name, tensor in named]
    chunk_size = max(settings.chunk_size, 1)
    for item in prepared:
        item.chunk_bytes = max(chunk_size // item.width, 1) * item.width

    memory_key = (store.uri, run)
    _in_flight(memory_key, +1)
    try:
        base_manifest, group = None, [step]
        reference = settings.delta_reference
        if codec in ("auto", "delta"):
            base_manifest, group = _base_for(store, run, step, keyframe_every, reference)
        base_raw = _base_bytes(store, run, base_manifest, settings) if base_manifest else {}

        level = settings.zstd_level
        base_tensors = {t["name"]: t for t in base_manifest["tensors"]} if base_manifest else {}
        # a delta against the save just before differs in kind from one against an older keyframe
        base_kind = None if base_manifest is None else (
            "previous" if len(group) >= 2 and base_manifest["step"] == group[-2] else "older")

        def decide(item: _Prepared) -> None:
            entry = base_tensors.get(item.name)
            candidate = base_raw.get(item.name)
            if (
                entry is not None
                and candidate is not None
                and entry["stored_dtype"] == item.stored_dtype
                and entry["shape"] == item.shape
                and entry.get("stored_shape") == item.stored_shape
                and entry["chunk_bytes"] == item.chunk_bytes
            ):
                item.base = candidate
            floats = item.stored_dtype.startswith(("float", "bfloat", "complex"))
            if codec in ("auto", "delta"):
                candidates = ("bgzstd", *(() if floats else ("zstd",)), *codecs.DELTA_CODECS)
            else:
                candidates = (codec,)
            remembered = None
            item.choice_key = choices.key(item.name, item.stored_dtype, item.stored_shape or item.shape,
                                          base_kind if item.base is not None else None)
            if codec not in ("zstd", "lz4"):
                remembered = choices.recall(*memory_key, item.choice_key, settings.resample_every)
            if codec in ("zstd", "lz4"):
                item.codec, item.mask = codec, ""
            elif remembered is not None and remembered.codec in (*candidates, "zstd") and (  # zstd: tiny ones
                item.base is not None or remembered.codec not in codecs.DELTA_CODECS
            ):
                item.codec, item.mask, item.reused = remembered.codec, remembered.mask, remembered
            else:
                item.codec, item.mask = codecs.choose(
                    item.raw, item.width, level, item.base, settings.min_delta_gain, candidates
                )
                item.sampled = True
            if item.codec in codecs.DELTA_CODECS:
                item.base_step = base_manifest["step"]
            else:
                item.base = None

        workers = _workers(settings.workers)
        tasks: list[tuple[_Prepared, int, int]] = []
        with ThreadPoolExecutor(workers, thread_name_prefix="ckpt") as pool:
            list(pool.map(decide, prepared))
            for item in prepared:
                size = item.raw.size
                for offset in range(0, max(size, 1), item.chunk_bytes):
                    tasks.append((item, offset, min(offset + item.chunk_bytes, size)))

            # a later save deltas against this one: snapshot it chunk by chunk while each is in cache
            # (a training loop goes on changing its tensors in place)
            snapshot = (
                _snapshot_buffers(memory_key, prepared)
                if settings.cache_base and step in _still_needed(group, keyframe_every, reference)
                else {}
            )
            _field, digest_of = chunk_digest(FORMAT)

            def encode(task: tuple[_Prepared, int, int]) -> tuple[bytes, str]:
                item, start, stop = task
                raw = item.raw[start:stop]
                base = item.base[start:stop] if item.base is not None else None
                payload = codecs.encode(item.codec, raw, item.width, level, base, item.mask or None)
                if snapshot:
                    snapshot[item.name][start:stop] = raw
                return payload, digest_of(raw)

            files = _write_chunks(store, run, step, tasks, pool, encode, workers, settings.data_file_size, progress,
                                  attempt)

        raw_total = sum(item.original_bytes for item in prepared)  # as given, before any lossy downcast
        stored_total = sum(entry["size"] for entry in files.values())
        uses_delta = any(item.base_step is not None for item in prepared)
        base_ref = {"step": base_manifest["step"], "id": base_manifest["id"]} if uses_delta else None
        chain = [base_manifest["step"], *base_manifest.get("chain", [])] if uses_delta else []
        group = group if uses_delta else [step]  # a checkpoint stored full starts a new keyframe group
        seconds = time.perf_counter() - started
        manifest = {
            "format": FORMAT,
            "id": uuid.uuid4().hex,
            "run": run,
            "step": step,
            "created_at": datetime.now(UTC).isoformat(),
            "kind": "delta" if uses_delta else "full",
            "base": base_ref,
            "chain": chain,
            "depth": len(chain),
            "group": group,
            "lossy": lossy if any(item.lossy for item in prepared) else None,
            "tree": skeleton,
            "files": files,
            "tensors": [
                {
                    "name": item.name,
                    "dtype": item.dtype,
                    "stored_dtype": item.stored_dtype,
                    "lossy": item.lossy,
                    "shape": item.shape,
                    **({"stored_shape": item.stored_shape} if item.stored_shape is not None else {}),
                    **({"stride": item.stride} if item.stride is not None else {}),
                    "nbytes": item.raw.size,
                    "codec": item.codec,
                    "planes": item.mask or None,
                    "base": item.base_step,
                    "chunk_bytes": item.chunk_bytes,
                    "sampled": item.sampled,
                    "chunks": item.chunks,
                }
                for item in prepared
            ],
            "metrics": dict(metrics or {}),
            "tags": sorted(set(tags)),
            "source": source or {},
            "stats": {
                "raw_bytes": raw_total,
                "stored_bytes": stored_total,
                "ratio": raw_total / stored_total if stored_total else None,
                "seconds": seconds,
                "codecs": _codec_counts(prepared),
                "sampled": sum(1 for item in prepared if item.sampled),
                "reused": sum(1 for item in prepared if item.reused is not None),
            },
        }
        try:
            committed = commit_manifest(store, manifest)
        except BaseException:
            if _committed_by(store, run, step) is None:  # ours may have landed before the error: keep it
                _discard(store, run, step, files)
            raise
        if not committed:  # another save of this step won the race: leave nothing of ours behind
            _discard(store, run, step, files)
            raise _already_stored(store, run, step, raced=True)
        if codec not in ("zstd", "lz4"):
            for item in prepared:
                stored_bytes = sum(chunk["length"] for chunk in item.chunks)
                choices.remember(*memory_key, item.choice_key, item.codec, item.mask,
                                 item.raw.size / stored_bytes if stored_bytes else 1.0, item.reused,
                                 settings.resample_drift)
        if settings.cache_base:
            needed = _still_needed(group, keyframe_every, reference)
            with _CACHE_LOCK:
                before = _CACHE.get(_cache_key(store, run), {})
                kept = {s: v for s, v in before.items() if s in needed}
                if step in needed:  # not snapshotted when the save was planned as a delta that did not pay
                    raw = snapshot or {item.name: item.raw.copy() for item in prepared}
                    kept[step] = {"id": manifest["id"], "raw": raw}
                dropped = [v["raw"] for s, v in before.items() if s not in kept]
                if dropped:  # one dropped state's buffers wait for the next snapshot (no fresh pages to fault in)
                    _SPARE[_cache_key(store, run)] = dropped[-1]
                _CACHE[_cache_key(store, run)] = kept
        return summary(manifest, store.uri, seconds=time.perf_counter() - started)
    finally:
        _in_flight(memory_key, -1)


def _in_flight(memory_key: tuple[str, str], change: int) -> None:
    with _CACHE_LOCK:
        count = _IN_FLIGHT.get(memory_key, 0) + change
        if count:
            _IN_FLIGHT[memory_key] = count
        else:
            _IN_FLIGHT.pop(memory_key, None)


def _snapshot_buffers(memory_key: tuple[str, str], prepared: list[_Prepared]) -> dict[str, np.ndarray]:
    """One buffer per tensor for the base snapshot of this save: a spare buffer of the same size
    from a state dropped from the cache where there is one (its pages are already mapped), else new."""
    with _CACHE_LOCK:  # another save of the run may still read a dropped state as its base: no reuse then
        spare = _SPARE.pop(memory_key, {}) if _IN_FLIGHT.get(memory_key, 0) == 1 else {}
    buffers = {}
    for item in prepared:
        found = spare.pop(item.name, None)
        buffers[item.name] = found if found is not None and found.size == item.raw.size else np.empty_like(item.raw)
    return buffers


def _codec_counts(prepared: list[_Prepared]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in prepared:
        counts[item.codec] = counts.get(item.codec, 0) + 1
    return counts


def summary(manifest: dict, store_uri: str, seconds: float | None = None) -> dict:
    """The small JSON summary of a stored checkpoint (what `put --json` and save() return)."""
    stats = manifest["stats"]
    seconds = stats["seconds"] if seconds is None else seconds
    return {
        "store": store_uri,
        "run": manifest["run"],
        "step": manifest["step"],
        "kind": manifest["kind"],
        "base": manifest["base"]["step"] if manifest.get("base") else None,
        "depth": manifest.get("depth", 0),
        "lossy": manifest.get("lossy"),
        "tensors": len(manifest["tensors"]),
        "raw_bytes": stats["raw_bytes"],
        "stored_bytes": stats["stored_bytes"],
        "ratio": round(stats["ratio"], 4) if stats["ratio"] else None,
        "seconds": round(seconds, 4),
        "mb_per_s": round(stats["raw_bytes"] / seconds / 1e6, 1) if seconds else None,
        "codecs": stats["codecs"],
        "codecs_sampled": stats.get("sampled"),  # tensors whose codec was chosen on samples (format 2)
        "codecs_reused": stats.get("reused"),  # tensors that reused the choice of an earlier save
    }


def _already_stored(store: Location, run: str, step: int, raced: bool = False) -> StepCommittedError:
    how = "was committed by another save at the same time" if raced else "is already stored"
    return StepCommittedError(
        f"checkpoint {run}/{step_dir(step)} {how} in {store.uri}; this save left nothing behind",
        hint="checkpoints are immutable: save under a new step (or load the stored one)",
    )


def _committed_by(store: Location, run: str, step: int) -> str | bool | None:
    """The id of the committed manifest of `run`/`step`, None if there is none, True if unknown."""
    try:
        return storage.read_json(store.fs, manifest_path(store, run, step)).get("id") or True
    except FileNotFoundError:
        return None
    except Exception:  # cannot tell (storage down): keep our files rather than risk a committed step
        return True


def _discard(store: Location, run: str, step: int, names) -> None:
    """Delete data files of an attempt that did not commit (nothing refers to them)."""
    from seedance_tasks.journal import prune_empty_dirs

    for name in names:
        path = store.join(run, step_dir(step), name)
        if storage.is_file(store.fs, path):
            store.fs.delete_file(path)
    prune_empty_dirs(store, posixpath.join(run, step_dir(step)))


def discard_attempt(store: Location, run: str, step: int, attempt: str) -> list[str]:
    """Remove the data files an interrupted save `attempt` of `run`/`step` left, unless the
    committed manifest uses them; returns their names. For the recovery of a killed attempt."""
    prefix = f"data-{attempt}-"
    used: set[str] = set()
    if storage.is_file(store.fs, manifest_path(store, run, step)):
        used = set(read_manifest(store, run, step)["files"])
    listing = storage.list_tree(store.child(run, step_dir(step)))
    names = [posixpath.basename(info.path) for info in listing.files]
    left = [name for name in names if name.startswith(prefix) and name not in used]
    _discard(store, run, step, left)
    return left


def _write_chunks(store, run, step, tasks, pool, encode, workers, data_file_size, progress, attempt) -> dict:
    """Encode `tasks` in parallel (bounded window) and append them in order to the data files
    (`data-<attempt>-NNNN.bin`), flushed to the disk on return; on an error, the files written so
    far are removed."""
    files: dict[str, dict] = {}
    directory = store.join(run, step_dir(step))
    store.fs.create_dir(directory, recursive=True)
    stream = None
    write_back = storage.WriteBack(store.fs, None)  # started for each data file
    name = ""
    offset = 0
    window: deque = deque()
    pending = iter(tasks)

    def submit_next() -> bool:
        task = next(pending, None)
        if task is None:
            return False
        window.append((task, pool.submit(encode, task)))
        return True

    try:
        for _ in range(workers * 3):
            if not submit_next():
                break
        while window:
            (item, start, stop), future = window.popleft()
            payload, digest = future.result()
            submit_next()
            if stream is None or (offset and offset + codecs.payload_size(payload) > data_file_size):
                if stream is not None:
                    stream.close()
                    write_back.close()
                    files[name]["size"] = offset
                name = f"data-{attempt}-{len(files):04d}.bin"
                stream = store.fs.open_output_stream(posixpath.join(directory, name))
                write_back = storage.WriteBack(store.fs, posixpath.join(directory, name))
                files[name] = {"size": 0, "tier": "hot", "uri": None}
                offset = 0
            length = codecs.payload_size(payload)
            for part in [payload] if isinstance(payload, bytes) else payload:
                stream.write(part)
            item.chunks.append(
                {"file": name, "offset": offset, "length": length, "raw": stop - start, "blake3": digest}
            )
            offset += length
            write_back.written(offset)
            if progress:
                progress(stop - start)
        if stream is None:  # a checkpoint without tensors still gets its (empty) data file
            name = f"data-{attempt}-0000.bin"
            stream = store.fs.open_output_stream(posixpath.join(directory, name))
            files[name] = {"size": 0, "tier": "hot", "uri": None}
        stream.close()
        write_back.close()
        files[name]["size"] = offset
        stream = None
        # on disk before the manifest names them, and the step's folder in the run's: a power loss after
        # the commit must not leave a committed checkpoint whose data files are empty
        storage.make_durable(store.fs, [posixpath.join(directory, name) for name in files] + [directory])
    except BaseException:
        for _task, future in window:
            future.cancel()
        if stream is not None:
            stream.close()
            stream = None
        write_back.close()
        _discard(store, run, step, files)
        raise
    finally:
        if stream is not None:
            stream.close()
        for _task, future in window:
            future.cancel()
    return files


# --------------------------------------------------------------------------- restore


class _Files:
    """Reads byte ranges of a checkpoint's data files: mmap locally, ranged GETs on S3.

    Only the chunks asked for are read, so one tensor is restored without reading the others.
    A file whose size differs from the manifest's is reported as truncated (or grown).
    """

    def __init__(self, store: Location, run: str, manifest: dict):
        self.store, self.run, self.manifest = store, run, manifest
        self._open_files: dict[str, Any] = {}
        self._lock = threading.Lock()

    def where(self, name: str) -> str:
        entry = self.manifest["files"].get(name, {})
        fs, path = file_location(self.store, self.run, self.manifest["step"], name, entry)
        return path if isinstance(fs, pafs.LocalFileSystem) else f"s3://{path}"

    def _open(self, name: str):
        entry = self.manifest["files"].get(name)
        if entry is None:
            raise IntegrityError(f"data file {name} is not listed in the manifest")
        fs, path = file_location(self.store, self.run, self.manifest["step"], name, entry)
        try:
            if isinstance(fs, pafs.LocalFileSystem):
                with open(path, "rb") as handle:
                    size = os.fstat(handle.fileno()).st_size
                    opened = memoryview(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)) if size else b""
            else:
                opened = fs.open_input_file(path)
                size = opened.size()
        except FileNotFoundError:
            raise IntegrityError(f"data file {self.where(name)} is missing") from None
        except OSError as exc:
            if "not found" in str(exc).lower() or "nosuchkey" in str(exc).lower():
                raise IntegrityError(f"data file {self.where(name)} is missing") from None
            raise
        if size != entry.get("size", size):
            raise IntegrityError(
                f"data file {self.where(name)} is {size} bytes, the manifest says {entry['size']} (truncated?)"
            )
        return opened

    def read(self, name: str, offset: int, length: int):
        opened = self._open_files.get(name)
        if opened is None:
            with self._lock:
                opened = self._open_files.get(name)
                if opened is None:
                    opened = self._open_files[name] = self._open(name)
        if isinstance(opened, memoryview | bytes):
            if offset + length > len(opened):
                raise IntegrityError(f"data file {self.where(name)} is truncated")
            return opened[offset : offset + length]
        try:
            data = opened.read_at(length, offset)  # pyarrow: thread-safe positional read (one ranged GET)
        except OSError:  # an archive-class object (GLACIER...) is refused with a clear message
            explain_unreadable(self.where(name), self.run, self.manifest["step"], self.store.uri)
            raise
        if len(data) != length:
            raise IntegrityError(f"data file {self.where(name)} is truncated")
        return memoryview(data)


class _Chain:
    """A checkpoint and, lazily, the checkpoints its deltas are against."""

    def __init__(self, store: Location, run: str, step: int, manifest: dict | None = None):
        self.store, self.run, self.step = store, run, step
        self.manifest = manifest or read_manifest(store, run, step)
        self.files = _Files(store, run, self.manifest)
        self.tensors = {t["name"]: t for t in self.manifest["tensors"]}
        where = manifest_path(store, run, step)
        for entry in self.tensors.values():  # refused before any decoding, naming the manifest and the tensor
            for key in ("dtype", "stored_dtype"):
                _torch_dtype(entry[key], f"manifest {where}: tensors[{entry['name']!r}].{key}")
            _check_shape(entry, where)
        self.digest_field, self.digest = chunk_digest(self.manifest)  # blake3 (format 2) or sha256 (1)
        self._base: _Chain | None = None
        self._lock = threading.Lock()

    def base(self, tensor_name: str) -> _Chain:
        with self._lock:
            if self._base is None:
                ref = self.manifest.get("base") or {}
                base_step = ref.get("step")
                if base_step is None:
                    raise IntegrityError(f"tensor {tensor_name} of step {self.step} is a delta without a base")
                try:
                    base = _Chain(self.store, self.run, base_step)
                except IntegrityError as exc:
                    raise IntegrityError(
                        f"tensor {tensor_name} of {self.run}/{step_dir(self.step)} is a delta against "
                        f"{step_dir(base_step)}, which is missing or damaged: {exc.message}"
                    ) from None
                if base.manifest["id"] != ref.get("id"):
                    raise IntegrityError(
                        f"base {step_dir(base_step)} of {self.run}/{step_dir(self.step)} was replaced "
                        f"(id {base.manifest['id']}, expected {ref.get('id')})"
                    )
                self._base = base
            return self._base

    def _where(self, name: str, index: int, chunk: dict) -> str:
        return f"tensor {name} of {self.run}/{step_dir(self.step)}: chunk {index} in {self.files.where(chunk['file'])}"

    def decoded(self, name: str, index: int, check: bool) -> tuple[Any, bool]:
        """Chunk `index` of tensor `name` with its chain: (a `codecs.PlaneChain`, True) or (raw bytes, False).

        XOR and bsub deltas work plane by plane (they commute with byte grouping), so a chain of them
        is kept as planes and merged once, by the caller. With `check`, this level's chunk digest is
        checked too.
        """
        entry = self.tensors.get(name)
        if entry is None:
            raise IntegrityError(f"tensor {name} is missing from {self.run}/{step_dir(self.step)}")
        chunk = entry["chunks"][index]
        width = _torch_dtype(entry["stored_dtype"]).itemsize
        codec, size = entry["codec"], chunk["raw"]
        payload = self.files.read(chunk["file"], chunk["offset"], chunk["length"])
        try:
            decoded, grouped = codecs.decode_planes(codec, payload, size, width)
        except ValueError as exc:
            raise IntegrityError(f"{self._where(name, index, chunk)} is damaged: {exc}") from None
        if grouped:
            decoded = codecs.PlaneChain((decoded,))
        if codec in codecs.DELTA_CODECS:
            base, base_grouped = self.base(name).decoded(name, index, check)
            if codec in codecs.PLANE_DELTAS:
                if not base_grouped:
                    base = codecs.PlaneChain((codecs.group(base, width),))
                if base.shape() != decoded.shape():
                    raise IntegrityError(f"{self._where(name, index, chunk)} does not match its base's shape")
                decoded = base.then(codec, decoded.levels[0])
            else:
                plain = decoded.flat(width)
                if base_grouped:
                    base = base.flat(width)
                if base.size != size:
                    raise IntegrityError(f"{self._where(name, index, chunk)} does not match its base's shape")
                codecs.undo(codec, plain, base, width)
                decoded, grouped = plain, False
        if check:
            flat = decoded.flat(width) if grouped else decoded
            if self.digest(flat) != chunk[self.digest_field]:
                raise IntegrityError(f"{self._where(name, index, chunk)} does not match its {self.digest_field}")
        return decoded, grouped

    def chunk(self, name: str, index: int, out: np.ndarray, check: bool) -> None:
        """Decode chunk `index` of tensor `name` (stored bytes) into `out`; digest-checked if `check`."""
        decoded, grouped = self.decoded(name, index, check)
        if grouped:
            decoded.merge(_torch_dtype(self.tensors[name]["stored_dtype"]).itemsize, out)
        else:
            out[:] = decoded


def _decode_tensors(chain: _Chain, names: list[str], workers: int, progress=None) -> dict[str, np.ndarray]:
    """Stored bytes of each tensor in `names`, every chunk checked against its digest (blake3 or sha256)."""
    outputs = {name: np.empty(chain.tensors[name]["nbytes"], dtype=np.uint8) for name in names}
    jobs = []
    for name in names:
        entry = chain.tensors[name]
        start = 0
        for index, chunk in enumerate(entry["chunks"]):
            jobs.append((name, index, start, start + chunk["raw"]))
            start += chunk["raw"]
        if start != entry["nbytes"]:
            raise IntegrityError(f"tensor {name} of step {chain.step}: chunks hold {start} bytes, not {entry['nbytes']}")

    def run(job) -> None:
        name, index, start, stop = job
        try:
            chain.chunk(name, index, outputs[name][start:stop], check=False)
            entry = chain.tensors[name]["chunks"][index]
            if chain.digest(outputs[name][start:stop]) != entry[chain.digest_field]:
                # find the damaged link of the chain: decode again checking every level
                chain.chunk(name, index, outputs[name][start:stop], check=True)
                raise IntegrityError(
                    f"tensor {name} of {chain.run}/{step_dir(chain.step)}: chunk {index} in "
                    f"{chain.files.where(entry['file'])} does not match its {chain.digest_field}"
                )
        finally:
            if progress:
                progress(stop - start)

    with ThreadPoolExecutor(_workers(workers), thread_name_prefix="ckpt") as pool:
        for _ in pool.map(run, jobs):
            pass
    return outputs


def _base_bytes(store: Location, run: str, manifest: dict, settings) -> dict[str, np.ndarray]:
    """Stored bytes of every tensor of the base checkpoint: from the in-memory cache or the store."""
    with _CACHE_LOCK:
        cached = _CACHE.get(_cache_key(store, run), {}).get(manifest["step"])
    if cached and cached["id"] == manifest["id"]:
        return cached["raw"]
    chain = _Chain(store, run, manifest["step"], manifest)
    return _decode_tensors(chain, list(chain.tensors), settings.workers)


def _to_tensor(entry: dict, raw: np.ndarray):
    import torch

    dtype = _torch_dtype(entry["stored_dtype"])
    held = entry.get("stored_shape")
    if raw.size == 0:
        stored = torch.empty(held if held is not None else entry["shape"], dtype=dtype)
    else:
        stored = torch.from_numpy(raw).view(dtype).reshape(held if held is not None else entry["shape"])
    if entry["stored_dtype"] != entry["dtype"]:
        stored = stored.to(_torch_dtype(entry["dtype"]))
    if entry.get("stride") is not None:
        stored = torch.empty_strided(stored.shape, entry["stride"], dtype=stored.dtype).copy_(stored)
    return stored.expand(entry["shape"]) if held is not None else stored


def resolve_step(store: Location, run: str, step: int | None) -> int:
    if step is not None:
        return int(step)
    steps = committed_steps(store, run)
    if not steps:
        raise IntegrityError(
            f"no committed checkpoint of run {run!r} in {store.uri}",
            hint=f"`seedance ckpt ls --store {store.uri}` lists the runs",
        )
    return steps[-1]


def load_state(store_uri: str, run: str, step: int | None, *, workers: int = 0, progress=None):
    """(state, manifest) of checkpoint `run`/`step` (None: latest), every chunk verified against its digest.

    A lossy (bf16) tensor comes back in its original dtype with bf16 precision; a warning says so.
    """
    store = existing_store(store_uri)
    step = resolve_step(store, run, step)
    chain = _Chain(store, _check_name(run), step)
    raw = _decode_tensors(chain, list(chain.tensors), workers, progress)
    tensors = [_to_tensor(entry, raw[entry["name"]]) for entry in chain.manifest["tensors"]]
    note_restore(store, run, step)  # tiering counts age since the last restore
    if chain.manifest.get("lossy"):
        log.warning(
            "checkpoint %s/%s was stored lossy (%s): %d tensor(s) carry %s precision",
            run, step_dir(step), chain.manifest["lossy"],
            sum(1 for t in chain.manifest["tensors"] if t.get("lossy")), chain.manifest["lossy"],
        )
    return unflatten(chain.manifest["tree"], tensors), chain.manifest


def same_content(state: Any, manifest: dict) -> bool:
    """True if `state` has the same tree and the same tensor bytes (chunk digests) as `manifest`,
    also where a version from before tied weights were stored once stored each tied leaf apart."""
    skeleton, named = flatten(state)
    if _same_content(skeleton, named, manifest):
        return True
    untied = flatten(state, share=False)
    return len(untied[1]) != len(named) and _same_content(*untied, manifest)


def _same_content(skeleton: Any, named: list, manifest: dict) -> bool:
    digest_field, digest_of = chunk_digest(manifest)
    if not same_tree(skeleton, manifest["tree"]) or len(named) != len(manifest["tensors"]):
        return False
    for (name, tensor), entry in zip(named, manifest["tensors"], strict=True):
        item = _prepare(name, tensor, entry.get("lossy"), 1)
        if (name != entry["name"] or item.stored_dtype != entry["stored_dtype"] or item.shape != entry["shape"]
                or item.stored_shape != entry.get("stored_shape")):  # strides are layout, not content
            return False
        start = 0
        for chunk in entry["chunks"]:
            piece = item.raw[start : start + chunk["raw"]]
            if piece.size != chunk["raw"] or digest_of(piece) != chunk[digest_field]:
                return False
            start += chunk["raw"]
        if start != item.raw.size:
            return False
    return True


def load_tensors(store_uri: str, run: str, step: int | None, names: list[str], *, workers: int = 0) -> dict:
    """{name: tensor} of the named tensors of `run`/`step`, reading only their chunks (and bases)."""
    store = existing_store(store_uri)
    chain = _Chain(store, _check_name(run), resolve_step(store, run, step))
    tied = aliases(chain.manifest["tree"], list(chain.tensors)) if set(names) - set(chain.tensors) else {}
    missing = [name for name in names if name not in chain.tensors and name not in tied]
    if missing:
        raise UsageError(f"no tensor {missing[0]!r} in {run}/{step_dir(chain.step)}")
    wanted = list(dict.fromkeys(tied.get(name, name) for name in names))  # a tied name reads its tensor
    raw = _decode_tensors(chain, wanted, workers)
    return {name: _to_tensor(chain.tensors[tied.get(name, name)], raw[tied.get(name, name)]) for name in names}


def verify(store_uri: str, run: str, step: int, *, workers: int = 0) -> dict:
    """Decode every tensor of `run`/`step` (and its chain) and check every chunk digest; raises IntegrityError."""
    store = existing_store(store_uri)
    started = time.perf_counter()
    chain = _Chain(store, run, step)
    _decode_tensors(chain, list(chain.tensors), workers)
    return {"run": run, "step": step, "ok": True, "tensors": len(chain.tensors),
            "seconds": round(time.perf_counter() - started, 3)}


def list_checkpoints(store_uri: str, run: str | None = None, damaged: list[dict] | None = None) -> list[dict]:
    """One row per committed checkpoint: run, step, kind, base, depth, sizes, ratio, tiers, age, lossy.

    A manifest that cannot be read raises its IntegrityError or, given a `damaged` list, is
    appended to it (`catalog.damaged_entry`) and left out: one damaged checkpoint does not hide the rest.
    """
    store = existing_store(store_uri)
    now = datetime.now(UTC)
    rows = []
    for name in [run] if run else runs(store):
        if damaged is None:
            found = manifests(store, name)
        else:
            found, broken = read_run(store, name)
            damaged.extend(broken)
        for manifest in found:
            step = manifest["step"]
            created = datetime.fromisoformat(manifest["created_at"])
            raw = sum(tensor["nbytes"] for tensor in manifest["tensors"])  # from the validated fields, not `stats`
            stored = data_file_bytes(manifest)
            rows.append(
                {
                    "run": name,
                    "step": step,
                    "kind": manifest["kind"],
                    "base": manifest["base"]["step"] if manifest.get("base") else None,
                    "depth": manifest.get("depth", 0),
                    "raw_bytes": raw,
                    "stored_bytes": stored,
                    "ratio": round(raw / stored, 4) if raw and stored else None,
                    "tier": ",".join(sorted({f.get("tier", "hot") for f in manifest["files"].values()})),
                    "age_s": round((now - created).total_seconds(), 1),
                    "created_at": manifest["created_at"],
                    "lossy": manifest.get("lossy"),
                    "metrics": manifest.get("metrics", {}),
                    "tags": manifest.get("tags", []),
                }
            )
    return rows


def verify_run(store_uri: str, run: str, step: int | None = None, *, workers: int = 0,
               on_progress: Callable[[int, int], None] | None = None) -> dict:
    """Verify one step or every committed step of `run`; returns {checked, damaged: [{step, error}]}.
    `on_progress(steps_done, steps_total)` is called after each step.

    Never raises for damage: the caller decides (the CLI exits non-zero when `damaged` is not empty).
    """
    store = existing_store(store_uri)
    steps = [int(step)] if step is not None else committed_steps(store, _check_name(run))
    if not steps:
        raise IntegrityError(f"no committed checkpoint of run {run!r} in {store.uri}",
                             hint=f"`seedance ckpt ls --store {store.uri}` lists the runs")
    damaged, checked = [], []
    for item in steps:
        try:
            verify(store_uri, run, item, workers=workers)
            checked.append(item)
        except IntegrityError as exc:
            damaged.append({"step": item, "error": exc.message})
        if on_progress:
            on_progress(len(checked) + len(damaged), len(steps))
    return {"store": store.uri, "run": run, "checked": checked, "damaged": damaged, "ok": not damaged}


def needed_steps(store_uri: str, run: str, keep: Iterable[int]) -> set[int]:
    """The steps to keep so that every step in `keep` stays restorable: `keep` plus their chains,
    followed through each base's own manifest (a chain that stops short still keeps the bases of
    its bases).

    For retention GC: everything else of the run may go. Raises IntegrityError if a kept step or
    one of its bases is not committed.
    """
    store = storage.resolve(store_uri)
    run = _check_name(run)
    needed: set[int] = set()
    pending = [int(step) for step in keep]
    while pending:
        step = pending.pop()
        if step in needed:
            continue
        needed.add(step)
        pending.extend(int(base) for base in read_manifest(store, run, step).get("chain", []))
    return needed
