"""Settings of the shards pipeline (section `shards:` of config/seedance.yaml)."""

from __future__ import annotations

from pydantic import Field, field_validator

from seedance_tasks.settings_base import StrictModel
from seedance_tasks.units import ByteSize, exact_size

MIN_SHARD_SIZE = 4 * 1024
"""The smallest `shard_size`: a tar of a few headers (512 bytes each) and its end marker."""


class ShardSettings(StrictModel):
    shard_size: ByteSize = Field(256 * 1024**2, description="bytes per shard, tar headers included (at least 4KiB)")
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

    @field_validator("shard_size")
    @classmethod
    def _shard_holds_a_sample(cls, value: int) -> int:
        if value < MIN_SHARD_SIZE:
            raise ValueError(f"must be at least {exact_size(MIN_SHARD_SIZE)} (tar headers alone take 512 bytes a "
                             "member), e.g. 256MiB")
        return value

    @field_validator("max_member_size")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("must be a positive size such as 1GiB (at 0 bytes no member could be packed or read)")
        return value
