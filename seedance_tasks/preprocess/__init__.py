"""preprocess pipeline: an I/O pool (threads) and a CPU pool (processes) over WebDataset shards.

For training code: `ShardDataset(shards_uri, size=224)` (a torch IterableDataset) and
`iter_samples(shards_uri, size=224)` yield decoded samples; see `seedance_tasks.preprocess.dataset`.
They are imported lazily, so importing this package does not import torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ShardDataset", "iter_samples"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from seedance_tasks.preprocess import dataset

        return getattr(dataset, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
