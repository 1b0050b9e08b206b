"""Sample data for tests, the demo and the benchmarks: photo-like JPEGs in WebDataset's file convention."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image


def photo_like(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A smooth gradient with a few blobs and a little noise: compresses like a photo, not like noise."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = rng.uniform(0, 255, size=3)
    slope = rng.uniform(-0.4, 0.4, size=(3, 2))
    image = base[:, None, None] + slope[:, 0, None, None] * x + slope[:, 1, None, None] * y
    for _ in range(4):
        cx, cy, radius = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0.05, 0.3) * min(width, height)
        mask = ((x - cx) ** 2 + (y - cy) ** 2) < radius**2
        image[:, mask] = rng.uniform(0, 255, size=(3, 1))
    image += rng.normal(0, 6, size=image.shape)
    return Image.fromarray(np.clip(image, 0, 255).astype(np.uint8).transpose(1, 2, 0))


def jpeg_bytes(image: Image.Image, quality: int = 85) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def make_sample_files(
    directory: str | Path, count: int, *, width: int = 64, height: int = 48, seed: int = 0,
    corrupt: tuple[int, ...] = (), png: tuple[int, ...] = (), classes: int = 10,
) -> list[str]:
    """Write `count` samples `sample-000000.{jpg,cls,json}` under `directory`; returns their keys.

    Samples numbered in `corrupt` get bytes that are not an image; those in `png` are PNGs.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    keys = []
    for number in range(count):
        key = f"sample-{number:06d}"
        image = photo_like(rng, width, height)
        if number in corrupt:
            (directory / f"{key}.jpg").write_bytes(b"\xff\xd8 this is not a jpeg")
        elif number in png:
            image.save(directory / f"{key}.png")
        else:
            (directory / f"{key}.jpg").write_bytes(jpeg_bytes(image))
        (directory / f"{key}.cls").write_text(str(number % classes))
        (directory / f"{key}.json").write_text(json.dumps({"number": number, "width": width, "height": height}))
        keys.append(key)
    return keys


def make_sample_parquet(path: str | Path, count: int, *, width: int = 64, height: int = 48, seed: int = 0,
                        rows_per_group: int = 16, missing_image: tuple[int, ...] = ()) -> list[str]:
    """A Parquet file with one row per sample: `__key__`, `jpg` (bytes), `cls` (int), `txt` (str)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    keys = [f"row-{number:06d}" for number in range(count)]
    images = [None if n in missing_image else jpeg_bytes(photo_like(rng, width, height)) for n in range(count)]
    table = pa.table({
        "__key__": keys,
        "jpg": pa.array(images, pa.binary()),
        "cls": pa.array([n % 10 for n in range(count)], pa.int64()),
        "txt": [f"caption {n}" for n in range(count)],
    })
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, str(path), row_group_size=rows_per_group)
    return keys
