"""Ordered, bounded parallel map: the pattern that keeps both cores busy on streams of batches."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(func: Callable[[T], R], items: Iterable[T], *, threads: int = 2, ahead: int = 4,
                name: str = "seedance") -> Iterator[R]:
    """`func(item)` for every item, yielded in input order, computed by `threads` threads.

    At most `ahead` results are in flight or waiting, so memory stays bounded whatever the length
    of `items`; `items` itself is consumed in the caller's thread (reading overlaps computing).
    Meant for work that releases the GIL (pyarrow, numpy, zstandard). An exception in `func` is
    raised here, at its item's turn; the rest are cancelled.
    """
    pending: deque[Future] = deque()
    with ThreadPoolExecutor(threads, thread_name_prefix=name) as pool:
        try:
            for item in items:
                pending.append(pool.submit(func, item))
                if len(pending) >= ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
