"""Pillow's bilinear `resize` of an RGB image, the same bytes, about twice as fast, as CHW.

`resize_chw(image, size, box, reducing_gap, out)` does what
`np.asarray(image.resize((size, size), BILINEAR, box=box, reducing_gap=reducing_gap)).transpose(2, 0, 1)`
does, writing into `out`: Pillow's own `reduce` first where `reducing_gap` asks for it (as
`Image.resize` does), then the C extension `_resample` (Pillow 13's fixed-point arithmetic, with
AVX2 where the CPU has it) reading Pillow's pixel memory without a copy (the Arrow C data
interface) and writing the planes directly, so no packed-RGB copy nor transpose is made.

It returns False, leaving the work to Pillow, where it does not apply: the extension not built
(no C compiler at install time), an image not in RGB mode or not in one memory block.
tests/preprocess/test_fast_resize.py checks it byte for byte against Pillow.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

try:
    from seedance_tasks.preprocess import _resample
except ImportError:  # built without a C compiler: Pillow does the resize
    _resample = None

AVAILABLE = _resample is not None
_BILINEAR = Image.Resampling.BILINEAR


def resize_chw(image: Image.Image, size: int, box: tuple[float, float, float, float], reducing_gap: float | None,
               out: np.ndarray) -> bool:
    """Resize the loaded RGB `image` over `box` to `size` x `size` (bilinear, as Pillow's `resize`
    with that `reducing_gap`) into `out`, a C-contiguous uint8 (3, size, size) array.

    Returns True when done; False (nothing written) when the fast path does not apply."""
    if _resample is None or image.mode != "RGB":
        return False
    factor_x, factor_y = _reduce_factors(box, size, reducing_gap)
    if factor_x > 1 or factor_y > 1:
        reduce_box = image._get_safe_box((size, size), _BILINEAR, box)  # what Image.resize reduces
        image = image.reduce((factor_x, factor_y), box=reduce_box)
        box = ((box[0] - reduce_box[0]) / factor_x, (box[1] - reduce_box[1]) / factor_y,
               (box[2] - reduce_box[0]) / factor_x, (box[3] - reduce_box[1]) / factor_y)
    import pyarrow as pa

    try:
        pixels = pa.array(image)  # Pillow's own memory, 4 bytes a pixel (RGBX); no copy
    except (ValueError, TypeError, NotImplementedError):  # e.g. an image in several memory blocks
        return False
    data = pixels.buffers()[-1]
    width, height = image.size
    if data is None or data.size < width * height * 4 or pixels.offset or pixels.values.offset:
        return False
    _resample.rgbx_to_chw(data, width, height, tuple(float(v) for v in box), size, size, out)
    return True


def resize_rgbx_chw(pixels: np.ndarray, size: int, box: tuple[float, float, float, float],
                    reducing_gap: float | None, out: np.ndarray) -> bool:
    """As `resize_chw`, from decoded pixels: a C-contiguous (height, width, 4) uint8 array of RGB
    and a padding byte (what `fastjpeg.decode_rgbx` gives). False (nothing written) where it does
    not apply: the extension not built, or a resize that Pillow would start with a `reduce`."""
    factor_x, factor_y = _reduce_factors(box, size, reducing_gap)
    if _resample is None or factor_x > 1 or factor_y > 1 or not pixels.flags.c_contiguous:
        return False
    height, width = pixels.shape[:2]
    _resample.rgbx_to_chw(pixels, width, height, tuple(float(v) for v in box), size, size, out)
    return True


def needs_reduce(box: tuple[float, float, float, float], size: int, reducing_gap: float | None) -> bool:
    """Whether Pillow's `resize` over `box` to `size` starts with a `reduce` (a whole-factor shrink)."""
    return max(_reduce_factors(box, size, reducing_gap)) > 1


def _reduce_factors(box, size: int, reducing_gap: float | None) -> tuple[int, int]:
    if reducing_gap is None:
        return 1, 1
    return (int((box[2] - box[0]) / size / reducing_gap) or 1, int((box[3] - box[1]) / size / reducing_gap) or 1)
