"""The fast resize (`fastresize` + the `_resample` C extension) writes exactly Pillow's bytes:
random images, sizes and boxes (both pass orders Pillow chooses, its reduce step, crops), and
whole `to_chw` transforms (JPEG with and without draft, PNG, grey, CMYK, every EXIF orientation,
transparency, tiny and extreme shapes), compared with the Pillow-only transform byte for byte."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from seedance_tasks.preprocess import fastresize
from seedance_tasks.preprocess.transform import to_chw

BILINEAR = Image.Resampling.BILINEAR


def pillow_chw(image: Image.Image, size: int, box, reducing_gap=None) -> np.ndarray:
    return np.asarray(image.resize((size, size), BILINEAR, box=box, reducing_gap=reducing_gap)).transpose(2, 0, 1)


def fast_chw(image: Image.Image, size: int, box, reducing_gap=None) -> np.ndarray:
    out = np.full((3, size, size), 77, np.uint8)
    assert fastresize.resize_chw(image, size, box, reducing_gap, out)
    return out


def test_the_extension_is_built():
    assert fastresize.AVAILABLE, "seedance_tasks/preprocess/_resample.c is not built: run `make venv` (needs gcc)"


def test_random_images_sizes_and_boxes_resize_to_pillows_bytes():
    rng = np.random.default_rng(20261203)
    for trial in range(400):
        width, height = (int(v) for v in rng.integers(1, 400, 2))
        if trial % 7 == 0:  # very tall or very wide: Pillow runs the vertical pass first for some
            width, height = (width, height * 6) if trial % 2 else (width * 6, height)
        image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        size = int(rng.integers(1, 300))
        if trial % 3 == 0:
            left, top = float(rng.uniform(0, width / 2)), float(rng.uniform(0, height / 2))
            box = (left, top, float(rng.uniform(left + 0.25, width)), float(rng.uniform(top + 0.25, height)))
        else:
            side = min(width, height)
            box = ((width - side) / 2, (height - side) / 2, (width + side) / 2, (height + side) / 2)
        gap = [None, 2.0, 1.0, 3.5][trial % 4]
        where = f"trial {trial}: {width}x{height} -> {size}, box {box}, reducing_gap {gap}"
        assert np.array_equal(fast_chw(image, size, box, gap), pillow_chw(image, size, box, gap)), where


@pytest.mark.parametrize(("width", "height", "size", "box"), [
    (300, 200, 100, (10, 20, 110, 120)),  # an integer box of the output's size: Pillow crops
    (64, 64, 64, (0, 0, 64, 64)),  # nothing to do
    (64, 48, 64, (0, 0, 64, 48)),  # the vertical pass only
    (48, 64, 64, (0, 0, 48, 64)),  # the horizontal pass only
    (1, 1, 224, (0, 0, 1, 1)),
    (2000, 30, 224, (985, 0, 1015, 30)),
    (30, 2000, 224, (0, 985, 30, 1015)),
    (4000, 3000, 224, (500, 0, 3500, 3000)),  # Pillow reduces first (factor 6 with a gap of 2)
])
def test_edge_cases_resize_to_pillows_bytes(width, height, size, box):
    rng = np.random.default_rng(width * height)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    for gap in (None, 2.0):
        if gap is None and width * height * 4 > Image.core.get_block_size():  # in several blocks: Pillow's
            assert not fastresize.resize_chw(image, size, box, gap, np.zeros((3, size, size), np.uint8))
            continue
        assert np.array_equal(fast_chw(image, size, box, gap), pillow_chw(image, size, box, gap)), gap


def test_an_image_in_several_memory_blocks_is_left_to_pillow():
    previous = Image.core.get_block_size()
    Image.core.set_block_size(4096)
    try:
        image = Image.fromarray(np.zeros((200, 300, 3), np.uint8))
        out = np.zeros((3, 32, 32), np.uint8)
        assert not fastresize.resize_chw(image, 32, (50, 0, 250, 200), None, out)
    finally:
        Image.core.set_block_size(previous)


def test_other_modes_are_left_to_pillow():
    out = np.zeros((3, 8, 8), np.uint8)
    for mode in ("RGBA", "L", "CMYK", "I;16"):
        assert not fastresize.resize_chw(Image.new(mode, (16, 16)), 8, (0, 0, 16, 16), None, out), mode


def _photo(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 // max(width, 1)), (y * 255 // max(height, 1)), ((x + y) * 3) % 256], -1)
    noise = rng.integers(0, 40, (height, width, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def _encoded(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _with_orientation(image: Image.Image, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _encoded(image, "JPEG", quality=90, exif=exif.tobytes())


CASES = {
    "jpeg 640x480": _encoded(_photo(640, 480, 1), "JPEG", quality=85),
    "jpeg 480x640": _encoded(_photo(480, 640, 2), "JPEG", quality=85),
    "jpeg 1920x1080": _encoded(_photo(1920, 1080, 3), "JPEG", quality=80),
    "jpeg 3000x200": _encoded(_photo(3000, 200, 4), "JPEG", quality=80),
    "jpeg 1x1": _encoded(_photo(1, 1, 5), "JPEG"),
    "jpeg 100x60": _encoded(_photo(100, 60, 6), "JPEG"),
    "jpeg grey": _encoded(_photo(500, 400, 7).convert("L"), "JPEG"),
    "jpeg cmyk": _encoded(_photo(500, 400, 8).convert("CMYK"), "JPEG"),
    "png rgb": _encoded(_photo(333, 517, 9), "PNG"),
    "png rgba": _encoded(_photo(300, 300, 10).convert("RGBA"), "PNG"),
    "png palette": _encoded(_photo(300, 260, 11).convert("P"), "PNG"),
    **{f"jpeg orientation {n}": _with_orientation(_photo(400, 300, 12), n) for n in range(1, 9)},
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("draft", [True, False])
def test_to_chw_fast_writes_the_pillow_transforms_bytes(name, draft, monkeypatch):
    data = CASES[name]
    expected = to_chw(data, 224, draft=draft, fast=False)
    calls = []
    resample = fastresize._resample.rgbx_to_chw
    monkeypatch.setattr(fastresize._resample, "rgbx_to_chw", lambda *args: calls.append(1) or resample(*args))
    assert np.array_equal(to_chw(data, 224, draft=draft), expected)
    out = np.zeros((3, 224, 224), np.uint8)
    assert to_chw(data, 224, draft=draft, out=out) is out and np.array_equal(out, expected)
    strided = np.zeros((3, 224, 448), np.uint8)[:, :, ::2]  # not contiguous: written through a copy
    assert to_chw(data, 224, draft=draft, out=strided) is strided and np.array_equal(strided, expected)
    small = to_chw(data, 32, draft=draft)
    assert np.array_equal(small, to_chw(data, 32, draft=draft, fast=False))
    assert len(calls) == (0 if name == "png rgba" else 4)  # transparency is composited by Pillow's path


def test_a_box_that_is_not_a_number_is_refused_not_read_out_of_bounds():
    from seedance_tasks.preprocess import _resample

    image = Image.new("RGB", (40, 30))
    import pyarrow as pa

    data = pa.array(image).buffers()[-1]
    for box in [(float("nan"), 0, 40, 30), (0, 0, float("nan"), 30), (0, 0, 41, 30), (5, 0, 5, 30)]:
        with pytest.raises(ValueError, match="box"):
            _resample.rgbx_to_chw(data, 40, 30, box, 8, 8, np.zeros((3, 8, 8), np.uint8))
