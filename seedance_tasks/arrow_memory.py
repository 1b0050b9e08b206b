"""Which memory pool pyarrow allocates from while batch-by-batch work runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa

_pool_lock = threading.Lock()
_pool_users = 0
_pool_before: pa.MemoryPool | None = None


@contextmanager
def reusing_memory() -> Iterator[None]:
    """Route pyarrow's allocations through its jemalloc pool inside the block; restored after.

    Batch-by-batch work (compaction, cost allocation) allocates and frees a batch's worth of
    buffers over and over. The default (mimalloc) pool returns freed pages to the kernel within
    milliseconds, so every batch faults in and zeroes fresh pages (a fifth of the CPU time in
    the profiles in docs/compaction.md and docs/cost.md); jemalloc keeps freed pages for reuse.
    A buffer is always freed to the pool that allocated it, so switching back is safe with
    buffers still alive. Nested and concurrent uses share one switch. Without jemalloc in this
    pyarrow build, nothing changes.
    """
    global _pool_users, _pool_before
    with _pool_lock:
        if _pool_users == 0:
            try:
                pool = pa.jemalloc_memory_pool()
            except NotImplementedError:
                pool = None
            _pool_before = pa.default_memory_pool() if pool is not None else None
            if pool is not None:
                pa.set_memory_pool(pool)
        _pool_users += 1
    try:
        yield
    finally:
        with _pool_lock:
            _pool_users -= 1
            if _pool_users == 0 and _pool_before is not None:
                pa.set_memory_pool(_pool_before)
                _pool_before = None

