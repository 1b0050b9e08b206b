"""The CPU stage: decode a JPEG/PNG, resize and center-crop to SIZE x SIZE, convert to uint8 CHW.

Runs in the CPU pool's worker processes, so it imports only PIL and numpy (and pyarrow, for the
fast resize). JPEGs are decoded at reduced size where that still leaves the short side >= SIZE
(libjpeg's DCT scaling through PIL's `draft`), which is most of the speed-up on photos larger
than the target. RGB images are resized by `fastresize` (Pillow's bilinear arithmetic in C,
written straight to CHW order: the same bytes as Pillow's `resize`, about three times as fast);
RGB JPEGs decoded at full size go through `fastjpeg` (libjpeg-turbo straight into the resizer's
layout: the same pixels as Pillow's decode), Pillow decoding whatever it declines.
`fast=False` leaves every decode and resize to Pillow.

What an image becomes, the same with or without `draft` and in or out of the pool:
- Formats: the bytes decide, not the member's extension. JPEG (also CMYK/YCCK Adobe JPEGs and
  MPO, whose first picture is used) and PNG are accepted; anything else (GIF, WebP, TIFF, BMP,
  non-image bytes) fails, naming the format found.
- Transparency (RGBA, LA, a palette or grey/RGB PNG with a tRNS chunk) is composited over
  `ALPHA_BACKGROUND` (white), so what transparent pixels hold underneath never shows.
- 16-bit grey PNGs keep their tones (scaled to 8 bits), instead of PIL's clipping to white.
- An EXIF orientation tag (2-8) is applied, as `ImageOps.exif_transpose` and photo viewers do:
  a phone photo comes out upright. A malformed EXIF block is ignored (orientation 1).
- A truncated image fails, whatever the process set `ImageFile.LOAD_TRUNCATED_IMAGES` to (a
  training script often sets it; the pool's workers import that script), and so does a PNG
  whose compressed data ends cleanly before its last row (PIL would leave those rows black:
  `shards.imagedata.png_shortfall`).
- An image declaring more than `MAX_PIXELS` pixels fails from its header, before anything is
  decoded, whatever `Image.MAX_IMAGE_PIXELS` says.
- Images smaller than SIZE (down to 1x1) and extreme aspect ratios are upscaled from their
  center square.
"""

from __future__ import annotations

import io
import math
import time

import numpy as np
from PIL import Image, ImageFile

from seedance_tasks.preprocess import fastjpeg, fastresize
from seedance_tasks.preprocess.fastresize import needs_reduce, resize_chw, resize_rgbx_chw
from seedance_tasks.shards.imagedata import MAX_PIXELS, png_shortfall

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png")
ALPHA_BACKGROUND = (255, 255, 255)  # what transparent pixels are composited over
_GRAY16 = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # PIL's modes of a 16-bit grey PNG
_ORIENTATION = 0x0112
_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
              5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}


def image_extension(extensions) -> str | None:
    """The member extension holding the sample's image, or None: a plain `jpg`, `jpeg` or `png` (any
    case; the first by name if there are several) where the sample has one, else the first by
    name of its `*.jpg`, `*.png`... (`left.jpg`). So `depth.png` or `mask.png` beside the sample's
    `jpg` stays one of its other members, whatever the names sort as."""
    best = None
    for ext in extensions:
        if ext.lower().rsplit(".", 1)[-1] in IMAGE_EXTENSIONS:
            rank = ("." in ext, ext)
            if best is None or rank < best:
                best = rank
    return None if best is None else best[1]


def no_image_reason(extensions) -> str:
    """Why a sample whose member extensions are `extensions` has no image to transform."""
    return f"no JPEG/PNG member (members: {', '.join(sorted(extensions)) or 'none'})"


OUTPUT_EXTENSION = "npy"  # the preprocessed array's member: KEY.npy


def output_clash(key: str, extensions) -> str | None:
    """Why the sample `key` (members `extensions`, its image taken out or not) cannot have its
    array written as KEY.npy: a member of its own is `npy` in any case (it would be overwritten,
    or make a second KEY.npy once readers lowercase it); None if it can."""
    for ext in extensions:
        if ext.lower() == OUTPUT_EXTENSION:
            return (f"{key}.{ext}: the sample has a member of its own named like the output array "
                    f"({key}.{OUTPUT_EXTENSION}), which would replace it; rename that member, then run again")
    return None


