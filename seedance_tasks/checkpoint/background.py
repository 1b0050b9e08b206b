"""Background saves: copy the state to host memory, hand back to the training loop, store it in a thread.

One worker thread per process runs the saves one at a time, in call order, so each delta is taken
against the save before it. At most `max_waiting` copies wait behind the running save: the next
call blocks until one starts, which bounds the memory held. A save that failed is raised by the
next `submit` or `wait_all` (and logged when it fails). At interpreter exit (the main thread
returned or raised) the queued saves run to the end before the thread pools stop taking work: a
save encodes its chunks on a pool, which refuses new work once the interpreter shuts down. A
kill -9 loses only the saves not yet committed: the store stays consistent.

The host copies of a finished save are kept (one set) and the next copy of a state with the same
layout (dtypes, shapes) is written into them: a fresh 160 MB copy faults in 40,000 new pages,
which is most of the time the loop waits. Nothing refers to a copy once its save has finished
(the store caches its own bytes), so this never changes what is stored. `wait_all` lets them go.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

log = logging.getLogger(__name__)
_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_queued: deque[Future] = deque()
_spare_lock = threading.Lock()  # not _lock: a save's done callback must never wait for submit()
_spare: list = []  # the host copies of the last finished save, for the next copy of the same layout


def _reusable(tensor) -> bool:
    import torch

    return tensor.layout == torch.strided and not tensor.is_quantized and not tensor.is_conj() and not tensor.is_neg()


def snapshot(state: Any, spare: list | None = None) -> tuple[Any, list]:
    """(a copy of `state` in host memory, same tree, that later in-place changes to `state` do not
    reach; its tensors). Written into the tensors of `spare` where their dtypes and shapes match.
    A broadcast tensor (`x.expand(...)`) is copied once per distinct element and expanded again."""
    from seedance_tasks.checkpoint.tree import flatten, unbroadcast, unflatten

    skeleton, named = flatten(state)
    given = [tensor.detach() for _name, tensor in named]
    tensors = [unbroadcast(tensor) for tensor in given]
    if spare and len(spare) == len(tensors) and all(
        old.dtype == new.dtype and old.shape == new.shape and _reusable(new) for old, new in zip(spare, tensors, strict=True)
    ):
        copies = [old.copy_(new) for old, new in zip(spare, tensors, strict=True)]
    else:
        copies = [tensor.to("cpu", copy=True) for tensor in tensors]
    restored = [copy if compact is tensor else copy.expand(tensor.shape)
                for copy, compact, tensor in zip(copies, tensors, given, strict=True)]
    return unflatten(skeleton, restored), copies


def _keep_spare(copies: list) -> Callable[[Future], None]:
    def keep(_future: Future) -> None:
        with _spare_lock:
            _spare[:] = copies

    return keep


def _raise_failed() -> None:
    """Forget finished saves; raise the error of the first one that failed."""
    failed = None
    while _queued and _queued[0].done():
        future = _queued.popleft()
        if failed is None and future.exception() is not None:
            failed = future.exception()
    if failed is not None:
        raise failed


def _log_failure(label: str) -> Callable[[Future], None]:
    def report(future: Future) -> None:
        if future.exception() is not None:
            log.error("background save of %s failed: %s", label, future.exception())

    return report


def submit(state: Any, save: Callable[[Any], dict], label: str, max_waiting: int = 1) -> Future:
    """Copy `state`, then run `save(copy)` on the save thread; returns its Future (the summary).

    Blocks while `max_waiting` saves already wait behind the running one. Raises the error of an
    earlier background save that failed, before copying anything.
    """
    global _executor
    with _lock:
        _raise_failed()
        while sum(not future.done() for future in _queued) > max_waiting:
            wait([future for future in _queued if not future.done()], return_when=FIRST_COMPLETED)
            _raise_failed()
        with _spare_lock:
            spare, _spare[:] = list(_spare), []
        copy, copies = snapshot(state, spare)
        del spare
        if _executor is None:
            _executor = ThreadPoolExecutor(1, thread_name_prefix="seedance-save")
        future = _executor.submit(save, copy)
        future.add_done_callback(_log_failure(label))
        future.add_done_callback(_keep_spare(copies))
        _queued.append(future)
        return future


def wait_all() -> None:
    """Wait until every background save has finished (and free the kept host copies); raise the
    error of the first that failed."""
    with _lock:
        wait(list(_queued))
        with _spare_lock:
            _spare.clear()
        _raise_failed()


def _finish_at_exit() -> None:
    """Let the queued saves finish (their errors are logged, not raised: the process is ending)."""
    wait(list(_queued))


# threading's exit hooks run in reverse order of registration, and concurrent.futures registered
# the one that stops every pool when it was imported (above): this one runs before it
threading._register_atexit(_finish_at_exit)

