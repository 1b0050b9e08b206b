"""The checkpoint manifest: its one typed model, parsed and validated here and nowhere else.

A manifest (`STORE/<run>/step-<N>/manifest.json`) is untrusted input: anyone who can write to the store can edit one, and GC, tiering and thaw act on the
files it names. So every manifest is read through `parse`, which checks every field against
the model below and refuses (IntegrityError naming the manifest and the field):

- a `run`, `step` or `id` that is not the one of the directory it was read from, or not a
  plain id (the id names a folder of a tier location);
- a data file name that is not one plain file name (no `/`, `..`, NUL, absolute path);
- a `uri` (a data file on another tier) outside the trusted archive locations, or anywhere but
  the checkpoint's own slot there, `<root>/<run>/step-<N>/<id>/<name>`. The trusted locations
  are the store itself, `checkpoint.archive_locations`, and every `lifecycle.tiers.<tier>.uri`
  of the configuration (`trusted_roots`); a caller working with other settings passes its own;
- chunks naming a file the manifest does not list, bases and chains that do not go backwards;
- a `tree` that cannot be rebuilt: an unknown node, a tensor index out of range, a scalar not of
  its kind, nesting past `tree.MAX_DEPTH` (checked without recursion; see `tree.tree_problem`).

Formats (`format`): `seedance-checkpoint/2` (written now) gives every chunk a `blake3` digest
(BLAKE3-256, hex) of its raw bytes; `seedance-checkpoint/1` (older stores, still read, verified,
tiered and collected) a `sha256`. A chunk must carry the digest of its manifest's format and no
other; any other `format` is refused with the formats this version reads (`FORMATS`). GC,
tiering and thaw rewrite a manifest in its own format. `chunk_digest(manifest)` is the one place
that says which digest a manifest's chunks carry and how to compute it.

Fields of the layout (see `seedance_tasks/checkpoint/store.py` for what they mean): `tree`,
`tensors[i]` (name, dtype, stored_dtype, shape, stored_shape, stride, codec, base, chunk_bytes, sampled, chunks: file, offset,
length, raw, blake3 | sha256), `files` (`{name: {size, tier, uri, root, storage_class}}`; `uri` null =
next to the manifest), `base` `{step, id}`, `chain`, `depth`, `group`, `metrics`, `tags`,
`stats`, `source`, `created_at`, `id`. Unknown extra fields are kept as they are (a newer
writer's), never acted on.
"""

from __future__ import annotations

import json
import math
import operator
import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from seedance_tasks import storage
from seedance_tasks.checkpoint.tree import MAX_DEPTH, MAX_INT_DIGITS, UNREADABLE_DTYPES, tree_problem
from seedance_tasks.errors import IntegrityError, UsageError
from seedance_tasks.storage import Location

FORMAT_1 = "seedance-checkpoint/1"
FORMAT_2 = "seedance-checkpoint/2"
FORMAT = FORMAT_2  # what save() writes
FORMATS = (FORMAT_1, FORMAT_2)  # what this version reads
DIGEST_FIELD = {FORMAT_1: "sha256", FORMAT_2: "blake3"}  # the per-chunk digest of each format
MANIFEST = "manifest.json"
TIERS = ("hot", "warm", "cold")
STEP_DIR = re.compile(r"^step-(\d+)$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_HEX256 = r"^[0-9a-f]{64}$"
StorageClass = Literal[
    "STANDARD", "INTELLIGENT_TIERING", "STANDARD_IA", "ONEZONE_IA", "GLACIER_IR", "GLACIER", "DEEP_ARCHIVE"
]
NonNegative = Field(ge=0)
Codec = Literal["zstd", "lz4", "bgzstd", "delta-xor", "delta-sub", "delta-bsub"]  # codecs.ALL_CODECS
DELTA_CODECS = ("delta-xor", "delta-sub", "delta-bsub")  # codecs.DELTA_CODECS: taken against `base`
Hex256 = Annotated[str, Field(pattern=_HEX256)]

MAX_STEP = 2**63 - 1  # the largest step a checkpoint may have (`checked_step`)

DIGEST_KEY = "manifest_blake3"
SEALED_FIELDS = ("format", "id", "run", "step", "kind", "base", "chain", "depth", "lossy", "tree")
"""The top-level fields `manifest_blake3.fields` must cover (format 2): what a restore reads and
what GC keeps by. Not covered: `files` and `tags` (tiering and `ckpt tag` rewrite them; file sizes
are checked against the files on every read), `created_at`, `metrics`, `group`, `stats`, `source`."""

DTYPE_SIZES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
}
"""Element sizes of the dtypes checkpoints usually hold (names as torch spells them); `parse` asks
torch about any other name, so a manifest is checked without importing torch."""
LOSSY_STORED, LOSSY_FROM = "bfloat16", ("float32", "float64")  # lossy `bf16`: what was downcast to what


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", strict=False)


