"""Real checkpoints for the checkpoint tests: a tiny GPT trained with AdamW on CPU."""

from __future__ import annotations

import pytest


def tiny_gpt_states(steps=(0, 10, 20, 30), seed: int = 0):
    """[(step, state)] of a 2-layer transformer LM trained with AdamW; each state is a deep copy."""
    from seedance_tasks.checkpoint.sample import train_tiny_gpt

    return list(train_tiny_gpt(steps, seed=seed))


@pytest.fixture(scope="session")
def gpt_states():
    return tiny_gpt_states()


def assert_same(a, b, where="state"):
    """Bit-exact equality of two trees: same types, same keys, same dtype/shape/bytes of every tensor."""
    import torch

    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), f"{where}: bytes differ"
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), f"{where}: keys {list(a)} vs {list(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}/{i}")
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"
