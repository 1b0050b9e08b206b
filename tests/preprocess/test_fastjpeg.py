"""`fastjpeg`: full-size RGB JPEGs decoded by libjpeg-turbo through simplejpeg give exactly what
Pillow's decode gives, through the whole transform; whatever it declines (truncated or corrupt
data, other modes, draft-scaled decodes, reduced resizes) Pillow decodes, with Pillow's verdict."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from seedance_tasks.preprocess import fastjpeg
from seedance_tasks.preprocess.transform import to_chw

SIZE = 224


def _photo(width: int, height: int, seed: int) -> Image.Image:
    """Smooth gradients with noise and sharp edges: what stresses the IDCT and the chroma upsampling."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x + y) % 256], axis=-1)
    noisy = base + rng.normal(0, 25, base.shape)
    noisy[height // 3: height // 2, :] = rng.integers(0, 256, 3)  # a flat band with hard edges
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


def _jpeg(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", **options)
    return buffer.getvalue()


@pytest.fixture
def decoded(monkeypatch):
    """Counts the images fastjpeg decoded (not declined)."""
    calls = {"decoded": 0, "declined": 0}
    real = fastjpeg.decode_rgbx

    def counting(data, width, height):
        pixels = real(data, width, height)
        calls["decoded" if pixels is not None else "declined"] += 1
        return pixels

    monkeypatch.setattr(fastjpeg, "decode_rgbx", counting)
    return calls


CASES = {
    "4:2:0": ((640, 480), {"quality": 90, "subsampling": 2}),
    "4:2:2": ((641, 479), {"quality": 75, "subsampling": 1}),
    "4:4:4": ((480, 640), {"quality": 100, "subsampling": 0}),
    "progressive": ((500, 333), {"quality": 85, "progressive": True}),
    "restart markers": ((400, 300), {"quality": 80, "restart_marker_blocks": 3}),
    "optimized huffman, low quality": ((300, 447), {"quality": 20, "optimize": True}),
    "smaller than the target": ((97, 131), {"quality": 90}),
    "one pixel": ((1, 1), {"quality": 90}),
    "extreme aspect": ((2000, 30), {"quality": 90}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fast_decode_gives_pillows_bytes(case, decoded):
    (width, height), options = CASES[case]
    data = _jpeg(_photo(width, height, seed=len(case)), **options)
    expected = to_chw(data, SIZE, draft=False, fast=False)  # Pillow decodes and resizes
    got = to_chw(data, SIZE, draft=False)
    assert decoded == {"decoded": 1, "declined": 0}
    assert got.dtype == np.uint8 and got.shape == (3, SIZE, SIZE)
    assert np.array_equal(got, expected)
    out = np.full((3, SIZE, SIZE), 7, np.uint8)  # straight into a caller's buffer
    assert to_chw(data, SIZE, draft=False, out=out) is out and np.array_equal(out, expected)


def test_images_decoded_one_after_another_on_a_reused_buffer_stay_apart(decoded):
    images = [_jpeg(_photo(320 + 17 * n, 240 + 9 * n, seed=n)) for n in range(4)]
    expected = [to_chw(data, SIZE, draft=False, fast=False) for data in images]
    for _ in range(2):
        for data, want in zip(images, expected, strict=True):
            assert np.array_equal(to_chw(data, SIZE, draft=False), want)
    assert decoded["decoded"] == 8


def test_exif_orientation_is_applied_after_a_fast_decode(decoded):
    exif = Image.Exif()
    exif[0x0112] = 6
    data = _jpeg(_photo(400, 300, seed=3), exif=exif.tobytes())
    assert np.array_equal(to_chw(data, SIZE, draft=False), to_chw(data, SIZE, draft=False, fast=False))
    assert decoded["decoded"] == 1


def test_truncated_and_corrupt_jpegs_get_pillows_verdict(decoded):
    whole = _jpeg(_photo(320, 240, seed=5))
    with pytest.raises(OSError):  # truncated: Pillow refuses it, as without fastjpeg
        to_chw(whole[: len(whole) * 2 // 3], SIZE, draft=False)
    with pytest.raises(OSError):
        to_chw(whole[: len(whole) * 2 // 3], SIZE, draft=False, fast=False)
    # stray bytes before the scan: libjpeg warns ("3 extraneous bytes before marker 0xda"), which
    # fastjpeg takes as a refusal; Pillow decodes the image anyway, and its pixels are the result
    scan = whole.index(b"\xff\xda")
    stray = whole[:scan] + b"\x00\x11\x22" + whole[scan:]
    assert np.array_equal(to_chw(stray, SIZE, draft=False), to_chw(stray, SIZE, draft=False, fast=False))
    assert decoded == {"decoded": 0, "declined": 2}


def test_what_fastjpeg_does_not_take_is_decoded_by_pillow(decoded):
    grey = _jpeg(_photo(300, 200, seed=1).convert("L"))
    cmyk = _jpeg(_photo(300, 200, seed=2).convert("CMYK"))
    large = _jpeg(_photo(1200, 900, seed=4))  # a short side >= 2x the target: Pillow reduces first
    for data in (grey, cmyk, large):
        assert np.array_equal(to_chw(data, SIZE, draft=False), to_chw(data, SIZE, draft=False, fast=False))
    draft = to_chw(large, SIZE, draft=True)  # a DCT-scaled decode stays Pillow's
    assert np.array_equal(draft, to_chw(large, SIZE, draft=True, fast=False))
    assert decoded == {"decoded": 0, "declined": 0}


def test_a_buffer_past_the_keep_limit_is_not_kept(monkeypatch):
    monkeypatch.setattr(fastjpeg, "_local", type(fastjpeg._local)())
    monkeypatch.setattr(fastjpeg, "KEEP_BYTES", 200 * 150 * 4)
    small, big = _jpeg(_photo(200, 150, seed=1)), _jpeg(_photo(300, 200, seed=2))
    assert fastjpeg.decode_rgbx(small, 200, 150).shape == (150, 200, 4)
    kept = fastjpeg._local.buffer
    pixels = fastjpeg.decode_rgbx(big, 300, 200)
    assert pixels.shape == (200, 300, 4) and fastjpeg._local.buffer is kept  # the big one was not kept
    assert np.array_equal(pixels[..., :3], np.asarray(Image.open(io.BytesIO(big)).convert("RGB")))
    assert fastjpeg.decode_rgbx(small, 201, 150) is None  # another size than the header's: declined