class Chunk(_Model):
    file: str
    offset: int = NonNegative
    length: int = NonNegative
    raw: int = NonNegative
    sha256: str | None = Field(None, pattern=_HEX256)  # format 1
    blake3: str | None = Field(None, pattern=_HEX256)  # format 2


class TensorEntry(_Model):
    name: str
    dtype: str
    stored_dtype: str
    lossy: str | None = None
    shape: list[int]
    stored_shape: list[int] | None = None  # a broadcast tensor: the shape its bytes hold (broadcast dims 1)
    stride: list[int] | None = None  # a permuted dense layout (transposed, channels_last) of the stored shape
    nbytes: int = NonNegative
    codec: Codec
    planes: str | None = None
    base: int | None = None
    chunk_bytes: int = Field(ge=1)
    sampled: bool | None = None  # format 2: the codec was chosen on samples at this save (else reused)
    chunks: list[Chunk]

    @model_validator(mode="after")
    def _chunks_hold_the_tensor(self) -> TensorEntry:
        held = sum(chunk.raw for chunk in self.chunks)
        if held != self.nbytes:
            raise ValueError(f"tensors[{self.name!r}].chunks hold {held} bytes, not its nbytes {self.nbytes}")
        return self


class Seal(_Model):
    """`manifest_blake3` (format 2): BLAKE3 of the canonical JSON of each sealed top-level field
    and of each tensor entry (`digest_of`), written at commit, checked by every `parse`."""

    fields: dict[str, Hex256]
    tensors: list[Hex256]


class DataFile(_Model):
    size: int = NonNegative
    tier: Literal["hot", "warm", "cold"] = "hot"
    uri: str | None = None
    root: str | None = None
    storage_class: StorageClass | None = None


class BaseRef(_Model):
    step: int = NonNegative
    id: str


class Manifest(_Model):
    """The typed model of a manifest (what `parse` validates against)."""

    format: Literal["seedance-checkpoint/1", "seedance-checkpoint/2"]
    id: str
    run: str
    step: int = NonNegative
    created_at: str
    kind: Literal["full", "delta"]
    base: BaseRef | None = None
    chain: list[int] = []
    depth: int = 0
    group: list[int] = []
    lossy: str | None = None
    tree: Any = None
    files: dict[str, DataFile]
    tensors: list[TensorEntry]
    metrics: dict[str, Any] = {}
    tags: list[str] = []
    source: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    manifest_blake3: Seal | None = None  # absent in manifests written before it (format 1, early format 2)

    @model_validator(mode="after")
    def _digests_of_the_format(self) -> Manifest:
        """Every chunk carries the digest of the manifest's format, and only that one."""
        wanted = DIGEST_FIELD[self.format]
        for tensor in self.tensors:
            for index, chunk in enumerate(tensor.chunks):
                for name in sorted(set(DIGEST_FIELD.values()), key=lambda n: n != wanted):  # missing first
                    present = getattr(chunk, name) is not None
                    if present != (name == wanted):
                        problem = "is missing" if name == wanted else f"does not belong in {self.format}"
                        raise ValueError(f"tensors[{tensor.name!r}].chunks[{index}].{name} {problem}")
        return self


