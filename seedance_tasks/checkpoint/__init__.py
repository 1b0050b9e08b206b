"""Checkpoint store: delta + byte-grouped compression between consecutive checkpoints, bit-exact restore.

The Python API for training code (light to import; torch and the codecs load on first use):

    from seedance_tasks import checkpoint
    checkpoint.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                    "s3://bucket/ckpts", "run-42", step)
    checkpoint.save_async(state, "s3://bucket/ckpts", "run-42", step)  # returns once state is copied
    checkpoint.wait_for_saves()                                      # before exit, or to see errors
    state = checkpoint.load("s3://bucket/ckpts", "run-42")          # latest committed step
    checkpoint.latest_step("s3://bucket/ckpts", "run-42")           # -> int | None

Store layout and manifest format: `seedance_tasks/checkpoint/store.py`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["save", "save_async", "wait_for_saves", "load", "latest_step", "load_tensor"]


def _settings(**overrides: Any):
    """The `checkpoint:` settings with `overrides` (load_settings caches the parsed file)."""
    from seedance_tasks.config import load_settings, settings_with

    return settings_with(load_settings(), "checkpoint", **overrides)


def save(state: Any, store: str, run: str, step: int, **options: Any) -> dict:
    """Store `state` (a tree of dicts/lists/tuples of tensors and Python scalars) as `run`/`step`.

    Returns a summary: raw_bytes, stored_bytes, ratio, kind (full/delta), base, depth, mb_per_s.
    Options: codec (auto|zstd|lz4|bgzstd|delta), keyframe_every, lossy ("bf16"), metrics (dict,
    e.g. {"val_loss": 1.9}, for retention), tags, and any `checkpoint:` setting (zstd_level,
    chunk_size, workers, cache_base...). The manifest is written last: a crash leaves the whole
    checkpoint or none. The bytes of the states that later saves will delta against stay in
    memory (cache_base; at most 2 with K=8), so a save never reads the store back. Saving a
    committed step again is refused (RefusedError).
    """
    from seedance_tasks.checkpoint.store import save_state

    per_call = {key: options.pop(key) for key in ("codec", "keyframe_every", "lossy", "metrics", "tags", "source")
                if key in options}
    return save_state(state, str(store), run, step, settings=_settings(**options), **per_call)


def save_async(state: Any, store: str, run: str, step: int, **options: Any):
    """save() in the background: returns a Future (of save()'s summary) as soon as `state` is copied
    to host memory, so the training loop goes on (and may change its tensors) while the copy is
    compressed and stored. Saves run one at a time in call order; a call blocks while one copy
    already waits behind the running save. A background save that failed is raised by the next
    save_async() or wait_for_saves() call; queued saves finish before the interpreter exits.
    Options as for save(); wait_for_saves() before a plain save() of the same run.
    """
    from seedance_tasks.checkpoint import background

    return background.submit(state, lambda copy: save(copy, store, run, step, **options), f"{run}/step-{step}")


def wait_for_saves() -> None:
    """Wait for every save_async() to finish; raises the error of the first one that failed."""
    from seedance_tasks.checkpoint import background

    background.wait_all()


def load(store: str, run: str, step: int | None = None) -> Any:
    """The state saved as `run`/`step` (None: the latest committed step), bit-exact, every chunk
    verified against its digest (BLAKE3; sha256 in format-1 stores).

    Raises IntegrityError naming the tensor and file on any damage or missing base. Tensors of
    a lossy (bf16) checkpoint come back in their original dtype at bf16 precision (logged).
    """
    from seedance_tasks.checkpoint.store import load_state

    state, _manifest = load_state(str(store), run, step, workers=_settings().workers)
    return state


def load_tensor(store: str, run: str, step: int | None, name: str):
    """One tensor of a checkpoint (by its manifest name), reading only that tensor's chunks."""
    from seedance_tasks.checkpoint.store import load_tensors

    return load_tensors(str(store), run, step, [name])[name]


def latest_step(store: str, run: str) -> int | None:
    """The latest committed step of `run` in `store`, or None if it has none."""
    from seedance_tasks import storage
    from seedance_tasks.checkpoint.store import committed_steps

    steps = committed_steps(storage.resolve(str(store)), run)
    return steps[-1] if steps else None
