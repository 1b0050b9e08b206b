"""A PNG whose compressed data ends cleanly before its last row decodes in PIL with the missing
rows black: the transform fails that sample, and `check_decode` (build and verify) refuses it,
naming the rows there are. Every complete PNG (colour types, bit depths, Adam7 interlacing, odd
sizes, data split over many IDAT chunks) still passes."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from seedance_tasks.preprocess.transform import failure_reason, to_chw
from seedance_tasks.shards.checks import image_problem
from seedance_tasks.shards.imagedata import png_shortfall

ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def encode(pixels: np.ndarray, *, colour: int, depth: int = 8, interlaced: bool = False, keep: float = 1.0,
           idat_size: int = 1 << 20) -> bytes:
    """A PNG of `pixels` (height, width, channels) of uint8/uint16 samples, filter 0, written by
    hand (PIL writes no interlaced PNGs); `keep` < 1 cuts the filtered data (then deflated whole)."""
    height, width = pixels.shape[:2]

    def scanlines(block: np.ndarray) -> bytes:
        if block.size == 0:
            return b""
        rows = []
        for row in block:
            if depth < 8:
                packed = np.packbits(np.unpackbits(row.reshape(-1, 1).astype(np.uint8), axis=1)[:, 8 - depth:])
                rows.append(b"\0" + packed.tobytes())
            else:
                rows.append(b"\0" + row.astype(">u2" if depth == 16 else np.uint8).tobytes())
        return b"".join(rows)

    if interlaced:
        raw = b"".join(scanlines(pixels[y0::dy, x0::dx]) for x0, y0, dx, dy in ADAM7)
    else:
        raw = scanlines(pixels)
    raw = raw[: int(len(raw) * keep)]
    data = zlib.compress(raw)
    idats = b"".join(chunk(b"IDAT", data[i : i + idat_size]) for i in range(0, len(data), idat_size))
    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 1 if interlaced else 0)
    palette = chunk(b"PLTE", bytes(range(256)) * 3) if colour == 3 else b""
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + palette + idats + chunk(b"IEND", b"")


CASES = [  # colour type, bit depth, samples per pixel
    (0, 1, 1), (0, 2, 1), (0, 4, 1), (0, 8, 1), (0, 16, 1), (2, 8, 3), (2, 16, 3), (3, 1, 1), (3, 4, 1),
    (3, 8, 1), (4, 8, 2), (6, 8, 4), (6, 16, 4),
]


@pytest.mark.parametrize("interlaced", [False, True])
@pytest.mark.parametrize("width,height", [(1, 1), (3, 5), (17, 9), (40, 33)])
@pytest.mark.parametrize("colour,depth,channels", CASES)
def test_complete_pngs_pass_and_short_ones_are_named(colour, depth, channels, width, height, interlaced):
    rng = np.random.default_rng(width * height + colour)
    pixels = rng.integers(0, 2**depth, size=(height, width, channels))
    complete = encode(pixels, colour=colour, depth=depth, interlaced=interlaced, idat_size=7)
    with Image.open(io.BytesIO(complete)) as image:
        image.load()  # PIL reads what we wrote
    assert png_shortfall(complete) is None
    assert image_problem(complete) is None
    if height * width > 1:
        short = encode(pixels, colour=colour, depth=depth, interlaced=interlaced, keep=0.5)
        assert "image file is truncated" in (png_shortfall(short) or "")
        assert "truncated" in (image_problem(short) or "")


def test_the_transform_fails_a_png_short_of_rows_instead_of_making_them_black():
    pixels = np.full((32, 32, 3), 200, np.uint8)
    complete = encode(pixels, colour=2)
    assert to_chw(complete, 16).min() == 200
    short = encode(pixels, colour=2, keep=10 / 32)
    with pytest.raises(OSError) as caught:
        to_chw(short, 16)
    assert "holds 10 of the 32 rows" in failure_reason(caught.value, short)
    assert "10 of the 32 rows" in image_problem(short)


def test_pngs_pil_writes_pass():
    rng = np.random.default_rng(0)
    for mode in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16"):
        image = Image.fromarray(rng.integers(0, 255, (23, 31, 3), dtype=np.uint8)).convert(mode)
        buffer = io.BytesIO()
        image.save(buffer, "PNG", optimize=mode == "P")
        assert png_shortfall(buffer.getvalue()) is None, mode
        to_chw(buffer.getvalue(), 16)


def test_check_decode_takes_the_pixel_limit_the_transform_takes():
    """An image of 90 megapixels (a medium-format photo) decodes in PIL (which only warns above 89M)
    and in the transform: `check_decode` does not reject it. Above PIL's refusal threshold both
    refuse it, from the header, whatever the process set PIL's own limit to."""
    from seedance_tasks.shards.imagedata import MAX_PIXELS

    big = io.BytesIO()
    Image.new("1", (9500, 9500)).save(big, "PNG")  # 90.25M pixels, a few hundred KB, 1 byte a pixel in PIL
    assert image_problem(big.getvalue()) is None
    header = struct.pack(">IIBBBBB", 20000, 9000, 1, 0, 0, 0, 0)  # 180M pixels: only the header is read
    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    assert str(MAX_PIXELS) in (image_problem(bomb) or "").replace(",", "")