@dataclass(frozen=True)
class FileRef:
    """One data file of a checkpoint: the root it lives under and its path relative to that root."""

    root: str  # URI of the root (the store, or a tier's location)
    rel: str

    @property
    def uri(self) -> str:
        return f"{self.root.rstrip('/')}/{self.rel}"

    def location(self) -> tuple[Location, str]:
        return storage.resolve(self.root), self.rel


# --------------------------------------------------------------------------- layout


def step_dir(step: int) -> str:
    return f"step-{int(step)}"


def manifest_rel(run: str, step: int) -> str:
    """Path of a manifest below its store."""
    return posixpath.join(run, step_dir(step), MANIFEST)


def tier_rel(run: str, step: int, manifest_id: str, name: str) -> str:
    """Path of a data file below a tier's root: `<run>/step-<N>/<manifest id>/<name>` (never reused)."""
    return posixpath.join(run, step_dir(step), manifest_id, name)


def normal_root(uri: str) -> str:
    """A root URI in one spelling (absolute local path or s3://bucket/prefix, no trailing /)."""
    return storage.resolve(uri).uri.rstrip("/")


def trusted_roots(store_uri: str, extra: Iterable[str | None] = ()) -> list[str]:
    """The roots data files of `store_uri` may live under: the store, the configured archive
    locations (`checkpoint.archive_locations`, `lifecycle.tiers.<tier>.uri`) and `extra`."""
    from seedance_tasks.config import load_settings

    settings = load_settings()
    configured = [*settings.checkpoint.archive_locations,
                  *(getattr(settings.lifecycle.tiers, tier).uri for tier in TIERS)]
    found = [normal_root(store_uri)]
    for uri in [*configured, *extra]:
        if uri and normal_root(uri) not in found:
            found.append(normal_root(uri))
    return found


# --------------------------------------------------------------------------- parse / serialise


def _refuse(where: str, field: str, problem: str) -> IntegrityError:
    return IntegrityError(
        f"manifest {where}: {field}: {problem}; refused",
        hint="the manifest was edited or damaged by someone else; nothing was changed. Move it away "
        "(or restore it from the trash), then run again",
    )


def _check_id(value: str, where: str, field: str) -> None:
    if not _ID.match(value or ""):
        raise _refuse(where, field, f"{value!r} is not a plain id (letters, digits, _ and -)")


def parse(data: bytes | str | dict, *, where: str, run: str, step: int, roots: Iterable[str]) -> dict:
    """The manifest in `data`, validated (see the module doc); a dict of the model's fields.

    `run`/`step`: where it was read from (it must say the same); `roots`: the trusted roots
    (`trusted_roots`; the first is the store). Raises IntegrityError naming `where` and the field.
    """
    if not isinstance(data, dict):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise IntegrityError(f"manifest {where} is unreadable: {exc}",
                                 hint="it was damaged or edited; restore it from the trash or a copy") from None
        except RecursionError:
            raise _refuse(where, "(top level)", "nested too deeply to be a manifest") from None
    if not isinstance(data, dict):
        raise _refuse(where, "(top level)", "not an object")
    if data.get("format") not in FORMATS:
        raise IntegrityError(
            f"manifest {where} has format {data.get('format')!r}, which this version does not read "
            f"(it reads {', '.join(FORMATS)})",
            hint="a newer Seedance wrote it: upgrade to read it; otherwise the manifest was edited or damaged",
        )
    try:
        model = Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(map(str, first["loc"])) or "(top level)"
        message = first["msg"].removeprefix("Value error, ")
        raise _refuse(where, field, message) from None
    if model.run != run:
        raise _refuse(where, "run", f"{model.run!r} is not the run {run!r} it is stored under")
    if model.step != int(step):
        raise _refuse(where, "step", f"{model.step} is not the step {step} it is stored under")
    _check_id(model.id, where, "id")
    try:
        datetime.fromisoformat(model.created_at)
    except ValueError:
        raise _refuse(where, "created_at", f"{model.created_at!r} is not an ISO time") from None
    _check_links(model, where)
    problem = tree_problem(model.tree, len(model.tensors))
    if problem:
        raise _refuse(where, *problem)
    trusted = [root.rstrip("/") for root in roots]
    for name, entry in model.files.items():
        if not _FILE_NAME.match(name) or ".." in name:
            raise _refuse(where, f"files[{name!r}]", "not one plain file name")
        if entry.uri is not None or entry.root is not None:
            _check_foreign(model, name, entry, where, trusted)
    _check_tensors(model, where)
    dumped = model.model_dump(mode="json")
    if dumped.get(DIGEST_KEY) is None:
        dumped.pop(DIGEST_KEY, None)  # a manifest from before the seal stays as it was
    else:
        _check_seal(dumped, where)
    other = [name for fmt, name in DIGEST_FIELD.items() if fmt != model.format]
    for tensor in dumped["tensors"]:  # each chunk keeps only its format's digest (rewrites stay in format)
        if tensor.get("sampled") is None:
            tensor.pop("sampled", None)
        for chunk in tensor["chunks"]:
            for name in other:
                chunk.pop(name, None)
    return dumped


