"""The C extension `_planes` gives byte for byte what the numpy code in codecs.py gives, and refuses
buffers that do not fit, so the two paths of a save and a restore are interchangeable."""

from __future__ import annotations

import numpy as np
import pytest

from seedance_tasks.checkpoint import codecs

WIDTHS = [1, 2, 3, 4, 8, 16]


@pytest.fixture
def numpy_only(monkeypatch):
    """Runs codecs without the extension (its numpy fallback)."""
    monkeypatch.setattr(codecs, "_planes", None)


def test_the_extension_is_built():
    assert codecs._planes is not None, "seedance_tasks/checkpoint/_planes.c is not built: run `make venv` (needs gcc)"


def _chunk(rng, width: int, elements: int) -> np.ndarray:
    return rng.integers(0, 256, width * elements, dtype=np.uint8)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("elements", [1, 7, 16_384, 16_385, 50_001])  # around the C code's block of 16,384
def test_group_and_ungroup_match_numpy(width, elements, monkeypatch):
    rng = np.random.default_rng(width * 100_003 + elements)
    raw = _chunk(rng, width, elements)
    native = codecs.group(raw, width)
    native_out = np.empty_like(raw)
    codecs.ungroup(list(native), width, native_out)
    monkeypatch.setattr(codecs, "_planes", None)
    expected = codecs.group(raw, width)
    assert np.array_equal(native, expected)
    assert np.array_equal(native_out, raw)
    if width > 1:  # plane k is byte k of every element
        assert np.array_equal(expected[width - 1], raw[width - 1 :: width])


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("codec", codecs.PLANE_DELTAS)
def test_a_delta_is_grouped_in_the_same_pass(width, codec, monkeypatch):
    rng = np.random.default_rng(width)
    base = _chunk(rng, width, 20_000)
    current = base ^ (rng.random(base.size) < 0.1).astype(np.uint8)
    native = codecs._delta_planes(codec, current, base, width)
    monkeypatch.setattr(codecs, "_planes", None)
    assert np.array_equal(np.asarray(native), np.asarray(codecs._delta_planes(codec, current, base, width)))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("ops", ["", "x", "a", "xa", "ax", "xxaxa"])
def test_a_chain_merges_to_the_bytes_of_its_top(width, ops, monkeypatch):
    """Each level is a real delta of the next checkpoint against the one below, as a save makes them."""
    rng = np.random.default_rng(len(ops) * 31 + width)
    checkpoints = [_chunk(rng, width, 30_000)]
    for _ in ops:
        moved = checkpoints[-1].copy()
        moved[rng.random(moved.size) < 0.2] += 1
        checkpoints.append(moved)
    levels = [codecs.group(checkpoints[0], width)]
    for below, above, op in zip(checkpoints[:-1], checkpoints[1:], ops, strict=True):
        codec = "delta-xor" if op == "x" else "delta-bsub"
        levels.append(codecs._delta_planes(codec, above, below, width))
    chain = codecs.PlaneChain((levels[0],))
    for level, op in zip(levels[1:], ops, strict=True):
        chain = chain.then("delta-xor" if op == "x" else "delta-bsub", level)
    assert np.array_equal(chain.flat(width), checkpoints[-1])
    monkeypatch.setattr(codecs, "_planes", None)
    assert np.array_equal(chain.flat(width), checkpoints[-1])


def test_a_chain_deeper_than_the_extension_takes_is_folded_first():
    rng = np.random.default_rng(5)
    top = _chunk(rng, 4, 5_000)
    flips = [_chunk(rng, 4, 5_000) for _ in range(codecs.NATIVE_LEVELS + 9)]
    bottom = top.copy()
    for flip in flips:
        bottom ^= flip
    chain = codecs.PlaneChain((codecs.group(bottom, 4),))
    for flip in flips:
        chain = chain.then("delta-xor", codecs.group(flip, 4))
    assert len(chain.levels) > codecs.NATIVE_LEVELS
    assert np.array_equal(chain.flat(4), top)


def test_planes_are_only_read_so_stored_bytes_can_back_them():
    rng = np.random.default_rng(9)
    raw = _chunk(rng, 4, 4_096)
    base_planes = [np.frombuffer(bytes(plane), dtype=np.uint8) for plane in codecs.group(raw, 4)]
    delta_planes = [np.frombuffer(bytes(plane), dtype=np.uint8) for plane in codecs.group(raw, 4)]
    chain = codecs.PlaneChain((base_planes,)).then("delta-xor", delta_planes)
    assert not chain.flat(4).any()  # raw ^ raw
    assert np.array_equal(np.concatenate(base_planes), codecs.group(raw, 4).ravel())


def test_the_numpy_fallback_restores_a_delta_chain(tmp_path, numpy_only):
    import torch

    from seedance_tasks import checkpoint

    generator = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(50_000, generator=generator), "b": torch.randn(6_000, generator=generator).bfloat16()}
    uri, kinds = str(tmp_path / "store"), []
    for step in range(4):  # low bits flipped: a delta pays on any machine
        state = {k: (v.view(torch.int16 if v.dtype == torch.bfloat16 else torch.int32) ^ 1).view(v.dtype)
                 for k, v in state.items()}
        kinds.append(checkpoint.save(state, uri, "run", step, keyframe_every=4, delta_reference="previous")["kind"])
        assert all(torch.equal(checkpoint.load(uri, "run", step)[k].view(torch.uint8), state[k].view(torch.uint8))
                   for k in state)
    assert kinds == ["full", "delta", "delta", "delta"]


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.merge(np.empty(12, np.uint8), [[b"a" * 2] * 4], "", 4),  # planes too short
        lambda p: p.merge(np.empty(12, np.uint8), [[b"a" * 3] * 3], "", 4),  # too few planes
        lambda p: p.merge(np.empty(12, np.uint8), [[b"a" * 3] * 4, [b"a" * 3] * 4], "", 4),  # an op short
        lambda p: p.merge(np.empty(12, np.uint8), [[b"a" * 3] * 4, [b"a" * 3] * 4], "s", 4),  # no such op
        lambda p: p.merge(np.empty(12, np.uint8), [[b"a" * 3] * 4] * 70, "x" * 69, 4),  # too many levels
        lambda p: p.merge(np.empty(10, np.uint8), [[b"a" * 3] * 4], "", 4),  # width does not divide
        lambda p: p.split(b"abcdabcd", 4, [np.empty(2, np.uint8)] * 4, b"abcd", "x"),  # base too short
        lambda p: p.split(b"abcdabcd", 4, [np.empty(2, np.uint8)] * 4, b"abcdabcd", "q"),  # no such op
        lambda p: p.split(b"abcdabcd", 0, []),  # width 0
    ],
)
def test_buffers_that_do_not_fit_are_refused(call):
    with pytest.raises(ValueError):
        call(codecs._planes)


def test_read_only_outputs_are_refused():
    with pytest.raises((BufferError, TypeError)):
        codecs._planes.merge(b"x" * 8, [[b"ab"] * 4], "", 4)
    with pytest.raises((BufferError, TypeError)):
        codecs._planes.split(b"abcdabcd", 4, [b"ab"] * 4)
