"""Settings of the preprocess pipeline (section `preprocess:` of config/seedance.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from seedance_tasks.settings_base import StrictModel


class PreprocessSettings(StrictModel):
    size: int = Field(224, ge=8, le=4096, description="output images are uint8 arrays of shape (3, size, size)")
    io_workers: int = Field(0, ge=0, description="I/O threads (fetch shards, split samples); 0 = chosen from a short measurement")
    cpu_workers: int = Field(0, ge=0, description="CPU worker processes (decode, resize, convert); 0 = one per core")
    parallel: Literal["auto", "shards", "samples"] = Field(
        "auto", description="shards: each CPU worker reads, transforms and writes whole shards (least overhead; "
        "local input and output only); samples: I/O threads feed batches of images to the CPU workers and one "
        "process writes (any storage, busy workers even with few shards); auto: shards where it can take them "
        "and there are at least 2 shards per worker")
    batch_size: int = Field(32, ge=1, le=1024, description="images per task sent to a CPU worker")
    draft: bool = Field(True, description="decode JPEGs at reduced size when the short side stays >= size")
    shards_per_group: int = Field(4, ge=1, description="the DAG maps one task over each group of this many shards")
    tune_samples: int = Field(256, ge=8, description="samples `seedance preprocess tune` runs each split on")
