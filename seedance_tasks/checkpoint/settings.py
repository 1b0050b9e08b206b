"""Settings of the checkpoint pipeline (section `checkpoint:` of config/seedance.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from seedance_tasks.settings_base import StrictModel
from seedance_tasks.units import ByteSize, Duration

Codec = Literal["auto", "zstd", "lz4", "bgzstd", "delta"]


class CheckpointSettings(StrictModel):
    store: str | None = Field(None, description="default checkpoint store (path, file://, s3://)")
    inbox: str | None = Field(None, description="folder trainers drop raw checkpoints into (the DAG's input)")
    codec: Codec = Field("auto", description="auto | zstd | lz4 | bgzstd (byte-grouped zstd) | delta")
    zstd_level: int = Field(1, ge=-7, le=22, description="zstd level of every zstd-based codec")
    keyframe_every: int = Field(8, ge=1, description="every K-th checkpoint of a run is stored full")
    delta_reference: Literal["pairs", "skip", "previous"] = Field(
        "pairs",
        description="base of a delta in its keyframe group: pairs (a restore reads <= 2 bases), "
        "skip (skip-list, <= log2 K bases) or previous (a chain)",
    )
    min_delta_gain: float = Field(
        0.02, ge=0, lt=1, description="a tensor's delta must save this fraction over full, else stored full"
    )
    resample_every: int = Field(
        4, ge=0, description="auto reuses a tensor's codec choice from the run's previous save for this many "
        "saves in all, then samples again (0 or 1: sample at every save)"
    )
    resample_drift: float = Field(
        0.1, gt=0, lt=1, description="a reused codec choice whose ratio fell by this fraction is sampled again "
        "at the next save"
    )
    chunk_size: ByteSize = Field(4 * 1024**2, description="raw bytes per chunk (unit of parallelism and of reads)")
    data_file_size: ByteSize = Field(1024**3, description="a checkpoint's data files roll over at this size")
    lossy: Literal["bf16"] | None = Field(None, description="opt-in lossy downcast of float32/64 tensors")
    lossy_min_elements: int = Field(
        4096, ge=1, description="smaller tensors (steps, scalars, norms) stay lossless under lossy"
    )
    workers: int = Field(0, ge=0, description="compression threads; 0 = one per core")
    cache_base: bool = Field(
        True, description="keep in memory the states later save() calls delta against (<= 2 for K=8)"
    )
    inbox_min_age: Duration = Field(60, description="inbox files younger than this are left (still being written)")
    archive_locations: list[str] = Field(
        default_factory=list,
        description="roots (folders, s3:// prefixes) a manifest may place data files under, besides the store "
        "and lifecycle.tiers.<tier>.uri; a manifest naming any other place is refused",
    )