def _check_links(model: Manifest, where: str) -> None:
    if (model.kind == "delta") != (model.base is not None):
        raise _refuse(where, "kind", f"{model.kind!r} does not fit its base {model.base and model.base.step!r} "
                      "(a delta has a base, a full checkpoint none)")
    if model.depth != len(model.chain):
        raise _refuse(where, "depth", f"{model.depth} is not the length of its chain {model.chain[:20]}")
    if model.base is not None:
        _check_id(model.base.id, where, "base.id")
        if model.base.step >= model.step:
            raise _refuse(where, "base.step", f"{model.base.step} is not before step {model.step}")
        if not model.chain or model.chain[0] != model.base.step:
            raise _refuse(where, "chain", "does not start with the base's step")
    elif model.chain:
        raise _refuse(where, "chain", "a checkpoint without a base has no chain")
    if any(later <= earlier for later, earlier in zip(model.chain, model.chain[1:], strict=False)) or any(
        step >= model.step for step in model.chain
    ):
        raise _refuse(where, "chain", f"{model.chain} does not go strictly back from step {model.step}")
    for tensor in model.tensors:
        if tensor.base is not None and (model.base is None or tensor.base != model.base.step):
            raise _refuse(where, f"tensors[{tensor.name!r}].base", f"{tensor.base} is not the manifest's base")


def _itemsize(name: str, where: str, field: str) -> int:
    """Bytes per element of dtype `name` (the table, else torch); IntegrityError if no such dtype."""
    size = DTYPE_SIZES.get(name)
    if size is None and re.fullmatch(r"[a-z][a-z0-9_]{0,39}", name or "") and not name.startswith(UNREADABLE_DTYPES):
        import torch

        dtype = getattr(torch, name, None)
        size = dtype.itemsize if isinstance(dtype, torch.dtype) else None
    if size is None:
        raise IntegrityError(f"unknown dtype {str(name)[:60]!r} in manifest {where}: {field}",
                             hint="the manifest was edited or damaged, or written with a torch that has this dtype: "
                             "restore it with that torch version")
    return size


def held_shape(shape: list[int], stored_shape: list[int] | None) -> list[int] | None:
    """The shape a tensor's stored bytes hold: `shape`, or for a broadcast tensor its `stored_shape`
    (each dimension its own size or 1, a broadcast one); None if `stored_shape` does not fit `shape`."""
    if stored_shape is None:
        return shape
    fits = len(stored_shape) == len(shape) and all(held in (1, size) for held, size in zip(stored_shape, shape, strict=True))
    return stored_shape if fits else None


def dense_layout(shape: list[int], stride: list[int]) -> bool:
    """True if `stride` lays a tensor of `shape` (at least one element) out densely without
    overlap: each element at its own place among exactly prod(shape) (a permutation of the
    dimensions, as a transposed or channels_last tensor)."""
    if len(stride) != len(shape) or any(size <= 0 for size in shape) or any(step < 0 for step in stride):
        return False
    expected = 1
    for step, size in sorted((step, size) for size, step in zip(shape, stride, strict=True) if size != 1):
        if step != expected:
            return False
        expected *= size
    return True


