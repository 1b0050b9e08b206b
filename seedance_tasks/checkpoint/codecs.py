"""Chunk codecs: zstd, lz4, byte-grouped zstd, and XOR / integer-difference deltas.

Every function works on one chunk of a tensor's raw bytes (a C-contiguous `numpy.uint8` array)
whose length is a multiple of the element width. Byte grouping splits each element's bytes into
planes (all first bytes, then all second bytes, ...) so that the slowly varying sign/exponent
bytes sit together and entropy-code well (the ZipNN idea). Each plane is then stored on its own,
zstd-compressed or raw as the tensor's plane `mask` says (`z`/`r` per plane, chosen on a sample:
the low mantissa bytes of floats do not compress, and skipping them doubles the speed).

A delta is taken against the same chunk of the same tensor in the base checkpoint, on the bit
patterns seen as unsigned integers: `xor` (a ^ b), `sub` (a - b, wrapping, on whole elements) or
`bsub` (a - b on each byte plane, wrapping per byte: nearly as small as `sub` on floats), then
byte-grouped. XOR and `bsub` commute with byte grouping, so a chain of them is undone plane by
plane and ungrouped once; `auto` prefers them unless `sub` is clearly smaller (SUB_MARGIN). Every
chunk has a BLAKE3 digest in the manifest, checked on every restore, so zstd frames are written
without their own content checksum (frames written with one, by older versions, still decode and
are checked).
Compression and decompression release the GIL, so chunks run in parallel on threads.

Grouping, ungrouping and the plane-wise deltas run in the C extension `_planes` where it was built
(one pass in cache-sized blocks, the chain of deltas applied on the way); without it numpy gives
the same bytes, several times slower.

Grouped payload layout: `width` little-endian uint32 segment lengths (high bit set: the plane is
stored raw, else it is one zstd frame), then the segments.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

import lz4.block
import numpy as np
import zstandard

try:
    from seedance_tasks.checkpoint import _planes
except ImportError:  # built without a C compiler: numpy does the same work
    _planes = None

FULL_CODECS = ("zstd", "lz4", "bgzstd")
DELTA_CODECS = ("delta-xor", "delta-sub", "delta-bsub")
PLANE_DELTAS = ("delta-xor", "delta-bsub")  # undone plane by plane: a chain of them is ungrouped once
GROUPED_CODECS = ("bgzstd", *DELTA_CODECS)
SUB_MARGIN = 0.06  # delta-sub must beat the best plane-wise delta by this much: it costs two ungroupings per level
ALL_CODECS = FULL_CODECS + DELTA_CODECS
RAW_PLANE_RATIO = 0.97  # a plane that zstd does not shrink below this is stored raw
SAMPLE_BYTES = 32 * 1024
RAW_FLAG = 1 << 31  # high bit of a segment length: the plane is stored raw

NATIVE_LEVELS = 64  # the most levels `_planes.merge` takes at once
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_PLANE_OPS = {"delta-xor": "x", "delta-bsub": "a"}  # how merge applies a level of each plane-wise delta
_LITTLE = sys.byteorder == "little"  # plane 0 is then the low byte of a word
_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    if level not in cache:
        # no zstd content checksum: every chunk's BLAKE3 digest in the manifest covers the same bytes, and
        # skipping the XXH64 makes decoding ~13% faster (frames written with one still decode and check it)
        cache[level] = zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True)
    return cache[level]


def _decompressor() -> zstandard.ZstdDecompressor:
    found = getattr(_local, "decompressor", None)
    if found is None:
        found = _local.decompressor = zstandard.ZstdDecompressor()
    return found


def group(raw: np.ndarray, width: int) -> np.ndarray:
    """The byte planes of `raw` (elements of `width` bytes): a (width, count) uint8 array whose
    rows are the planes, each contiguous."""
    if width == 1 or raw.size == 0:
        return raw.reshape(1, -1)
    planes = np.empty((width, raw.size // width), dtype=np.uint8)
    if _planes is not None and width <= 16 and raw.flags.c_contiguous:
        _planes.split(raw, width, planes)
        return planes
    if width in (2, 4) and _LITTLE and raw.flags.c_contiguous and raw.ctypes.data % width == 0:
        # plane k = the words shifted right by 8k, truncated to a byte (SIMD, whole words): 2x
        # (width 4) / 4x (width 2) faster than the strided gather, which stays the faster for width 8
        words = raw.view(_UINT[width])
        shifted = _scratch(words.size, words.dtype)
        np.copyto(planes[0], words, casting="unsafe")
        for index in range(1, width):
            np.right_shift(words, 8 * index, out=shifted)
            np.copyto(planes[index], shifted, casting="unsafe")
        return planes
    np.copyto(planes, raw.reshape(-1, width).T)  # strided gather: as fast as it gets in numpy for width 8
    return planes


def _scratch(count: int, dtype) -> np.ndarray:
    """A per-thread work array of `count` elements of `dtype` (reused: no fresh pages per chunk)."""
    found = getattr(_local, "scratch", None)
    if found is None or found.nbytes < count * np.dtype(dtype).itemsize:
        found = _local.scratch = np.empty(count * np.dtype(dtype).itemsize, dtype=np.uint8)
    return found[: count * np.dtype(dtype).itemsize].view(dtype)


def ungroup(planes: np.ndarray | list[np.ndarray], width: int, out: np.ndarray) -> None:
    """Write the elements whose byte planes are `planes` into `out` (uint8, width * plane length)."""
    if width == 1 or out.size == 0:
        out[:] = planes[0]
        return
    if _planes is not None and width <= 16 and out.flags.c_contiguous:
        _planes.merge(out, [planes], "", width)
        return
    view = out.reshape(-1, width)
    for index, plane in enumerate(planes):  # one strided scatter per plane beats a transposed copy
        view[:, index] = plane


@dataclass(frozen=True)
class PlaneChain:
    """A chunk's byte planes as a bottom level and plane-wise deltas on it, applied when merged.

    `levels[0]` is the planes of the chunk at the bottom of the chain; each later level is one
    delta's planes, applied with its op in `ops` ('x' XOR, 'a' add mod 256). Planes are never
    written to, so they may be read-only views of the stored payload."""

    levels: tuple
    ops: str = ""

    def then(self, codec: str, planes) -> PlaneChain:
        """This chain with one more plane-wise delta (`delta-xor` or `delta-bsub`) on top."""
        return PlaneChain((*self.levels, planes), self.ops + _PLANE_OPS[codec])

    def shape(self) -> list[int]:
        """The size of each plane."""
        return [plane.size for plane in self.levels[0]]

    def merge(self, width: int, out: np.ndarray) -> None:
        """The chunk's bytes (the chain applied, then ungrouped) into `out` (uint8, width * plane length)."""
        levels, ops = self.levels, self.ops
        if _planes is not None and 1 < width <= 16 and out.size and out.flags.c_contiguous:
            if len(levels) > NATIVE_LEVELS:  # fold the bottom levels first: a chain deeper than merge takes
                levels, ops = (_apply(levels[: -NATIVE_LEVELS + 1], ops[: -NATIVE_LEVELS + 1]),
                               *levels[-NATIVE_LEVELS + 1:]), ops[-NATIVE_LEVELS + 1:]
            _planes.merge(out, levels, ops, width)
            return
        ungroup(_apply(levels, ops) if ops else levels[0], width, out)

    def flat(self, width: int) -> np.ndarray:
        """The chunk's bytes in a new array."""
        out = np.empty(sum(self.shape()), dtype=np.uint8)
        self.merge(width, out)
        return out