def to_chw(data: bytes, size: int, *, draft: bool = True, timings: list[float] | None = None,
           out: np.ndarray | None = None, fast: bool = True) -> np.ndarray:
    """`data` (JPEG or PNG bytes) as a uint8 array of shape (3, size, size).

    The short side is resized to `size` (bilinear, with PIL's reducing gap) and the center cropped;
    formats, transparency, 16-bit grey, EXIF orientation and limits as the module says. Raises an
    exception (PIL's, OSError for a truncated image, or ValueError) for bytes it does not accept.
    `timings`, if given, gets [decode, resize, convert] seconds added; `out`, if given, is a
    uint8 (3, size, size) array the result is written into (and returned). `fast` decodes RGB
    JPEGs read at full size with `fastjpeg` and resizes RGB images with `fastresize` (the same
    bytes as Pillow's decode and resize); off, Pillow decodes and resizes every image (what a plain
    PIL transform does: the benchmark's peer).
    """
    t0 = time.perf_counter()
    image = Image.open(io.BytesIO(data))
    if image.format not in ("JPEG", "PNG", "MPO"):
        raise ValueError(f"not a JPEG or PNG image ({image.format})")
    width, height = image.size
    if width * height > MAX_PIXELS:
        raise ValueError(f"{width}x{height} pixels is above the limit of {MAX_PIXELS:,} (a decompression bomb?)")
    if draft and image.format in ("JPEG", "MPO"):
        scale = size / min(width, height)
        image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
    box, reducing_gap = _center_square(image.size, size)
    if (fast and fastjpeg.AVAILABLE and fastresize.AVAILABLE and image.format == "JPEG" and image.mode == "RGB"
            and image.size == (width, height) and not needs_reduce(box, size, reducing_gap)):
        pixels = fastjpeg.decode_rgbx(data, width, height)  # None: Pillow decodes it below
        if pixels is not None:
            transpose = _TRANSPOSE.get(_orientation(image))
            t1 = time.perf_counter()
            direct = out is not None and transpose is None and _fits(out, size)
            planes = out if direct else np.empty((3, size, size), np.uint8)
            if resize_rgbx_chw(pixels, size, box, reducing_gap, planes):
                return _finish(planes, transpose, out, timings, (t0, t1))
    _load_whole(image)
    if image.format == "PNG" and (short := png_shortfall(data)) is not None:
        raise OSError(short)  # PIL leaves the rows its data lacks black
    transpose = _TRANSPOSE.get(_orientation(image))
    image = _rgb_or_rgba(image)
    t1 = time.perf_counter()
    box, reducing_gap = _center_square(image.size, size)
    if fast and image.mode == "RGB":
        direct = out is not None and transpose is None and _fits(out, size)
        planes = out if direct else np.empty((3, size, size), np.uint8)
        if resize_chw(image, size, box, reducing_gap, planes):
            return _finish(planes, transpose, out, timings, (t0, t1))
    image = image.resize((size, size), Image.Resampling.BILINEAR, box=box, reducing_gap=reducing_gap)
    if image.mode == "RGBA":  # resized premultiplied by PIL, so compositing now equals compositing first
        image = Image.alpha_composite(Image.new("RGBA", image.size, ALPHA_BACKGROUND), image).convert("RGB")
    if transpose is not None:  # cheaper on the SIZE x SIZE result than on the whole image, and the same picture
        image = image.transpose(transpose)
    t2 = time.perf_counter()
    if out is None:
        array = np.ascontiguousarray(np.asarray(image).transpose(2, 0, 1))
    else:
        array = out
        np.copyto(out, np.asarray(image).transpose(2, 0, 1))
    _add_timings(timings, t0, t1, t2, time.perf_counter())
    return array


def _center_square(image_size: tuple[int, int], size: int) -> tuple[tuple[float, float, float, float], float | None]:
    """The centred square crop box of an image of `image_size`, and the reducing gap its resize uses."""
    width, height = image_size
    side = min(width, height)
    left, top = (width - side) / 2, (height - side) / 2
    return (left, top, left + side, top + side), 2.0 if side >= 2 * size else None


def _fits(out: np.ndarray, size: int) -> bool:
    return out.flags.c_contiguous and out.dtype == np.uint8 and out.shape == (3, size, size)


