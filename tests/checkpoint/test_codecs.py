"""Each chunk codec round-trips every element width; damaged payloads are refused."""

from __future__ import annotations

import numpy as np
import pytest

from seedance_tasks.checkpoint import codecs


@pytest.mark.parametrize("width", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("codec", codecs.ALL_CODECS)
def test_codec_roundtrip(codec, width):
    rng = np.random.default_rng(width)
    base = rng.integers(0, 256, 4096 * width, dtype=np.uint8)
    current = base.copy()
    current[::7] ^= rng.integers(0, 4, current[::7].size, dtype=np.uint8)  # a nearby "next checkpoint"
    planes = 1 if width == 1 else width
    for mask in ("z" * planes, "r" * planes):
        payload = codecs.encode(codec, current, width, 1, base, mask)
        blob = payload if isinstance(payload, bytes) else b"".join(bytes(memoryview(p)) for p in payload)
        assert codecs.payload_size(payload) == len(blob)
        out = np.empty_like(current)
        codecs.decode(codec, blob, current.size, width, out, base)
        assert np.array_equal(out, current), (codec, width, mask)
        if codec in codecs.GROUPED_CODECS:
            with pytest.raises(ValueError):
                codecs.decode(codec, blob[:-1], current.size, width, out, base)


def test_auto_prefers_plane_wise_deltas_unless_sub_is_clearly_smaller():
    rng = np.random.default_rng(0)
    weights = rng.normal(0, 0.02, 200_000).astype(np.float32)
    moved = (weights + rng.normal(0, 1e-5, weights.size).astype(np.float32)).view(np.uint8)
    codec, mask = codecs.choose(moved, 4, 1, weights.view(np.uint8), 0.02)
    assert codec in codecs.DELTA_CODECS and len(mask) == 4 and set(mask) <= {"z", "r"}
    unrelated = rng.normal(0, 0.02, 200_000).astype(np.float32).view(np.uint8)
    assert codecs.choose(unrelated, 4, 1, weights.view(np.uint8), 0.02)[0] == "bgzstd"
