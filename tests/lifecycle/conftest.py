"""Small synthetic checkpoint stores for the lifecycle tests (delta chains, metrics, tiers)."""

from __future__ import annotations

import hashlib

import pytest


def state_at(step: int, size: int = 2048):
    """A deterministic small training state for `step`: weights drift slowly, so saves delta."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    base = torch.randn(size, generator=gen)
    drift = torch.randn(size, generator=torch.Generator().manual_seed(step)) * 1e-3
    weights = base + drift * (step / 10 + 1)
    return {
        "model": {"w": weights.reshape(-1, 16), "b": torch.arange(16, dtype=torch.float32) + step},
        "optimizer": {"exp_avg_sq": (weights * weights).reshape(-1, 16), "step": torch.tensor(float(step))},
        "step": step,
    }


def digest(state) -> str:
    """sha256 over every tensor's bytes and every scalar, in tree order (bit-exact fingerprint)."""
    import torch

    h = hashlib.sha256()

    def walk(value):
        if isinstance(value, torch.Tensor):
            h.update(str((value.dtype, tuple(value.shape))).encode())
            h.update(value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            for key in value:
                h.update(repr(key).encode())
                walk(value[key])
        else:
            h.update(repr(value).encode())

    walk(state)
    return h.hexdigest()


def make_store(root, run="r", steps=range(0, 120, 10), keyframe_every=4, metrics=None, tags=None, **options):
    """Save `steps` of `run` into `root` (path or s3:// URI); returns {step: digest of the saved state}."""
    from seedance_tasks import checkpoint

    digests = {}
    for step in steps:
        state = state_at(step)
        checkpoint.save(
            state, str(root), run, step, keyframe_every=keyframe_every, cache_base=False,
            metrics=(metrics or {}).get(step, {}), tags=(tags or {}).get(step, ()), **options,
        )
        digests[step] = digest(state)
    return digests


def assert_restorable(store, run, digests):
    """Every step in `digests` restores bit-exact (sha256-verified by the store, compared here)."""
    from seedance_tasks import checkpoint

    for step, expected in digests.items():
        assert digest(checkpoint.load(str(store), run, step)) == expected, f"{run}/step-{step} differs"


@pytest.fixture
def lifecycle_settings():
    """The lifecycle settings from config (tests override fields per call)."""
    from seedance_tasks.config import load_settings

    return load_settings().lifecycle


@pytest.fixture
def trust_tiers(monkeypatch):
    """Configure tier locations through the environment: manifests may name files only under the
    configured locations, so a restore after tiering needs them in config too."""

    def _set(warm=None, cold=None):
        for tier, uri in (("WARM", warm), ("COLD", cold)):
            if uri:
                monkeypatch.setenv(f"SEEDANCE__LIFECYCLE__TIERS__{tier}__URI", str(uri))

    return _set
