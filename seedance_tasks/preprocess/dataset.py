"""The preprocessing pipeline as an iterable dataset for training code.

    from seedance_tasks.preprocess import ShardDataset
    for sample in ShardDataset("s3://bucket/shards/", size=224):
        sample["image"]   # numpy uint8 (3, 224, 224)
        sample["cls"]     # other members decoded: cls/id/index -> int, json -> object, txt -> str, else bytes

`ShardDataset` subclasses `torch.utils.data.IterableDataset`, so it goes straight into a
`DataLoader(dataset, batch_size=..., num_workers=0)`: it runs its own I/O threads and CPU
processes, so DataLoader workers add nothing. Under torchrun each rank reads its own slice of the
shards (rank/world size from the arguments, else from `torch.distributed` when initialised).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from seedance_tasks.preprocess.pipeline import Pipeline, Processed, available_cores
from seedance_tasks.shards.index import ShardRef, resolve_shards

log = logging.getLogger(__name__)

_INT_MEMBERS = ("cls", "cls2", "id", "index", "label")
_TEXT_MEMBERS = ("txt", "text", "caption")


def decode_member(ext: str, data: bytes) -> Any:
    """A member's bytes as a Python value: cls/id/index/label -> int, json -> object, txt -> str, else bytes."""
    last = ext.lower().rsplit(".", 1)[-1]
    try:
        if last in _INT_MEMBERS:
            return int(data.decode().strip())
        if last == "json":
            return json.loads(data)
        if last in _TEXT_MEMBERS:
            return data.decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return data
    return data


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # pragma: no cover - torch always has it
        pass
    return 0, 1


class ShardDataset(IterableDataset):
    """Decoded, resized samples from WebDataset shards (a directory, index, tar, brace pattern; local or s3://).

    Each iteration yields every sample of this rank's shards once, as a dict: `__key__`,
    `__shard__` (the shard's URI), `image` (numpy uint8, shape (3, size, size)) and the sample's
    other members decoded by `decode_member`. A sample whose image fails to decode is skipped,
    logged, and counted in `failed` (a list of {shard, key, reason}); a hostile or truncated tar
    raises. With `shuffle`, the shard order changes every epoch (`set_epoch`), seeded by `seed`.
    Shards are dealt round-robin to ranks, then to DataLoader workers if any.
    """

    def __init__(
        self,
        shards: str,
        *,
        size: int = 224,
        io_workers: int | None = None,
        cpu_workers: int | None = None,
        batch_size: int = 32,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        draft: bool = True,
    ):
        super().__init__()
        self.source = shards
        self.shard_set = resolve_shards(shards)
        self.size = size
        self.io_workers = io_workers
        self.cpu_workers = cpu_workers
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.draft = draft
        self.epoch = 0
        self.failed: list[dict[str, str]] = []

    def set_epoch(self, epoch: int) -> None:
        """Use the shard order of `epoch` (with `shuffle`)."""
        self.epoch = epoch

    def shards_for_this_reader(self) -> list[ShardRef]:
        """The shards this rank (and DataLoader worker, if any) reads this epoch."""
        shards = list(self.shard_set.shards)
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(shards)
        shards = shards[self.rank :: self.world_size]
        worker = get_worker_info()
        if worker is not None:
            shards = shards[worker.id :: worker.num_workers]
        return shards

    def __len__(self) -> int:
        """Samples this rank reads per epoch, from the index; TypeError if there is no index."""
        shards = list(self.shard_set.shards)[self.rank :: self.world_size]
        if any(shard.nsamples is None for shard in shards):
            raise TypeError(f"{self.source} has no index with sample counts; its length is unknown")
        return sum(shard.nsamples for shard in shards)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        shards = self.shards_for_this_reader()
        if not shards:
            return
        cpu = self.cpu_workers or available_cores()
        pipeline = Pipeline(shards, size=self.size, io_workers=self.io_workers or min(2, len(shards)),
                            cpu_workers=cpu, batch_size=self.batch_size, draft=self.draft)
        for item in pipeline:
            if not isinstance(item, Processed):
                continue
            shard = shards[item.shard].uri
            if item.error is not None:
                self.failed.append({"shard": shard, "key": item.key, "reason": item.error})
                log.warning("skipped sample %s of %s: %s", item.key, shard, item.error)
                continue
            sample = {"__key__": item.key, "__shard__": shard,
                      "image": np.frombuffer(bytearray(item.array), dtype=np.uint8).reshape(3, self.size, self.size)}
            for ext, data in item.members.items():
                sample[ext] = decode_member(ext, data)
            yield sample


def iter_samples(shards: str, *, size: int = 224, **options: Any) -> Iterator[dict[str, Any]]:
    """Every decoded sample of `shards` (see `ShardDataset` for the fields and options)."""
    yield from ShardDataset(shards, size=size, **options)
