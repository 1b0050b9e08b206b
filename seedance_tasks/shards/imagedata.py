"""Whether an image's compressed data holds every pixel its header declares, and the most pixels
an image may declare (`MAX_PIXELS`: the same for `check_decode` and the preprocessing transform).

PIL decodes a PNG whose compressed data ends cleanly before its last row (an encoder that wrote
a wrong height, a file rewritten short with a fresh zlib end) without a word: the rows that are
not there come out black, and a truncated image passes as a sample. libpng refuses it ("Not
enough image data"). `png_shortfall` tells it from the PNG's own chunks: it inflates the IDAT
data (bounded pieces, nothing kept) and compares its length with what the header's size, bit
depth, colour type and interlacing call for. Used by the preprocessing transform (a short PNG
fails its sample) and by `shards build`/`verify` with `check_decode` (it does not decode).
"""

from __future__ import annotations

import struct
import zlib

MAX_PIXELS = 178_956_970  # PIL's own refusal threshold (twice its default MAX_IMAGE_PIXELS, which only warns)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type -> samples per pixel
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
_PIECE = 1024 * 1024  # inflated bytes looked at, at most, per step


def _filtered_size(width: int, height: int, bits_per_pixel: int, interlaced: bool) -> int:
    """Bytes of filtered scanlines (a filter byte and the packed pixels per row) of a PNG image."""
    def rows(w: int, h: int) -> int:
        return 0 if w == 0 or h == 0 else h * (1 + (w * bits_per_pixel + 7) // 8)

    if not interlaced:
        return rows(width, height)
    return sum(rows((width - x0 + dx - 1) // dx if width > x0 else 0, (height - y0 + dy - 1) // dy if height > y0 else 0)
               for x0, y0, dx, dy in _ADAM7)


def png_shortfall(data: bytes) -> str | None:
    """Why the PNG `data` holds less pixel data than its header declares (in words), or None: it
    holds it all, or it is not a PNG, or its chunks are too damaged to tell (the decoder reports that)."""
    if not data.startswith(PNG_SIGNATURE):
        return None
    view = memoryview(data)
    position, expected, got, width, height, interlaced = len(PNG_SIGNATURE), None, 0, 0, 0, False
    inflater = zlib.decompressobj()
    while position + 8 <= len(data):
        length, kind = struct.unpack(">I4s", view[position : position + 8])
        body = view[position + 8 : position + 8 + length]
        if kind == b"IHDR" and len(body) >= 13:
            width, height, depth, colour, _method, _filter, interlace = struct.unpack(">IIBBBBB", body[:13])
            if colour not in _CHANNELS:
                return None
            interlaced = interlace == 1
            expected = _filtered_size(width, height, depth * _CHANNELS[colour], interlaced)
        elif kind == b"IDAT" and expected is not None:
            piece: bytes | memoryview = body
            try:
                while piece and got < expected and not inflater.eof:
                    got += len(inflater.decompress(piece, _PIECE))
                    piece = inflater.unconsumed_tail
            except zlib.error:
                return None  # corrupt data: the decoder's own error says so
            if got >= expected:
                return None
        elif kind == b"IEND":
            break
        position += 12 + length
    if expected is None or got >= expected:
        return None
    if not interlaced:
        rows = got // (1 + (expected // height - 1)) if height else 0
        return f"image file is truncated: its pixel data holds {rows:,} of the {height:,} rows its header declares"
    return f"image file is truncated: its pixel data holds {got:,} of the {expected:,} bytes its header declares"