def _apply(levels, ops: str) -> list[np.ndarray]:
    """The planes of `levels` with every delta applied (numpy, one pass per plane and level)."""
    planes = [np.array(plane, dtype=np.uint8) for plane in levels[0]]
    for level, op in zip(levels[1:], ops, strict=True):
        combine = np.bitwise_xor if op == "x" else np.add
        for plane, delta_plane in zip(planes, level, strict=True):
            combine(plane, delta_plane, out=plane)
    return planes


def _as_int(raw: np.ndarray, width: int) -> np.ndarray:
    return raw.view(_UINT[width]) if width in _UINT else raw


def delta(op: str, current: np.ndarray, base: np.ndarray, width: int) -> np.ndarray:
    """`current` against `base` (same length), as raw bytes: 'xor' -> a ^ b, 'bsub' -> a - b on each
    byte, 'sub' -> a - b on whole elements (all wrapping). XOR and bsub work byte by byte, so they
    commute with byte grouping."""
    if op == "xor":
        return np.bitwise_xor(current, base)
    if op == "bsub":
        return np.subtract(current, base)
    return np.subtract(_as_int(current, width), _as_int(base, width)).view(np.uint8)


def _pack(planes: list[np.ndarray], mask: str, level: int) -> list:
    segments = [
        _compressor(level).compress(plane) if mode == "z" else plane
        for plane, mode in zip(planes, mask, strict=True)
    ]
    lengths = [len(seg) | (RAW_FLAG if mode != "z" else 0) for seg, mode in zip(segments, mask, strict=True)]
    return [np.array(lengths, dtype="<u4").tobytes(), *segments]


