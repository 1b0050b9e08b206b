"""Settings of the compaction pipeline (section `compaction:` of config/seedance.yaml)."""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from pydantic import Field, field_validator, model_validator

from seedance_tasks.settings_base import StrictModel
from seedance_tasks.units import ByteSize, Duration

MAX_WORKERS = 1024
"""The most partitions compacted at once: each is a thread holding a row group in memory."""
MAX_TARGET_FILE_SIZE = 5 * 1024**3
"""The largest file compaction writes: S3 copies at most 5 GiB in one CopyObject, and a publish
on S3 is a copy of the staged object (a larger one would fail at every roll-forward)."""


class CompactionSettings(StrictModel):
    default_uri: str | None = Field(None, description="lake the nightly DAG run compacts when no URI is given")
    target_file_size: ByteSize = Field(512 * 1024**2, description="size of the files compaction writes")
    small_file_size: ByteSize | None = Field(
        None, description="files smaller than this are compacted; default 75% of the target"
    )
    min_age: Duration = Field(3600, description="files younger than this are left alone (writers busy)")
    row_group_size: ByteSize = Field(
        64 * 1024**2, description="uncompressed bytes per row group; bounds a worker's memory"
    )
    compression: Literal["zstd", "snappy", "lz4", "gzip", "none"] = "zstd"
    compression_level: int | None = Field(
        None, description="codec level, within what the codec takes (zstd -131072..22, gzip 1..9, lz4 1..12; "
        "snappy and none take none); None for the codec default"
    )
    dictionary_max_cardinality: float = Field(
        0.1, ge=0, le=1, description="dictionary-encode a column only below this distinct/rows ratio"
    )
    workers: int = Field(0, ge=0, le=MAX_WORKERS,
                         description="partitions compacted at once (threads); 0 means one per core")
    s3_requests_per_file_per_month: int = Field(
        30 * 2, ge=0, le=10**6, description="reads (GET) + lists per small file per month, for the saving estimate"
    )
    s3_get_price_per_1000: Decimal = Field(
        Decimal("0.0004"), ge=0, le=1000, allow_inf_nan=False,
        description="USD per 1,000 GET requests (S3 Standard); bounded so the saving estimate stays exact",
    )

    @field_validator("target_file_size", "row_group_size", "small_file_size")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError("must be a positive size such as 512MiB (a file of 0 bytes cannot hold a row)")
        return value

    @field_validator("target_file_size")
    @classmethod
    def _publishable(cls, value: int) -> int:
        if value > MAX_TARGET_FILE_SIZE:
            raise ValueError("must be at most 5GiB: S3 copies an object of at most 5 GiB in one request, "
                             "and publishing a compacted file is such a copy (512MiB-1GiB suits most readers)")
        return value

    @model_validator(mode="after")
    def _small_below_target(self) -> CompactionSettings:
        if self.small_file_size is not None and self.small_file_size > self.target_file_size:
            raise ValueError("small_file_size must not exceed target_file_size")
        return self

    @model_validator(mode="after")
    def _level_of_the_codec(self) -> CompactionSettings:
        if self.compression_level is not None:
            if (problem := codec_level_problem(self.compression, self.compression_level)) is not None:
                raise ValueError(f"compression_level {self.compression_level}: {problem}")
        return self

    @property
    def effective_small_file_size(self) -> int:
        """The small-file threshold in bytes: as set, or 75% of the target (Iceberg's default)."""
        if self.small_file_size is not None:
            return self.small_file_size
        return int(self.target_file_size * 0.75)


def codec_level_problem(codec: str, level: int) -> str | None:
    """Why Parquet's `codec` (a `compression` value) cannot take `level`, from what pyarrow's codec
    says it accepts, or None if it can."""
    import pyarrow as pa  # here, not at the top: every settings load imports this module

    if codec == "none" or not pa.Codec.supports_compression_level(codec):
        return f"compression {codec!r} takes no level (set compression_level: null)"
    low, high = pa.Codec.minimum_compression_level(codec), pa.Codec.maximum_compression_level(codec)
    if not low <= level <= high:
        return f"compression {codec!r} takes a level from {low} to {high}"
    return None
