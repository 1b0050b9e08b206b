"""Member checks shared by `shards build` and `shards verify`: sizes, and images that must decode.

A corrupt JPEG packed into a shard passes every tar-level check and then breaks the first reader
(webdataset's `decode("pil")`, wids) at that sample, mid-epoch. With `check_decode`, every member
whose extension is an image format is opened and fully decoded with PIL, as those readers will.
Bounded: an image above `imagedata.MAX_PIXELS` (where PIL refuses to decode and the preprocessing
transform fails) is refused from its header, before decoding; below it, both decode it, so it
passes. A PNG whose data lacks rows its header declares (PIL would fill them with black) is
refused too.
"""

from __future__ import annotations

import io
from collections.abc import Callable

from seedance_tasks.shards.imagedata import MAX_PIXELS, png_shortfall

IMAGE_EXTENSIONS = frozenset(
    {"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff", "ppm", "pgm", "pbm", "pnm", "jp2", "jfif"}
)


def is_image(ext: str) -> bool:
    """True if a member with extension `ext` (`jpg`, `seg.png`...: the last part counts) is an image."""
    return ext.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS


def image_problem(data: bytes) -> str | None:
    """Why `data` does not decode as an image (as a WebDataset reader decodes it), or None."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > MAX_PIXELS:  # whatever this process set Image.MAX_IMAGE_PIXELS to
                return (f"{width}x{height} pixels is above the limit of {MAX_PIXELS:,} (PIL's own refusal "
                        "threshold: a decompression bomb?)")
            image.load()
            short = png_shortfall(data) if image.format == "PNG" else None
        if short is not None:  # PIL leaves the rows its data lacks black; readers would too
            return f"does not decode as an image ({short})"
    except Image.UnidentifiedImageError:
        return "does not decode as an image (not a format the decoder recognises)"
    except Exception as exc:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError, struct.error...
        return f"does not decode as an image ({type(exc).__name__}: {exc})"
    return None


def size_problem(name: str, size: int, max_member_size: int | None) -> str | None:
    """`NAME: why` if a member of `size` bytes is above `max_member_size` (None: no limit), else None."""
    if max_member_size is not None and size > max_member_size:
        return f"{name}: {size:,} bytes, above shards.max_member_size ({max_member_size:,})"
    return None


def member_problems(key: str, members: dict[str, bytes], *, check_decode: bool,
                    max_member_size: int | None) -> list[str]:
    """One message per bad member of a sample (`KEY.ext: why`): too large, or an image that does not decode."""
    problems = []
    for ext in sorted(members):
        data = members[ext]
        size = sum(len(piece) for piece in data) if isinstance(data, tuple) else len(data)
        if (too_large := size_problem(f"{key}.{ext}", size, max_member_size)) is not None:
            problems.append(too_large)
        elif check_decode and is_image(ext):
            problem = image_problem(data if isinstance(data, bytes) else b"".join(data))
            if problem:
                problems.append(f"{key}.{ext}: {problem}")
    return problems


def sample_checker(*, check_decode: bool, max_member_size: int | None) -> Callable[[str, dict], str | None] | None:
    """A `check(key, members) -> reason | None` for `iter_source_samples`, or None if nothing is checked."""
    if not check_decode and max_member_size is None:
        return None

    def check(key: str, members: dict) -> str | None:
        problems = member_problems(key, members, check_decode=check_decode, max_member_size=max_member_size)
        return "; ".join(problems) if problems else None

    return check