def payload_size(payload) -> int:
    """Bytes of an encoded chunk (a bytes object or a list of buffers)."""
    return len(payload) if isinstance(payload, bytes) else sum(memoryview(part).nbytes for part in payload)


def encode(codec: str, raw: np.ndarray, width: int, level: int, base: np.ndarray | None = None,
           mask: str | None = None):
    """One chunk encoded under `codec` (a delta codec needs `base`): bytes, or a list of buffers
    (grouped codecs, to spare a copy of the raw planes) that are written one after the other."""
    if codec == "zstd":
        return _compressor(level).compress(raw)
    if codec == "lz4":
        return lz4.block.compress(raw, store_size=False)
    planes = _delta_planes(codec, raw, base, width)
    return _pack(planes, mask or "z" * len(planes), level)


def _delta_planes(codec: str, raw: np.ndarray, base: np.ndarray | None, width: int) -> list[np.ndarray]:
    """The byte planes that `codec` stores for `raw` (against `base` for a delta)."""
    if codec == "bgzstd":
        return group(raw, width)
    if codec not in DELTA_CODECS:
        raise ValueError(f"unknown codec {codec!r}")
    if base is None or base.size != raw.size:
        raise ValueError(f"{codec} needs a base chunk of {raw.size} bytes")
    if (_planes is not None and codec in PLANE_DELTAS and 1 < width <= 16 and raw.size
            and raw.flags.c_contiguous and base.flags.c_contiguous):
        planes = np.empty((width, raw.size // width), dtype=np.uint8)
        _planes.split(raw, width, planes, base, "x" if codec == "delta-xor" else "s")
        return planes
    return group(delta(codec.removeprefix("delta-"), raw, base, width), width)


def _unpack(payload, raw_size: int, width: int) -> list[np.ndarray]:
    """The byte planes of a grouped payload (raw planes are views of `payload`, read-only)."""
    count = 1 if width == 1 or raw_size == 0 else width
    plane_size = raw_size // count
    buffer = memoryview(payload)
    lengths = np.frombuffer(buffer[: 4 * count], dtype="<u4")
    if lengths.size != count:
        raise ValueError("chunk header is truncated")
    planes, offset = [], 4 * count
    for entry in lengths.tolist():
        length, stored_raw = entry & ~RAW_FLAG, bool(entry & RAW_FLAG)
        segment = buffer[offset : offset + length]
        if len(segment) != length:
            raise ValueError("chunk is truncated")
        offset += length
        if stored_raw:
            if length != plane_size:
                raise ValueError(f"a raw plane holds {length} bytes, not {plane_size}")
            planes.append(np.frombuffer(segment, dtype=np.uint8))
        else:
            data = _decompressor().decompress(segment, max_output_size=plane_size)
            if len(data) != plane_size:
                raise ValueError(f"a plane decoded to {len(data)} bytes, not {plane_size}")
            planes.append(np.frombuffer(data, dtype=np.uint8))
    if offset != len(buffer):
        raise ValueError("chunk has trailing bytes")
    return planes


def decode_planes(codec: str, payload, raw_size: int, width: int) -> tuple[list[np.ndarray] | np.ndarray, bool]:
    """Decode one chunk without its base: (planes, True) for grouped codecs, (raw bytes, False) else.

    Raises ValueError on damaged data.
    """
    try:
        if codec == "lz4":
            data = lz4.block.decompress(payload, uncompressed_size=raw_size)
        elif codec == "zstd":
            data = _decompressor().decompress(payload, max_output_size=raw_size)
        elif codec in GROUPED_CODECS:
            return _unpack(payload, raw_size, width), True
        else:
            raise ValueError(f"unknown codec {codec!r}")
    except (zstandard.ZstdError, lz4.block.LZ4BlockError) as exc:
        raise ValueError(f"compressed data is damaged ({exc})") from None
    if len(data) != raw_size:
        raise ValueError(f"decoded {len(data)} bytes where {raw_size} were stored")
    return np.frombuffer(data, dtype=np.uint8), False


def decode(codec: str, payload, raw_size: int, width: int, out: np.ndarray, base: np.ndarray | None = None) -> None:
    """Decode one chunk into `out` (uint8, `raw_size` bytes); a delta needs `base` (raw bytes)."""
    decoded, grouped = decode_planes(codec, payload, raw_size, width)
    if codec in DELTA_CODECS:
        if base is None or base.size != raw_size:
            raise ValueError(f"{codec} needs a base chunk of {raw_size} bytes")
        ungroup(decoded, width, out)
        undo(codec, out, base, width)
    elif grouped:
        ungroup(decoded, width, out)
    else:
        out[:] = decoded


def undo(codec: str, decoded: np.ndarray, base: np.ndarray, width: int) -> None:
    """Turn the ungrouped delta `decoded` back into the raw bytes, in place, given the base's."""
    if codec == "delta-xor":
        np.bitwise_xor(decoded, base, out=decoded)
    elif codec == "delta-bsub":
        np.add(decoded, base, out=decoded)
    else:
        np.add(_as_int(decoded, width), _as_int(base, width), out=_as_int(decoded, width))


def _plane_sizes(planes: list[np.ndarray], level: int) -> list[tuple[int, int]]:
    return [(len(_compressor(level).compress(plane)), plane.size) for plane in planes]


def sample(raw: np.ndarray, width: int, size: int = SAMPLE_BYTES) -> list[slice]:
    """Two slices (start and middle) of about `size/2` bytes, aligned to `width`, to try codecs on;
    at most 1/8 of a small tensor (so trying four codecs costs half a compression of it)."""
    size = min(size, max(8192, raw.size // 8))
    if raw.size <= size:
        return [slice(0, raw.size)]
    half = (size // 2) // width * width
    middle = (raw.size // 2) // width * width
    return [slice(0, half), slice(middle, middle + half)]


def estimate(codec: str, raw: np.ndarray, width: int, level: int, base: np.ndarray | None) -> tuple[int, str]:
    """(estimated bytes on a sample, plane mask) of `codec` on one tensor."""
    if codec in ("zstd", "lz4"):
        return sum(payload_size(encode(codec, raw[s], width, level)) for s in sample(raw, width)), ""
    totals: list[list[int]] = []
    for span in sample(raw, width):
        sizes = _plane_sizes(_delta_planes(codec, raw[span], base[span] if base is not None else None, width), level)
        totals = [[a + c, b + r] for (a, b), (c, r) in zip(totals, sizes, strict=True)] if totals else [
            [c, r] for c, r in sizes]
    mask = "".join("z" if packed < RAW_PLANE_RATIO * plain else "r" for packed, plain in totals)
    size = sum(packed if mode == "z" else plain for (packed, plain), mode in zip(totals, mask, strict=True))
    return size, mask


def choose(raw: np.ndarray, width: int, level: int, base: np.ndarray | None, min_delta_gain: float,
           candidates: tuple[str, ...] = ("bgzstd", *DELTA_CODECS)) -> tuple[str, str]:
    """(codec, plane mask) for one tensor: the smallest on a sample among `candidates`; a delta only if it pays.

    `delta-sub` is taken only when it beats the best plane-wise delta by SUB_MARGIN (restores of
    plane-wise chains are cheaper)."""
    if raw.size < 4096:
        return ("zstd", "") if "zstd" in candidates or "bgzstd" in candidates else (candidates[0], "z" * width)
    full = [c for c in candidates if c in FULL_CODECS and (c != "bgzstd" or width > 1)] or ["zstd"]
    sizes = {c: estimate(c, raw, width, level, None) for c in full}
    best_full = min(sizes, key=lambda c: sizes[c][0])
    if base is None:
        return best_full, sizes[best_full][1]
    ops = [c for c in candidates if c in DELTA_CODECS and (c != "delta-sub" or width in _UINT)]
    deltas = {c: estimate(c, raw, width, level, base) for c in ops}
    if deltas:
        best_delta = min(deltas, key=lambda c: deltas[c][0])
        plane_wise = [c for c in deltas if c in PLANE_DELTAS]
        if best_delta == "delta-sub" and plane_wise:
            best_plane = min(plane_wise, key=lambda c: deltas[c][0])
            if deltas["delta-sub"][0] > (1 - SUB_MARGIN) * deltas[best_plane][0]:
                best_delta = best_plane
        if deltas[best_delta][0] <= (1 - min_delta_gain) * sizes[best_full][0]:
            return best_delta, deltas[best_delta][1]
    return best_full, sizes[best_full][1]
