"""Codec choices remembered between saves of a run, so that `auto` samples a tensor only now and then.

Choosing a codec (`codecs.choose`) compresses samples of the tensor under every candidate: about
a sixth of a save's CPU time on the bench checkpoints. Consecutive checkpoints of a training run
change slowly, so the choice made for a tensor at one save is, as a rule, the right one at the
next. A choice is remembered per (store, run, tensor name, stored dtype, shape, with or without
a delta base) - a keyframe's choice is never reused for a delta or the other way round - and is
reused for `resample_every` saves in all (the sampled one included), then sampled again. It is
also sampled again at the next save when the ratio a reused choice achieved drifted below
(1 - `resample_drift`) times the ratio it achieved when sampled: the data changed character.

Reuse never changes what a restore gives back (every codec is lossless); it only affects the
ratio, and only until the next sample. The memory is per process, like the base cache.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

_lock = threading.Lock()
_memory: dict[tuple[str, str], dict[tuple, Choice]] = {}


@dataclass(frozen=True)
class Choice:
    """A tensor's codec and plane mask, the ratio it gave when sampled, and how many saves used it."""

    codec: str
    mask: str
    ratio: float
    uses: int


def key(name: str, stored_dtype: str, shape: list[int], with_base: bool) -> tuple:
    """The key a tensor's choice is remembered under (within one store and run)."""
    return (name, stored_dtype, tuple(shape), with_base)


def recall(store_uri: str, run: str, tensor_key: tuple, resample_every: int) -> Choice | None:
    """The remembered choice for `tensor_key` if it may be reused at this save, else None (sample).

    Never reuses when `resample_every` <= 1 (sample at every save)."""
    if resample_every <= 1:
        return None
    with _lock:
        found = _memory.get((store_uri, run), {}).get(tensor_key)
    if found is None or found.uses >= resample_every:
        return None
    return found


def remember(store_uri: str, run: str, tensor_key: tuple, codec: str, mask: str, ratio: float,
             reused: Choice | None, drift: float) -> None:
    """Record the outcome of this save for one tensor: a fresh sample (`reused` None) starts a new
    count; a reused choice counts one more use, or is marked for a re-sample if its `ratio` drifted
    below (1 - `drift`) times the sampled one."""
    if reused is None:
        choice = Choice(codec, mask, ratio, 1)
    elif ratio < (1 - drift) * reused.ratio:
        choice = Choice(codec, mask, reused.ratio, 1 << 30)  # sample again at the next save
    else:
        choice = Choice(codec, mask, reused.ratio, reused.uses + 1)
    with _lock:
        _memory.setdefault((store_uri, run), {})[tensor_key] = choice


def forget(store_uri: str | None = None, run: str | None = None) -> None:
    """Drop the remembered choices of one run (or all)."""
    with _lock:
        if store_uri is None:
            _memory.clear()
        else:
            _memory.pop((store_uri, run), None)
