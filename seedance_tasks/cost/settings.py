"""Settings of the cost pipeline (section `cost:` of config/seedance.yaml).

Thresholds of the responsibility rules live here; who owns what (tag keys, CMDB rules, shared
costs, budgets, approvals) lives in the owners file (`config/owners.yaml`).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from pydantic import Field

from seedance_tasks.cost.actions_settings import CostActionsSettings
from seedance_tasks.settings_base import StrictModel
from seedance_tasks.units import Duration

MAX_OVERBUDGET_PERCENT = 10_000
"""The largest tolerance over budget (100 times the budget): more is a typo, not a policy."""


class CostSettings(StrictModel):
    basis: Literal["EffectiveCost", "BilledCost"] = Field(
        "EffectiveCost", description="charge basis: EffectiveCost (amortized) or BilledCost (cash)"
    )
    billing_uri: str | None = Field(None, description="default billing source of scheduled runs; else --billing")
    out_uri: str | None = Field(None, description="default output root of scheduled runs; else --out")
    owners_file: str | None = Field(None, description="default owners/CMDB file; else --owners")
    default_currency: str | None = Field(
        None, description="currency of billing files that have no BillingCurrency column at all"
    )
    batch_rows: int = Field(500_000, gt=0, le=10**8, description="rows per batch; bounds memory, not the month size")
    fail_on_empty_month: bool = Field(
        False, description="a month without any valid billing line fails the run (nothing published); else a warning"
    )
    # technical rule: idle resources
    idle_cpu_percent: Decimal = Field(
        Decimal("5"), ge=0, le=100, description="idle if every daily CPU datapoint is below this")
    idle_days: int = Field(7, gt=0, le=366, description="days of datapoints (ending at the month's end) the rule looks at")
    min_resource_age: Duration = Field(7 * 86400, description="resources younger than this are exempt")
    gpu_busy_percent: Decimal = Field(
        Decimal("5"), ge=0, le=100, description="a GPU node whose GPU reaches this is not idle")
    review_tag_key: str = "cost-review"
    review_tag_value: str = "pending"
    # financial rule: over budget
    overbudget_percent: Decimal = Field(
        Decimal("20"), ge=0, le=MAX_OVERBUDGET_PERCENT,
        description="freeze next month's quota when spend exceeds budget by strictly more"
    )
    # notifications
    notifier: str = Field(
        "outbox",
        description="'outbox' (JSON lines under the state dir) or 'airflow:<module.Class>' (an Airflow notifier)",
    )
    notifier_kwargs: dict[str, Any] = Field(default_factory=dict, description="arguments of the Airflow notifier")
    state_uri: str | None = Field(
        None, description="quota ledger, notification ledger, outbox, API cache; default OUT/_seedance/cost"
    )
    # Cost Explorer
    cost_explorer_page_price: Decimal = Field(
        Decimal("0.01"), ge=0, le=1000, description="USD per GetCostAndUsage page")
    cost_explorer_group_tag: str = Field("owner", description="tag key Cost Explorer results are grouped by")
    # the actions workflow (DAG seedance_cost_actions): calendar, deadlines, isolation
    actions: CostActionsSettings = Field(default_factory=CostActionsSettings)
