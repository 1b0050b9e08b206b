"""Settings of the signals pipeline (section `signals:` of config/seedance.yaml): where its inputs
are, where its outputs go, who hears of a finding, and every rule's threshold (defaults from the
issue that defined the signals)."""

from __future__ import annotations

import re
from decimal import Decimal

from pydantic import Field, field_validator, model_validator

from seedance_tasks.notifiers import ENV_NAME, WebhookRef, email_list
from seedance_tasks.settings_base import StrictModel
from seedance_tasks.units import ByteSize, Duration


class InstanceSize(StrictModel):
    vcpus: int = Field(..., gt=0)
    hourly: Decimal = Field(..., gt=0, description="price per hour, in the billing currency")


class SignalsSettings(StrictModel):
    @model_validator(mode="before")
    @classmethod
    def _webhook_by_reference(cls, data):
        if isinstance(data, dict):
            WebhookRef.model_validate({key: data[key] for key in ("webhook_url", "webhook", "url", "webhook_conn",
                                                                  "webhook_env") if data.get(key) is not None})
            data = {key: value for key, value in data.items() if not (key == "webhook_url" and value is None)}
        return data

    @field_validator("egress_patterns", "request_patterns", "iops_patterns", "compute_patterns")
    @classmethod
    def _patterns_compile(cls, patterns: list[str]) -> list[str]:
        """Every pattern is a regular expression Python compiles (refused at load, naming it)."""
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression ({exc})") from None
        return patterns

    @field_validator("contacts", mode="before")
    @classmethod
    def _contacts_are_owners_and_addresses(cls, value):
        """Each key is an owner as findings name it (a tag value: surrounding spaces dropped, never
        blank, no two keys alike once stripped), each value one `name@host` address; refused at load,
        naming the key, rather than when a finding's mail is sent."""
        from seedance_tasks.cost.owners import owner_name

        if not isinstance(value, dict):
            return value
        checked: dict = {}
        for key, address in value.items():
            try:
                owner = owner_name(key)
                if owner in checked:
                    raise ValueError(f"{owner!r} is given twice (keys compare without surrounding spaces)")
                (checked[owner],) = email_list(address) if isinstance(address, str) else (address,)
            except ValueError as exc:
                raise ValueError(f"contact {key!r}: {exc}") from None
        return checked

    @field_validator("default_contact", mode="before")
    @classmethod
    def _default_contact_is_an_address(cls, value):
        """One `name@host` address (or null), checked at load."""
        return email_list(value)[0] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _cold_below_hot(self):
        if self.cold_price_per_gb_month > self.hot_price_per_gb_month:
            raise ValueError(f"cold_price_per_gb_month ({self.cold_price_per_gb_month}) is above "
                             f"hot_price_per_gb_month ({self.hot_price_per_gb_month}): moving to cold would cost money")
        return self

    @property
    def webhook(self) -> WebhookRef:
        """Where the findings' webhook URL is kept (never the URL itself)."""
        return WebhookRef(webhook_conn=self.webhook_conn, webhook_env=self.webhook_env)

    root: str | None = Field(None, description="outputs (per night: Parquet, JSON, HTML) and state; else --out")
    billing_uri: str | None = Field(None, description="FOCUS file or folder (the cost pipeline's input); else --billing")
    lakes: list[str] = Field(default_factory=list, description="dataset roots to audit; else --lake")
    checkpoints_uri: str | None = Field(None, description="checkpoint store to audit; else --checkpoints")
    metrics_uri: str | None = Field(
        None, description="Parquet metric samples (file or folder) or a Prometheus http(s):// URL; else --metrics"
    )
    metrics_step: Duration = Field(300, gt=0, description="query_range step against Prometheus")
    apply: bool = Field(False, description="fixes triggered through Asset events apply (else they are dry runs)")
    # owners and notifications
    owner_tags: list[str] = Field(default_factory=lambda: ["owner", "team", "business_unit", "org"])
    owner_label: str = Field("owner", description="metric label naming a series' owner")
    job_label: str = Field("job", description="metric label naming a training job")
    contacts: dict[str, str] = Field(default_factory=dict, description="owner -> e-mail address (the CMDB's)")
    default_contact: str | None = Field(None, description="e-mail of findings whose owner has no contact")
    smtp_conn_id: str | None = Field(None, description="Airflow SMTP connection; null: no e-mail")
    mail_from: str = "seedance@localhost"
    webhook_conn: str | None = Field(None, description="Airflow connection holding a Slack-compatible webhook URL")
    webhook_env: str | None = Field(None, pattern=ENV_NAME, description="... or the environment variable holding it")
    critical_dollars: Decimal = Field(Decimal("1000"), ge=0, description="a finding at stake >= this per month is critical")
    gpu_hour_price: Decimal = Field(Decimal("2.50"), ge=0, description="price of one GPU-hour, for training signals")
    # billing thresholds
    egress_jump_percent: Decimal = Field(Decimal("40"), gt=0)
    egress_requests_max_change_percent: Decimal = Field(Decimal("10"), gt=0)
    egress_patterns: list[str] = Field(
        default_factory=lambda: [r"(?i)data transfer out", r"(?i)DataTransfer-Out", r"(?i)internet egress",
                                 r"(?i)network internet .*egress"],
        description="regexes on ChargeDescription/SkuId/x_UsageType of data-transfer-out lines (AWS, Azure, GCP)",
    )
    request_patterns: list[str] = Field(
        default_factory=lambda: [r"(?i)requests", r"(?i)(read|write|list|batch write) operations"],
        description="regexes on object-storage request lines",
    )
    iops_patterns: list[str] = Field(default_factory=lambda: [r"(?i)provisioned IOPS", r"(?i)PIOPS"])
    idle_iops_percent: Decimal = Field(Decimal("10"), gt=0, le=100, description="measured IOPS below this share of provisioned")
    volume_label: str = Field("volume_id", description="node_exporter disk label matched to the billing ResourceId")
    compute_patterns: list[str] = Field(default_factory=lambda: [r"(?i)instance hour", r"(?i)vCPU"])
    group_label: str = Field("resource_group", description="node_exporter label matched to the billing ResourceId")
    idle_vcpu_percent: Decimal = Field(Decimal("30"), gt=0, le=100)
    vcpu_spend_rise_percent: Decimal = Field(Decimal("10"), ge=0, description="compute spend rise that counts as rising")
    target_cpu_percent: Decimal = Field(Decimal("60"), gt=0, le=100, description="utilisation a right-sized instance would run at")
    price_table: dict[str, InstanceSize] = Field(default_factory=dict, description="instance type -> vcpus, hourly")
    surge_k: Decimal = Field(Decimal("3"), ge=0, description="cost-surge margin: median + k x MAD of the trailing 28 days")
    surge_min_percent: Decimal = Field(Decimal("20"), ge=0, description="and at least this far above the median")
    surge_usage_percent: Decimal = Field(Decimal("10"), ge=0, description="a usage rise this large explains the cost")
    unallocated_percent: Decimal = Field(Decimal("5"), ge=0, lt=100)
    # data and training thresholds
    small_file_size: ByteSize = Field(16 * 1024**2, gt=0, description="a dataset whose mean file size is below this")
    min_small_files: int = Field(8, ge=2, description="and that has at least this many Parquet files")
    loader_gbps: Decimal = Field(Decimal("1.8"), gt=0, description="GB/s the data loader must sustain")
    data_wait_percent: Decimal = Field(Decimal("10"), ge=0, lt=100)
    util_drop_percent: Decimal = Field(Decimal("50"), gt=0, le=100, description="GPU utilisation below this share of baseline")
    util_drop_window: Duration = Field(1800, gt=0, description="... for at least this long")
    collective_timeout: Duration = Field(600, gt=0, description="NCCL collective timeout (torch default 10 min)")
    collective_wait_percent: Decimal = Field(Decimal("95"), gt=0, le=100, description="of the timeout, 3 collectives in a row")
    collective_share_percent: Decimal = Field(Decimal("25"), ge=0, lt=100, description="collectives above this share of step time")
    training_logs: list[str] = Field(default_factory=list, description="torch/NCCL log files or folders to read")
    overflow_per_epoch: int = Field(32, ge=0)
    steps_per_epoch: int = Field(1000, gt=0)
    memory_reserved_percent: Decimal = Field(Decimal("87"), ge=0, lt=100)
    checkpoint_hot_max_age: Duration = Field(7 * 86400, gt=0, description="hot-tier checkpoints older than this")
    checkpoint_max_per_run: int = Field(50, gt=0, description="committed checkpoints of a run above this: no GC")
    hot_price_per_gb_month: Decimal = Field(Decimal("0.023"), ge=0)
    cold_price_per_gb_month: Decimal = Field(Decimal("0.004"), ge=0)
