"""Settings of checkpoint retention and tiering (section `lifecycle:` of config/seedance.yaml)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from seedance_tasks.settings_base import StrictModel
from seedance_tasks.units import Duration

TIERS = ("hot", "warm", "cold")
StorageClass = Literal[
    "STANDARD", "INTELLIGENT_TIERING", "STANDARD_IA", "ONEZONE_IA", "GLACIER_IR", "GLACIER", "DEEP_ARCHIVE"
]
ARCHIVE_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})  # need a restore request before a GET

# S3 list prices, USD per GB-month (us-east-1, first 50 TB), plus a local NVMe/SSD volume (EBS gp3).
DEFAULT_PRICES = {
    "STANDARD": Decimal("0.023"),
    "INTELLIGENT_TIERING": Decimal("0.023"),
    "STANDARD_IA": Decimal("0.0125"),
    "ONEZONE_IA": Decimal("0.01"),
    "GLACIER_IR": Decimal("0.004"),
    "GLACIER": Decimal("0.0036"),
    "DEEP_ARCHIVE": Decimal("0.00099"),
    "LOCAL_SSD": Decimal("0.08"),
}


class RetentionPolicy(StrictModel):
    """What GC keeps of a run; everything else (but the bases kept deltas need) is garbage."""

    keep_last: int = Field(3, ge=1, description="the N latest steps (>= 1: the restart checkpoint is never garbage)")
    keep_every: int | None = Field(100, ge=1, description="every step that is a multiple of M; null = none")
    keep_best: int = Field(0, ge=0, description="the K best steps by `metric` recorded at save time")
    metric: str | None = Field("val_loss", description="metric of keep_best (in the manifest's `metrics`)")
    metric_mode: Literal["min", "max"] = Field("min", description="min: lower is better (losses); max: accuracies")
    keep_tagged: bool = Field(True, description="keep every checkpoint that carries a tag (`seedance ckpt tag`)")
    min_age: Duration = Field(0, description="checkpoints younger than this are kept whatever the policy says")

    @model_validator(mode="after")
    def _best_needs_metric(self) -> RetentionPolicy:
        if self.keep_best and not self.metric:
            raise ValueError("keep_best needs a metric to rank by (e.g. metric: val_loss)")
        return self


STRAY_MIN_AGE_FLOOR = 600
"""The least `stray_min_age` accepted: below it GC could trash the files of a save still writing."""


class TierSpec(StrictModel):
    """Where one tier's files live and what they cost."""

    uri: str | None = Field(
        None, description="folder or s3:// prefix of this tier; null = in the store itself (S3: storage-class change)"
    )
    storage_class: StorageClass | None = Field(None, description="S3 storage class of files on this tier (S3 only)")
    price_class: str | None = Field(None, description="key of `prices` for this tier; null = storage_class or STANDARD")

    def price_key(self) -> str:
        """The key of `prices` this tier is charged at, in capitals (as `prices` keys are kept)."""
        return (self.price_class or self.storage_class or "STANDARD").upper()


class TieringSettings(StrictModel):
    warm_after: Duration = Field(3600, description="a checkpoint moves to warm this long after save / last restore")
    cold_after: Duration = Field(86400, description="... and to cold this long after")
    keep_latest_hot: bool = Field(True, description="the latest checkpoint of each run (a restart's) stays hot")
    hot: TierSpec = TierSpec()
    warm: TierSpec = TierSpec(storage_class="STANDARD_IA")
    cold: TierSpec = TierSpec(storage_class="GLACIER_IR")

    @model_validator(mode="after")
    def _ordered(self) -> TieringSettings:
        if self.cold_after <= self.warm_after:
            raise ValueError(f"cold_after ({self.cold_after:g}s) must be longer than warm_after ({self.warm_after:g}s)")
        if self.hot.storage_class in ARCHIVE_CLASSES or self.warm.storage_class in ARCHIVE_CLASSES:
            raise ValueError("only the cold tier may use an archive class (GLACIER, DEEP_ARCHIVE)")
        return self

    def spec(self, tier: str) -> TierSpec:
        return getattr(self, tier)


class LifecycleSettings(StrictModel):
    store: str | None = Field(None, description="store the DAG works on; null = checkpoint.store")
    retention: RetentionPolicy = RetentionPolicy()
    runs: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-run overrides of `retention`, e.g. {big-run: {keep_last: 10}}"
    )
    tiers: TieringSettings = TieringSettings()
    prices: dict[str, Decimal] = Field(
        default_factory=lambda: dict(DEFAULT_PRICES),
        description="USD per GB-month by price class, over the defaults: a class not given keeps its list price",
    )
    thaw_days: int = Field(7, ge=1, description="days a thawed (restored) archive object stays readable")
    thaw_retrieval: Literal["Expedited", "Standard", "Bulk"] = Field("Standard", description="archive retrieval tier")
    apply_on_schedule: bool = Field(False, description="scheduled DAG runs apply GC and tiering (else dry run)")
    record_restores: bool = Field(True, description="note each restore's time, so tiering counts age since it")
    stray_min_age: Duration = Field(
        86400, ge=STRAY_MIN_AGE_FLOOR,
        description="GC moves files of interrupted saves (named by no manifest) to the trash once this old; "
                    "longer than any save takes, so a save in progress is never touched (at least 10 minutes: "
                    "a save holds no lease, only its files' age protects it)")

    @field_validator("prices", mode="after")
    @classmethod
    def _over_defaults(cls, prices: dict[str, Decimal]) -> dict[str, Decimal]:
        """The prices given, merged over `DEFAULT_PRICES`: overriding one class keeps the others.
        Classes are kept in capitals, as S3 names them (an environment override arrives lower-cased)."""
        return {**DEFAULT_PRICES, **{key.upper(): price for key, price in prices.items()}}

    @model_validator(mode="after")
    def _check(self) -> LifecycleSettings:
        for run, override in self.runs.items():
            try:
                RetentionPolicy.model_validate({**self.retention.model_dump(), **(override or {})})
            except ValidationError as exc:
                problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'policy'}: {e['msg']}" for e in exc.errors())
                raise ValueError(f"runs.{run}: {problems}") from None
        for key, price in self.prices.items():
            if price < 0:
                raise ValueError(f"prices.{key} is {price}: a price is USD per GB-month, 0 or more")
        for tier in TIERS:
            key = self.tiers.spec(tier).price_key()
            if key not in self.prices:
                raise ValueError(f"tier {tier} is priced as {key!r}, which `prices` does not list")
        return self

    def policy_for(self, run: str) -> RetentionPolicy:
        """The retention policy of `run`: `retention` with the run's overrides from `runs`."""
        return RetentionPolicy.model_validate({**self.retention.model_dump(), **(self.runs.get(run) or {})})
