"""Settings of the cost actions workflow (`cost.actions:` of config/seedance.yaml): the working-day
calendar, the deadlines (48 h isolation, 72 h confirmation, deduction on the Nth working day after
the month closes) and how idle resources are isolated."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Literal

from pydantic import Field

from seedance_tasks.settings_base import StrictModel
from seedance_tasks.units import Duration

Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]

MAX_HOURS = 366 * 24
"""The longest deadline (hours after the anchor) a setting may give: a year; more is a typo."""

Hours = Annotated[int, Field(gt=0, le=MAX_HOURS)]


class CostActionsSettings(StrictModel):
    apply: bool = Field(False, description="runs started by a seedance_cost_statements event apply (else dry runs)")
    timezone: str = Field("UTC", description="time zone of the calendar: a month closes at 00:00 on the 1st there")
    weekend: list[Weekday] = Field(default_factory=lambda: ["sat", "sun"], description="days that are not working days")
    holidays: list[date] = Field(default_factory=list, description="dates that are not working days")
    day_length: Duration = Field(
        86400, gt=0, le=86400,
        description="length of one calendar day; shorter only to rehearse the workflow (tests, demos)")
    anchor: Literal["month_close", "run_start"] = Field(
        "month_close", description="deadlines count from the month's close, or from the first run of the month "
        "(rehearsals with a short day_length)")
    isolate_within_hours: int = Field(
        48, ge=0, le=MAX_HOURS, description="idle resources isolated and snapshotted within this")
    confirm_within_hours: Hours = Field(72, description="owners confirm or dispute their chargeback within this")
    reminders_after_hours: list[Hours] = Field(
        default_factory=lambda: [24, 48], description="owners who have not answered are reminded at these hours")
    deduct_on_working_day: int = Field(5, gt=0, le=31, description="confirmed amounts deducted on this working day "
                                       "of the month after the closed one")
    tuning_window: Duration = Field(30 * 86400, ge=0, description="resources younger than this are flagged, not acted on")
    stop_instances: bool = Field(True, description="stop idle EC2 instances (after snapshotting their volumes)")
    stop_databases: bool = Field(True, description="stop idle RDS instances (after a DB snapshot)")
    isolation_security_group: str | None = Field(
        None, description="security group an idle EC2 instance is moved to (its old groups are kept in a tag)")
    lock_wait: Duration = Field(60, ge=0, description="how long a ledger update waits for another writer")

