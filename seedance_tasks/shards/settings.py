"""Settings of the shards pipeline (section `shards:` of config/seedance.yaml)."""

from __future__ import annotations

from pydantic import Field

from seedance_tasks.settings_base import StrictModel
from seedance_tasks.units import ByteSize


class ShardSettings(StrictModel):
    shard_size: ByteSize = Field(256 * 1024**2, description="bytes per shard, tar headers included")
    max_samples: int | None = Field(None, ge=1, description="samples per shard at most; None for no limit")
    prefix: str = Field("shard", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="shard names: PREFIX-000000.tar")
    key_column: str = Field("__key__", description="Parquet sources: the column holding each sample's key")
    required_members: list[str] | None = Field(
        None,
        description="extensions every sample must have (e.g. [jpg, cls]); None: those at least half the samples have",
    )
    mtime: int = Field(0, ge=0, description="mtime written in every tar header (fixed, so rebuilds are identical)")
    check_decode: bool = Field(
        True, description="build and verify decode every image member (jpg, png, webp...) as readers will; "
        "a sample that does not decode is rejected at build and reported by verify",
    )
    max_member_size: ByteSize = Field(
        1024**3, description="no member above this size is packed or read (verify refuses it by its declared size)",
    )
