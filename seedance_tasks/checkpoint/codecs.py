"""Chunk codecs: zstd, lz4, byte-grouped zstd, and XOR / integer-difference deltas.

Every function works on one chunk of a tensor's raw bytes (a C-contiguous `numpy.uint8` array)
whose length is a multiple of the element width. Byte grouping splits each element's bytes into
planes (all first bytes, then all second bytes, ...) so that the slowly varying sign/exponent
bytes sit together and entropy-code well (the ZipNN idea). A delta is taken against the same
chunk of the same tensor in the base checkpoint, on the bit patterns seen as unsigned integers:
`xor` (a ^ b) or `sub` (a - b, wrapping), then byte-grouped and zstd-compressed. zstd frames
carry a content checksum, so damage to a compressed chunk is caught before the sha256 check.
Compression and decompression release the GIL, so chunks run in parallel on threads.
"""

from __future__ import annotations

import threading

import lz4.block
import numpy as np
import zstandard

FULL_CODECS = ("zstd", "lz4", "bgzstd")
DELTA_CODECS = ("delta-xor", "delta-sub")
ALL_CODECS = FULL_CODECS + DELTA_CODECS

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    return cache[level]


def _decompressor() -> zstandard.ZstdDecompressor:
    found = getattr(_local, "decompressor", None)
    if found is None:
        found = _local.decompressor = zstandard.ZstdDecompressor()
    return found


def group(raw: np.ndarray, width: int) -> np.ndarray:
    """The byte planes of `raw` (elements of `width` bytes), plane after plane, contiguous."""
    if width == 1 or raw.size == 0:
        return raw
    return np.ascontiguousarray(raw.reshape(-1, width).T)


def ungroup(planes: np.ndarray, width: int, out: np.ndarray) -> None:
    """Write the elements whose byte planes are `planes` into `out` (uint8, same length)."""
    if width == 1 or planes.size == 0:
        out[:] = planes
        return
    count = planes.size // width
    rows = planes.reshape(width, count)
    kind = _UINT.get(width)
    if kind is None:
        out.reshape(count, width)[:] = rows.T
        return
    # little-endian: plane i holds bits 8i..8i+7; shifting whole planes is ~3x faster than a transpose
    target = out.view(kind)
    np.copyto(target, rows[0], casting="unsafe")
    for index in range(1, width):
        target |= rows[index].astype(kind) << kind(8 * index)


def _as_int(raw: np.ndarray, width: int) -> np.ndarray:
    return raw.view(_UINT[width]) if width in _UINT else raw


def delta(op: str, current: np.ndarray, base: np.ndarray, width: int) -> np.ndarray:
    """`current` against `base` (same length): 'xor' -> a ^ b, 'sub' -> a - b (wrapping)."""
    a, b = _as_int(current, width), _as_int(base, width)
    out = np.bitwise_xor(a, b) if op == "xor" else np.subtract(a, b)
    return out.view(np.uint8)


def undelta(op: str, diff: np.ndarray, base: np.ndarray, width: int, out: np.ndarray) -> None:
    """Inverse of `delta` into `out`: 'xor' -> d ^ b, 'sub' -> d + b (wrapping)."""
    d, b, o = _as_int(diff, width), _as_int(base, width), _as_int(out, width)
    if op == "xor":
        np.bitwise_xor(d, b, out=o)
    else:
        np.add(d, b, out=o)


def encode(codec: str, raw: np.ndarray, width: int, level: int, base: np.ndarray | None = None) -> bytes:
    """The compressed bytes of one chunk under `codec` (a delta codec needs `base`)."""
    if codec == "zstd":
        return _compressor(level).compress(raw)
    if codec == "lz4":
        return lz4.block.compress(raw, store_size=False)
    if codec == "bgzstd":
        return _compressor(level).compress(group(raw, width))
    if codec in DELTA_CODECS:
        if base is None or base.size != raw.size:
            raise ValueError(f"{codec} needs a base chunk of {raw.size} bytes")
        op = "xor" if codec == "delta-xor" else "sub"
        return _compressor(level).compress(group(delta(op, raw, base, width), width))
    raise ValueError(f"unknown codec {codec!r}")


def decode(codec: str, payload, raw_size: int, width: int, out: np.ndarray, base: np.ndarray | None = None) -> None:
    """Decode one chunk into `out` (uint8, `raw_size` bytes). Raises ValueError on damaged data."""
    try:
        if codec == "lz4":
            data = lz4.block.decompress(payload, uncompressed_size=raw_size)
        else:
            data = _decompressor().decompress(payload, max_output_size=raw_size)
    except (zstandard.ZstdError, lz4.block.LZ4BlockError) as exc:
        raise ValueError(f"compressed data is damaged ({exc})") from None
    if len(data) != raw_size:
        raise ValueError(f"decoded {len(data)} bytes where {raw_size} were stored")
    plain = np.frombuffer(data, dtype=np.uint8)
    if codec in ("zstd", "lz4"):
        out[:] = plain
    elif codec == "bgzstd":
        ungroup(plain, width, out)
    elif codec in DELTA_CODECS:
        if base is None or base.size != raw_size:
            raise ValueError(f"{codec} needs a base chunk of {raw_size} bytes")
        ungroup(plain, width, out)
        undelta("xor" if codec == "delta-xor" else "sub", out, base, width, out)
    else:
        raise ValueError(f"unknown codec {codec!r}")


def sample(raw: np.ndarray, width: int, size: int = 256 * 1024) -> list[slice]:
    """Up to two slices of about `size/2` bytes (start and middle), aligned to `width`, to try codecs on."""
    if raw.size <= size:
        return [slice(0, raw.size)]
    half = (size // 2) // width * width
    middle = (raw.size // 2) // width * width
    return [slice(0, half), slice(middle, middle + half)]


def choose(
    raw: np.ndarray, width: int, level: int, base: np.ndarray | None, min_delta_gain: float, *, floats: bool
) -> str:
    """The codec `auto` picks for one tensor: the smallest on a sample; a delta only if it pays."""
    if raw.size < 4096:
        return "zstd"
    spans = sample(raw, width)
    full_candidates = ["bgzstd", "zstd"] if not floats and width > 1 else ["bgzstd"] if width > 1 else ["zstd"]
    sizes = {c: sum(len(encode(c, raw[s], width, level)) for s in spans) for c in full_candidates}
    best_full = min(sizes, key=sizes.__getitem__)
    if base is None:
        return best_full
    ops = ["delta-xor", "delta-sub"] if width in _UINT else ["delta-xor"]
    deltas = {c: sum(len(encode(c, raw[s], width, level, base[s])) for s in spans) for c in ops}
    best_delta = min(deltas, key=deltas.__getitem__)
    if deltas[best_delta] <= (1 - min_delta_gain) * sizes[best_full]:
        return best_delta
    return best_full
