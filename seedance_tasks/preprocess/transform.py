"""The CPU stage: decode a JPEG/PNG, resize and center-crop to SIZE x SIZE, convert to uint8 CHW.

Runs in the CPU pool's worker processes, so it imports only PIL and numpy. JPEGs are decoded at
reduced size where that still leaves the short side >= SIZE (libjpeg's DCT scaling through PIL's
`draft`), which is most of the speed-up on photos larger than the target.
"""

from __future__ import annotations

import io
import math
import time

import numpy as np
from PIL import Image

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png")


def image_extension(extensions) -> str | None:
    """The member extension holding the sample's image (`jpg`, `jpeg`, `png`, or `*.jpg`...), or None."""
    for ext in sorted(extensions):
        if ext.lower().rsplit(".", 1)[-1] in IMAGE_EXTENSIONS:
            return ext
    return None


def to_chw(data: bytes, size: int, *, draft: bool = True, timings: list[float] | None = None,
           out: np.ndarray | None = None) -> np.ndarray:
    """`data` (JPEG or PNG bytes) as a uint8 array of shape (3, size, size).

    The short side is resized to `size` (bilinear, with PIL's reducing gap) and the center cropped.
    Raises an exception (PIL's or ValueError) for bytes that are not a decodable image.
    `timings`, if given, gets [decode, resize, convert] seconds added; `out`, if given, is a
    uint8 (3, size, size) array the result is written into (and returned).
    """
    t0 = time.perf_counter()
    image = Image.open(io.BytesIO(data))
    if image.format not in ("JPEG", "PNG", "MPO"):
        raise ValueError(f"not a JPEG or PNG image ({image.format})")
    width, height = image.size
    if draft and image.format in ("JPEG", "MPO"):
        scale = size / min(width, height)
        image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
    image.load()  # decodes
    if image.mode != "RGB":
        image = image.convert("RGB")  # (convert() of an RGB image would only copy it)
    t1 = time.perf_counter()
    width, height = image.size
    side = min(width, height)
    left, top = (width - side) / 2, (height - side) / 2
    image = image.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + side, top + side),
                         reducing_gap=2.0 if side >= 2 * size else None)
    t2 = time.perf_counter()
    if out is None:
        array = np.ascontiguousarray(np.asarray(image).transpose(2, 0, 1))
    else:
        array = out
        np.copyto(out, np.asarray(image).transpose(2, 0, 1))
    t3 = time.perf_counter()
    if timings is not None:
        timings[0] += t1 - t0
        timings[1] += t2 - t1
        timings[2] += t3 - t2
    return array


_ATTACHED: dict[str, object] = {}


def _slot(name: str):
    """The parent's shared-memory slot `name`, attached once per worker process."""
    from multiprocessing import shared_memory

    if name not in _ATTACHED:
        if len(_ATTACHED) > 64:  # slots of finished pipelines: let them go
            for old in _ATTACHED.values():
                old.close()
            _ATTACHED.clear()
        _ATTACHED[name] = shared_memory.SharedMemory(name=name)
    return _ATTACHED[name]


def process_batch(images: list[bytes], size: int, draft: bool = True, slot: str | None = None) -> tuple[list, list[float]]:
    """The CPU pool's task: each image to uint8 CHW, or an error string; plus stage times.

    With `slot` (the name of a shared-memory block of len(images) x 3 x size x size bytes), image
    i is written at offset i x 3 x size x size and its entry is None: nothing large is pickled
    back. Without it, entries are the raw bytes. Returns (entries, [decode, resize, convert, cpu]
    seconds), `cpu` being this process's CPU time for the batch (load-independent, unlike the
    wall-clock stage times). Never raises for a bad image: its entry is "error: <reason>".
    """
    timings = [0.0, 0.0, 0.0, 0.0]
    cpu_started = time.process_time()
    buffer = _slot(slot).buf if slot else None
    nbytes = 3 * size * size
    out: list = []
    for index, data in enumerate(images):
        try:
            if buffer is None:
                out.append(to_chw(data, size, draft=draft, timings=timings).tobytes())
            else:
                target = np.frombuffer(buffer, np.uint8, nbytes, index * nbytes).reshape(3, size, size)
                to_chw(data, size, draft=draft, timings=timings, out=target)
                out.append(None)
        except Image.UnidentifiedImageError:
            out.append("error: not a decodable image (UnidentifiedImageError)")
        except Exception as exc:  # any undecodable input is reported, not fatal
            out.append(f"error: {type(exc).__name__}: {exc}")
    del buffer
    timings[3] = time.process_time() - cpu_started
    return out, timings


def npy_header(size: int) -> bytes:
    """The .npy header of a uint8 (3, size, size) C-order array (what `np.save` writes before the data)."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)), "fortran_order": False,
                 "shape": (3, size, size)}
    )
    return buffer.getvalue()