def _check_tensors(model: Manifest, where: str) -> None:
    """What a restore relies on of each tensor entry: a unique name, known dtypes whose element size
    divides every chunk, a shape that holds exactly its bytes, a stored dtype unlike the given one
    only for a lossy bf16 tensor, a base exactly for the delta codecs, and chunks inside their data
    files that do not overlap."""
    seen: dict[str, int] = {}
    spans: dict[str, list[tuple[int, int, str]]] = {}
    for position, tensor in enumerate(model.tensors):
        if tensor.name in seen:
            raise _refuse(where, f"tensors[{position}].name", f"{tensor.name[:80]!r} is also the name of "
                          f"tensors[{seen[tensor.name]}]: a restore could not tell them apart")
        seen[tensor.name] = position
        field = f"tensors[{tensor.name[:80]!r}]"
        _itemsize(tensor.dtype, where, f"{field}.dtype")
        width = _itemsize(tensor.stored_dtype, where, f"{field}.stored_dtype")
        held = held_shape(tensor.shape, tensor.stored_shape)
        if any(size < 0 for size in tensor.shape) or held is None or math.prod(held) * width != tensor.nbytes:
            raise IntegrityError(
                f"manifest {where}: {field}.shape {str(tensor.shape)[:80]}"
                + (f" (stored_shape {str(tensor.stored_shape)[:80]})" if tensor.stored_shape is not None else "")
                + f" of {tensor.stored_dtype} does not hold its nbytes {tensor.nbytes}; refused",
                hint="the manifest was edited or damaged; restore it from the trash or a copy, or save the "
                "checkpoint again",
            )
        if tensor.stride is not None and not dense_layout(held, tensor.stride):
            raise _refuse(where, f"{field}.stride", f"{str(tensor.stride)[:80]} is not a dense layout of its "
                          f"stored shape {str(held)[:80]}")
        lossy = tensor.stored_dtype != tensor.dtype or tensor.lossy is not None
        if lossy and not (tensor.lossy == "bf16" and model.lossy == "bf16" and tensor.stored_dtype == LOSSY_STORED
                          and tensor.dtype in LOSSY_FROM):
            raise _refuse(where, f"{field}.dtype", f"{tensor.dtype!r} stored as {tensor.stored_dtype!r} (lossy "
                          f"{tensor.lossy!r}, the manifest's {model.lossy!r}): only a lossy bf16 tensor of "
                          f"{' or '.join(LOSSY_FROM)} is stored as {LOSSY_STORED}")
        if (tensor.codec in DELTA_CODECS) != (tensor.base is not None):
            raise _refuse(where, f"{field}.base", f"{tensor.base!r} does not fit its codec {tensor.codec!r} "
                          "(a delta codec has a base, the others none)")
        if tensor.chunk_bytes % width:
            raise _refuse(where, f"{field}.chunk_bytes", f"{tensor.chunk_bytes} is not a whole number of "
                          f"{width}-byte elements")
        for index, chunk in enumerate(tensor.chunks):
            at = f"{field}.chunks[{index}]"
            if chunk.file not in model.files:
                raise _refuse(where, f"{at}.file", f"{chunk.file!r} is not one of the manifest's files")
            if chunk.raw > tensor.chunk_bytes or chunk.raw % width:
                raise _refuse(where, f"{at}.raw", f"{chunk.raw} is not a whole number of {width}-byte elements "
                              f"up to its chunk_bytes {tensor.chunk_bytes}")
            size = model.files[chunk.file].size
            if chunk.offset + chunk.length > size:
                raise _refuse(where, at, f"bytes {chunk.offset}..{chunk.offset + chunk.length} are past the end of "
                              f"{chunk.file} ({size} bytes)")
            if chunk.length:
                spans.setdefault(chunk.file, []).append((chunk.offset, chunk.offset + chunk.length, at))
    for name, ranges in spans.items():
        ranges.sort()
        for (_start, end, first), (start, _end, second) in zip(ranges, ranges[1:], strict=False):
            if start < end:
                raise _refuse(where, second, f"its bytes in {name} overlap those of {first}")


