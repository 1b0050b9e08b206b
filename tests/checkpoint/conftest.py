"""Real checkpoints for the checkpoint tests: a tiny GPT trained with AdamW on CPU.

Training gives different float results on different CPUs (and thread counts), and the codec
choices of `auto` follow the compressed sizes of those floats. Tests that assert which checkpoints
are deltas, on which base, use `drifting_states`: the trained state, then states that moved from
it by bit operations only, so that a delta always pays by far, on any machine.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_save_cache():
    """Every checkpoint test starts and ends with an empty save cache (no base carried between tests)."""
    from seedance_tasks.checkpoint import store

    store._CACHE.clear()
    yield
    store._CACHE.clear()


def torch_roundtrip(state):
    """What torch.save then torch.load(weights_only=True) gives back: the reference restores are held to."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def tiny_gpt_states(steps=(0, 10, 20, 30), seed: int = 0):
    """[(step, state)] of a 2-layer transformer LM trained with AdamW; each state is a deep copy."""
    from seedance_tasks.checkpoint.sample import train_tiny_gpt

    return list(train_tiny_gpt(steps, seed=seed))


def drift(state, step: int):
    """A copy of `state` as if trained on to `step`, the same on every machine.

    Every float32 tensor of two or more elements gets a new lowest mantissa byte (from a generator
    seeded by `step`): each element moves by a few ulps, the other three byte planes stay, so an XOR
    delta against any state drifted from the same one stores about a quarter of a full copy.
    Counters (one-element tensors, the `step` scalar) become `step`. Bit operations only: no float
    arithmetic whose rounding could differ between CPUs.
    """
    import copy

    import numpy as np
    import torch

    rng = np.random.default_rng(step)

    def move(value):
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
            if value.numel() == 1:
                return torch.full_like(value, float(step))
            low = torch.from_numpy(rng.integers(0, 256, value.numel(), dtype=np.int32)).reshape(value.shape)
            return ((value.view(torch.int32) & -256) | low).view(torch.float32)
        if isinstance(value, dict):
            moved = copy.copy(value)  # keeps the class (OrderedDict) and its _metadata
            for key in moved:
                moved[key] = move(moved[key])
            return moved
        if isinstance(value, list | tuple):
            return type(value)(move(item) for item in value)
        return value

    moved = move(state)
    moved["step"] = step
    return moved


def drifting_states(steps=(0, 10, 20, 30), seed: int = 0):
    """[(step, state)]: the tiny GPT's state after one AdamW step, then `drift` of it to each later step."""
    (_, first), = tiny_gpt_states(steps=(0,), seed=seed)
    return [(step, first if i == 0 else drift(first, step)) for i, step in enumerate(steps)]


def first_data_file(store, run: str, step: int) -> str:
    """The name of the first data file of `run`/`step` (names carry the save's attempt token)."""
    from seedance_tasks import storage
    from seedance_tasks.checkpoint.store import read_manifest

    return sorted(read_manifest(storage.resolve(str(store)), run, step)["files"])[0]


@pytest.fixture(scope="session")
def gpt_states():
    return tiny_gpt_states()


@pytest.fixture(scope="session")
def drifting():
    return drifting_states()


def assert_same(a, b, where="state"):
    """Bit-exact equality of two trees as `torch.load` gives them back: the same container classes
    (dict vs OrderedDict) and `_metadata`, keys in the same order, the same dtype/shape/bytes of every
    tensor, and for a quantized tensor the same integer values and quantizer."""
    import torch

    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if a.is_quantized:
            assert a.qscheme() == b.qscheme(), f"{where}: {a.qscheme()} vs {b.qscheme()}"
            if a.qscheme() == torch.per_tensor_affine:
                assert (a.q_scale(), a.q_zero_point()) == (b.q_scale(), b.q_zero_point()), f"{where}: quantizer"
            else:
                assert a.q_per_channel_axis() == b.q_per_channel_axis(), f"{where}: axis"
                assert_same(a.q_per_channel_scales(), b.q_per_channel_scales(), f"{where}:scales")
                assert_same(a.q_per_channel_zero_points(), b.q_per_channel_zero_points(), f"{where}:zero_points")
            a, b = a.int_repr(), b.int_repr()
        a, b = (t.clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8) for t in (a, b))
        assert torch.equal(a, b), f"{where}: bytes differ"
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), f"{where}: keys {list(a)} vs {list(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
        assert_same(getattr(a, "_metadata", None), getattr(b, "_metadata", None), f"{where}._metadata")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}/{i}")
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"
