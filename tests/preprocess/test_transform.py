"""What `transform.to_chw` makes of real image bytes: EXIF orientation, transparency, 16-bit grey,
truncated images and decompression bombs (whatever the process set PIL's globals to), formats by
content; and that a failed image comes out of a run as that sample's failure, the rest written."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile, ImageOps

from seedance_tasks.preprocess.pipeline import WORKER_DIED
from seedance_tasks.preprocess.transform import ALPHA_BACKGROUND, process_batch, to_chw

from .conftest import run_crashing, write_shard

SIZE = 32
REPO = Path(__file__).resolve().parents[2]
QUADRANTS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]  # top-left, top-right, bottom-left, bottom-right
# the EXIF orientation: the transposition that turns the stored pixels upright, and its inverse
UPRIGHT = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
           5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
           8: Image.Transpose.ROTATE_90}
STORED = {**UPRIGHT, 6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270}


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def quadrant_colours(array: np.ndarray) -> list[tuple[int, ...]]:
    half = array.shape[1] // 2
    corners = [array[:, :half - 2, :half - 2], array[:, :half - 2, half + 2:], array[:, half + 2:, :half - 2],
               array[:, half + 2:, half + 2:]]
    return [tuple(int(round(channel.mean())) for channel in corner) for corner in corners]


def close(found, expected, tolerance=12) -> bool:
    return all(abs(a - b) <= tolerance for colour, want in zip(found, expected, strict=True)
               for a, b in zip(colour, want, strict=True))


def upright_picture(width: int = 160, height: int = 96) -> Image.Image:
    """Four coloured quadrants: every one of the 8 orientations puts them in a different order."""
    image = Image.new("RGB", (width, height))
    for number, colour in enumerate(QUADRANTS):
        left, top = (number % 2) * width // 2, (number // 2) * height // 2
        image.paste(colour, (left, top, left + width // 2, top + height // 2))
    return image


@pytest.mark.parametrize("draft", [True, False])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_exif_orientation_is_applied_so_a_phone_photo_comes_out_upright(orientation, draft):
    upright = upright_picture(640, 384)  # large enough for draft to decode at reduced size
    stored = upright if orientation == 1 else upright.transpose(STORED[orientation])
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(stored, "JPEG", quality=95, exif=exif.tobytes())
    assert ImageOps.exif_transpose(Image.open(io.BytesIO(data))).size == upright.size  # (the test's own check)
    assert close(quadrant_colours(to_chw(data, SIZE, draft=draft)), QUADRANTS)
    png = encode(stored, "PNG", exif=exif.tobytes())  # a PNG's eXIf chunk counts too
    assert close(quadrant_colours(to_chw(png, SIZE, draft=draft)), QUADRANTS, tolerance=1)


def test_a_malformed_exif_block_is_ignored():
    data = encode(upright_picture(), "JPEG", quality=95, exif=b"Exif\x00\x00MM\x00\x2a" + b"\xff" * 20)
    assert close(quadrant_colours(to_chw(data, SIZE)), QUADRANTS)


def transparent_images() -> dict[str, bytes]:
    """Left half opaque red (or grey 77), right half fully transparent over a colour that must not show."""
    rgba = Image.new("RGBA", (64, 32), (0, 255, 0, 0))
    rgba.paste((255, 0, 0, 255), (0, 0, 32, 32))
    la = Image.new("LA", (64, 32), (10, 0))
    la.paste((77, 255), (0, 0, 32, 32))
    palette = Image.new("P", (64, 32), 1)
    palette.putpalette([255, 0, 0, 0, 255, 0] + [0] * 762)
    palette.paste(0, (0, 0, 32, 32))
    grey = Image.new("L", (64, 32), 10)
    grey.paste(77, (0, 0, 32, 32))
    rgb = Image.new("RGB", (64, 32), (0, 255, 0))
    rgb.paste((255, 0, 0), (0, 0, 32, 32))
    return {"RGBA": encode(rgba, "PNG"), "LA": encode(la, "PNG"), "P+tRNS": encode(palette, "PNG", transparency=1),
            "L+tRNS": encode(grey, "PNG", transparency=10), "RGB+tRNS": encode(rgb, "PNG", transparency=(0, 255, 0))}


@pytest.mark.parametrize("draft", [True, False])
@pytest.mark.parametrize("kind", ["RGBA", "LA", "P+tRNS", "L+tRNS", "RGB+tRNS"])
def test_transparency_is_composited_over_the_fixed_background(kind, draft):
    array = to_chw(transparent_images()[kind], SIZE, draft=draft)
    opaque = (77, 77, 77) if kind in ("LA", "L+tRNS") else (255, 0, 0)
    left, right = array[:, :, : SIZE // 2 - 2], array[:, :, SIZE // 2 + 2:]
    assert close([tuple(int(c.mean()) for c in left), tuple(int(c.mean()) for c in right)],
                 [opaque, ALPHA_BACKGROUND], tolerance=1)


def test_a_16_bit_grey_png_keeps_its_tones():
    levels = np.linspace(0, 65535, 64 * 64).reshape(64, 64).astype(np.uint16)
    array = to_chw(encode(Image.fromarray(levels), "PNG"), SIZE)
    assert (array[0] == array[1]).all() and (array[1] == array[2]).all()
    assert array.min() < 10 and array.max() > 245 and 100 < array.mean() < 156  # not clipped to white


@pytest.mark.parametrize("draft", [True, False])
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_a_truncated_image_fails_even_if_the_process_loads_truncated_images(monkeypatch, fmt, draft):
    noise = Image.effect_noise((256, 256), 60).convert("RGB")
    data = encode(noise, fmt)
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(OSError, match="truncated"):
        to_chw(data[: len(data) * 2 // 3], SIZE, draft=draft)
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True  # the process's setting is left as it was
    assert to_chw(data, SIZE, draft=draft).shape == (3, SIZE, SIZE)


def png_declaring(width: int, height: int) -> bytes:
    """A few hundred bytes of PNG whose header declares width x height RGB pixels."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
            + chunk(b"IEND", b""))