def digest_of(value: Any) -> str:
    """BLAKE3 (hex) of `value`'s canonical JSON (sorted keys, no spaces, ASCII): what the seal records."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return _blake3_hex(text.encode())


def _tensor_form(entry: dict) -> dict:
    """What a tensor's seal covers: every field of its entry and chunks but the null ones (a
    rewrite by another version may spell a null field out or leave it away)."""
    form = {key: value for key, value in entry.items() if value is not None}
    form["chunks"] = [{key: value for key, value in chunk.items() if value is not None}
                      for chunk in entry.get("chunks") or []]
    return form


def _seal_of(dumped: dict) -> dict:
    return {"fields": {name: digest_of(dumped.get(name)) for name in SEALED_FIELDS},
            "tensors": [digest_of(_tensor_form(entry)) for entry in dumped["tensors"]]}


def seal(manifest: dict) -> dict:
    """The JSON form of `manifest` as it is committed: a format-2 one with its `manifest_blake3`
    (BLAKE3 of each field in SEALED_FIELDS and of each tensor entry), so that `parse` detects a
    field changed after the save. A format-1 manifest is returned unsealed (older readers)."""
    data = json.loads(to_bytes({key: value for key, value in manifest.items() if key != DIGEST_KEY}))
    if data.get("format") != FORMAT_2:
        return data
    try:
        dumped = Manifest.model_validate(data).model_dump(mode="json")
    except ValidationError:
        return data  # not a valid manifest: the caller's `parse` says why
    data[DIGEST_KEY] = _seal_of(dumped)
    return data


def _check_seal(dumped: dict, where: str) -> None:
    """Every field and tensor entry the seal covers still has its recorded digest."""
    recorded = dumped[DIGEST_KEY]
    missing = [name for name in SEALED_FIELDS if name not in recorded["fields"]]
    if missing:
        raise _refuse(where, f"{DIGEST_KEY}.fields", f"does not cover {missing[0]!r}")
    for name, digest in recorded["fields"].items():
        if digest_of(dumped.get(name)) != digest:
            raise _refuse(where, name, f"does not match its digest ({DIGEST_KEY}.fields.{name}): "
                          "it was changed after the save")
    if len(recorded["tensors"]) != len(dumped["tensors"]):
        raise _refuse(where, f"{DIGEST_KEY}.tensors", f"holds {len(recorded['tensors'])} digests for "
                      f"{len(dumped['tensors'])} tensors")
    for index, (entry, digest) in enumerate(zip(dumped["tensors"], recorded["tensors"], strict=True)):
        if digest_of(_tensor_form(entry)) != digest:
            raise _refuse(where, f"tensors[{entry['name'][:80]!r}]", f"its name, dtype, shape, codec or chunks do "
                          f"not match its digest ({DIGEST_KEY}.tensors[{index}]): changed after the save")


def checked_step(step: Any, what: str = "step") -> int:
    """`step` as an int if it is a whole number from 0 to MAX_STEP (an int or a numpy integer);
    a bool, float, string or negative number is refused (UsageError naming `what`), never rounded."""
    try:
        if isinstance(step, bool) or type(step).__name__ == "bool_":
            raise TypeError
        value = operator.index(step)
    except TypeError:
        raise UsageError(f"{what} must be a whole number, got {str(step)[:60]!r} ({type(step).__name__})",
                         hint="pass the training step as an int, e.g. step=1500") from None
    if not 0 <= value <= MAX_STEP:
        raise UsageError(f"{what} must be from 0 to {MAX_STEP}, got {str(value)[:60]}",
                         hint="pass the training step as an int, e.g. step=1500")
    return value


_INT_BOUND = 10**MAX_INT_DIGITS


def oversized_int(state: Any) -> tuple[str, int] | None:
    """(key path, about how many digits) of the first int in `state` (a value or a dict key) with more
    than MAX_INT_DIGITS digits, or None. Paths are spelled as tensor names are (`optimizer/step`)."""
    pending: list[tuple[Any, str, int]] = [(state, "", 0)]
    while pending:
        value, path, depth = pending.pop()
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) >= _INT_BOUND:
                return path or "/", int(abs(value).bit_length() * 0.30103) + 1
            continue
        if depth > 2 * MAX_DEPTH or type(value).__module__.startswith("torch"):  # flatten refuses deeper; tensors hold no ints
            continue
        if isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}/{key}" if path else str(key)
                pending.append((item, child, depth + 1))
                if isinstance(key, int) and not isinstance(key, bool):
                    pending.append((key, f"{child} (a key)", depth + 1))
            metadata = getattr(value, "_metadata", None)
            if metadata is not None:
                pending.append((metadata, f"{path}/_metadata" if path else "_metadata", depth + 1))
        elif isinstance(value, list | tuple):
            pending.extend((item, f"{path}/{index}" if path else str(index), depth + 1)
                           for index, item in enumerate(value))
    return None


def _check_foreign(model: Manifest, name: str, entry: DataFile, where: str, trusted: list[str]) -> None:
    """A data file on another tier: only in its own slot under a trusted root."""
    field = f"files[{name!r}].uri"
    if not entry.uri or not entry.root:
        raise _refuse(where, field, "a data file elsewhere needs both `uri` and `root`")
    root = entry.root.rstrip("/")
    if root not in trusted[1:]:
        raise _refuse(where, f"files[{name!r}].root",
                      f"{entry.root!r} is not a configured archive location (checkpoint.archive_locations, "
                      "lifecycle.tiers.<tier>.uri)")
    expected = f"{root}/{tier_rel(model.run, model.step, model.id, name)}"
    if entry.uri != expected:
        raise _refuse(where, field, f"{entry.uri!r} is not this checkpoint's place {expected!r}")


def _blake3_hex(data) -> str:
    from blake3 import blake3

    return blake3(data).hexdigest()


def _sha256_hex(data) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


_DIGESTS: dict[str, Callable[[Any], str]] = {FORMAT_1: _sha256_hex, FORMAT_2: _blake3_hex}


def chunk_digest(manifest_or_format: dict | str) -> tuple[str, Callable[[Any], str]]:
    """(field name, hex digest function) of the chunks of a parsed manifest (or of a format):
    `blake3` for format 2, `sha256` for format 1. The function takes any buffer (bytes, numpy)."""
    fmt = manifest_or_format if isinstance(manifest_or_format, str) else manifest_or_format["format"]
    return DIGEST_FIELD[fmt], _DIGESTS[fmt]


def to_bytes(manifest: dict) -> bytes:
    """The JSON bytes a manifest is stored as: one line, by the C encoder (an indented dump goes
    through the pure-Python encoder: 0.17 s a save for the bench's 300 tensors; `jq .` shows it)."""
    return (json.dumps(manifest, sort_keys=False, separators=(",", ":")) + "\n").encode()


# --------------------------------------------------------------------------- reading a parsed manifest


def file_ref(store: Location, manifest: dict, name: str) -> FileRef:
    """Where data file `name` of a parsed manifest lives now, as (root, relative path)."""
    entry = manifest["files"][name]
    if entry.get("uri"):
        root = entry["root"].rstrip("/")
        return FileRef(root, entry["uri"][len(root) + 1:])
    return FileRef(store.uri, posixpath.join(manifest["run"], step_dir(manifest["step"]), name))


def tier_of(manifest: dict) -> str:
    """The coldest tier holding one of the checkpoint's files."""
    tiers = {entry.get("tier") or "hot" for entry in manifest["files"].values()}
    return next((tier for tier in reversed(TIERS) if tier in tiers), "hot")


def stored_bytes(manifest: dict) -> int:
    """Bytes of every data file of the checkpoint, wherever they are."""
    return sum(int(entry.get("size") or 0) for entry in manifest["files"].values())