def _finish(planes: np.ndarray, transpose, out: np.ndarray | None, timings: list[float] | None,
            started: tuple[float, float]) -> np.ndarray:
    """The resized CHW `planes` oriented and in `out` (if given), the timings added."""
    t2 = time.perf_counter()
    if transpose is not None:
        planes = _CHW_TRANSPOSE[transpose](planes)
    if out is not None and planes is not out:
        np.copyto(out, planes)
    _add_timings(timings, *started, t2, time.perf_counter())
    return out if out is not None else np.ascontiguousarray(planes)


def _add_timings(timings: list[float] | None, t0: float, t1: float, t2: float, t3: float) -> None:
    """Add the decode (t0-t1), resize (t1-t2) and convert (t2-t3) seconds to `timings`, if given."""
    if timings is not None:
        timings[0] += t1 - t0
        timings[1] += t2 - t1
        timings[2] += t3 - t2


# PIL's transposes of an HWC picture, on a CHW array (square: the shape stays)
_CHW_TRANSPOSE = {
    Image.Transpose.FLIP_LEFT_RIGHT: lambda a: a[:, :, ::-1],
    Image.Transpose.FLIP_TOP_BOTTOM: lambda a: a[:, ::-1, :],
    Image.Transpose.ROTATE_180: lambda a: a[:, ::-1, ::-1],
    Image.Transpose.ROTATE_90: lambda a: np.rot90(a, 1, axes=(1, 2)),
    Image.Transpose.ROTATE_270: lambda a: np.rot90(a, -1, axes=(1, 2)),
    Image.Transpose.TRANSPOSE: lambda a: a.transpose(0, 2, 1),
    Image.Transpose.TRANSVERSE: lambda a: a[:, ::-1, ::-1].transpose(0, 2, 1),
}


def _load_whole(image: Image.Image) -> None:
    """Decode `image`, raising OSError if its data is truncated even where the process set
    `ImageFile.LOAD_TRUNCATED_IMAGES` (which would fill the missing part with grey)."""
    lenient = ImageFile.LOAD_TRUNCATED_IMAGES
    if not lenient:
        image.load()
        return
    ImageFile.LOAD_TRUNCATED_IMAGES = False  # a module global of PIL's: no per-image switch
    try:
        image.load()
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = lenient


def _orientation(image: Image.Image) -> int:
    """The EXIF orientation (1-8) of a loaded `image`; 1 when it has none or its EXIF is malformed."""
    try:
        orientation = image.getexif().get(_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - PIL raises many kinds on a malformed EXIF block; the pixels are fine
        return 1
    return orientation if isinstance(orientation, int) else 1


def _rgb_or_rgba(image: Image.Image) -> Image.Image:
    """A loaded `image` as RGB, or as RGBA if it has transparency; 16-bit grey scaled to 8 bits."""
    transparency = image.info.get("transparency")
    if image.mode in _GRAY16:
        values = np.asarray(image)
        grey = np.clip(values >> 8, 0, 255).astype(np.uint8)
        if isinstance(transparency, int):  # tRNS names one 16-bit grey level
            alpha = np.where(values == transparency, 0, 255).astype(np.uint8)
            return Image.fromarray(np.dstack([grey, grey, grey, alpha]), "RGBA")
        return Image.fromarray(grey, "L").convert("RGB")
    if transparency is not None or image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        return image.convert("RGBA")  # applies a tRNS chunk of P, L and RGB images too
    return image if image.mode == "RGB" else image.convert("RGB")  # (converting RGB would only copy it)


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
        except Exception as exc:  # any undecodable input is reported, not fatal
            out.append(f"error: {failure_reason(exc, data)}")
    del buffer
    timings[3] = time.process_time() - cpu_started
    return out, timings


def failure_reason(exc: Exception, data: bytes) -> str:
    """Why `to_chw` refused `data` (the exception it raised), in words for a failed sample's record."""
    if isinstance(exc, Image.UnidentifiedImageError):
        start = "empty (0 bytes)" if not data else f"it starts {bytes(data[:16])!r}"
        return f"not a JPEG or PNG image, nor any image format PIL knows ({start})"
    return f"{type(exc).__name__}: {exc}"


def npy_header(size: int) -> bytes:
    """The .npy header of a uint8 (3, size, size) C-order array (what `np.save` writes before the data)."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)), "fortran_order": False,
                 "shape": (3, size, size)}
    )
    return buffer.getvalue()