@pytest.mark.parametrize("draft", [True, False])
def test_a_decompression_bomb_is_refused_even_if_the_process_lifted_pils_limit(monkeypatch, draft):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    with pytest.raises(ValueError, match="50000x50000 pixels is above the limit"):
        to_chw(png_declaring(50000, 50000), SIZE, draft=draft)


def test_formats_are_told_by_content_and_each_failure_names_its_reason():
    picture = upright_picture()
    entries, _times = process_batch(
        [encode(picture, "PNG"), encode(picture, "GIF"), encode(picture, "WEBP"), encode(picture, "TIFF"),
         b"not an image", b"", encode(Image.new("RGB", (1, 1), (9, 9, 9)), "JPEG"),
         encode(Image.new("RGB", (10000, 1), (9, 9, 9)), "PNG")],
        SIZE,
    )
    assert isinstance(entries[0], bytes)  # a PNG is a PNG whatever the member is called
    assert entries[1:4] == [f"error: ValueError: not a JPEG or PNG image ({fmt})" for fmt in ("GIF", "WEBP", "TIFF")]
    assert entries[4] == "error: not a JPEG or PNG image, nor any image format PIL knows (it starts b'not an image')"
    assert entries[5] == "error: not a JPEG or PNG image, nor any image format PIL knows (empty (0 bytes))"
    assert all(isinstance(entry, bytes) and len(entry) == 3 * SIZE * SIZE for entry in entries[6:])  # 1x1, 10000x1


SCRIPT = """
from PIL import Image, ImageFile

ImageFile.LOAD_TRUNCATED_IMAGES = True  # what many training scripts do at the top; the pool's workers import it
Image.MAX_IMAGE_PIXELS = None

if __name__ == "__main__":
    import json, sys
    from seedance_tasks.preprocess.run import run
    from seedance_tasks.preprocess.settings import PreprocessSettings

    result = run(sys.argv[1], sys.argv[2], settings=PreprocessSettings(size=32, io_workers=1, cpu_workers=2,
                                                                         batch_size=2, draft={draft}))
    print(json.dumps({{"out": result["samples_out"], "failed": result["failed"]}}))
"""


@pytest.mark.parametrize("draft", [True, False])
def test_bad_images_fail_as_their_samples_in_the_pool_workers_of_a_lenient_script(tmp_path, draft):
    """The pool's workers run the caller's main module: its PIL settings must not let a truncated
    image through half grey, nor a bomb be decoded. Each bad image is its sample's failure, with
    the key and the reason; the rest of the shard is written."""
    good = encode(upright_picture(), "JPEG")
    truncated = encode(Image.effect_noise((256, 256), 60).convert("RGB"), "JPEG")
    members = [("a.jpg", good), ("b.jpg", truncated[: len(truncated) // 2]), ("c.jpg", png_declaring(50000, 50000)),
               ("d.jpg", encode(upright_picture(), "PNG")), ("e.jpg", encode(upright_picture(), "GIF")),
               ("f.webp", encode(upright_picture(), "WEBP"))]
    shards = tmp_path / "shards"
    write_shard(shards / "shard-000000.tar", members)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(draft=draft)))
    done = subprocess.run([sys.executable, str(script), str(shards), str(tmp_path / "out")], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    reasons = {failure["key"]: failure["reason"] for failure in result["failed"]}
    assert result["out"] == 2 and set(reasons) == {"b", "c", "e", "f"}
    assert reasons["b"].startswith("b.jpg: OSError: image file is truncated")
    assert reasons["c"].startswith("c.jpg: ") and "50000x50000 pixels" in reasons["c"]
    assert reasons["e"] == "e.jpg: ValueError: not a JPEG or PNG image (GIF)"
    assert reasons["f"] == "no JPEG/PNG member (members: webp)"


def test_an_image_that_kills_its_worker_fails_alone_and_the_run_goes_on(tmp_path):
    good = encode(upright_picture(), "JPEG")
    members = [(f"k{number}.jpg", b"KILLS ITS WORKER" if number in (4, 9) else good) for number in range(12)]
    shards = tmp_path / "shards"
    write_shard(shards / "shard-000000.tar", members)
    result = run_crashing(tmp_path, shards, tmp_path / "out", size=32, io_workers=1, cpu_workers=2, batch_size=3)
    assert result["out"] == 10 and result["parallel"] == "samples"  # one shard: sample batches
    assert {failure["key"]: failure["reason"] for failure in result["failed"]} == {
        key: f"{key}.jpg: {WORKER_DIED.removeprefix('error: ')}" for key in ("k4", "k9")}
