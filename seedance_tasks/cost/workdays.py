"""The working-day calendar of the cost actions workflow, and the clock that turns its deadlines
(hours after the month closes, the Nth working day) into instants.

A month closes at 00:00 on the 1st of the next month in the calendar's time zone. Working days
are the days that are neither weekend days nor holidays. With a `day_length` shorter than a day
(a rehearsal: tests, demos) every calendar day lasts that long, counted from an anchor instant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from seedance_tasks.errors import ConfigError, UsageError

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DAY_S = 86400.0


@dataclass(frozen=True)
class WorkCalendar:
    """Weekend days (0 = Monday) and holidays; every other day is a working day."""

    weekend: frozenset[int] = frozenset({5, 6})
    holidays: frozenset[date] = field(default_factory=frozenset)

    @classmethod
    def from_settings(cls, settings) -> WorkCalendar:
        """The calendar of `cost.actions` settings (weekend names, holiday dates)."""
        weekend = frozenset(WEEKDAYS.index(name) for name in settings.weekend)
        if len(weekend) == 7:
            raise ConfigError("cost.actions.weekend names every day: no working day is left",
                              hint="list at most six weekend days")
        return cls(weekend, frozenset(settings.holidays))

    def is_working_day(self, day: date) -> bool:
        """True if `day` is neither a weekend day nor a holiday."""
        return day.weekday() not in self.weekend and day not in self.holidays

    def nth_working_day(self, start: date, n: int) -> date:
        """The `n`-th working day on or after `start` (n >= 1): the 5th working day of September
        is `nth_working_day(date(Y, 9, 1), 5)`. Always a working day, never before `start`."""
        if n < 1:
            raise UsageError(f"working day number must be at least 1, got {n}")
        if len(self.weekend) >= 7:
            raise ConfigError("the calendar has no working day", hint="list at most six weekend days")
        day, seen = start, 0
        while True:
            if self.is_working_day(day):
                seen += 1
                if seen == n:
                    return day
            day += timedelta(days=1)

    def working_days(self, start: date, end: date) -> int:
        """How many working days lie in [start, end)."""
        count, day = 0, start
        while day < end:
            count += self.is_working_day(day)
            day += timedelta(days=1)
        return count


MONTH_PATTERN = r"^[0-9]{4}-(0[1-9]|1[0-2])$"
"""A month, YYYY-MM, as a JSON-schema / pydantic pattern (ASCII digits only); `parse_month` also
checks its range."""
MONTH_RE = re.compile(MONTH_PATTERN)
MONTH_FORM_PATTERN = r"^[0-9]{4}-(0[1-9]|1[0-2])(?![\s\S])"
"""MONTH_PATTERN for a trigger form's JSON schema, checked by Python's `re.search` (jsonschema)
and the browser's RegExp alike: nothing may follow the month (Python's `$` also matches before a
final newline, which `parse_month` refuses)."""
CURRENCY_RE = r"^[A-Z]{3}$"
"""An ISO 4217 currency code as FOCUS writes it (BillingCurrency), and as budgets name it."""
LAST_MONTH = "9998-12"
"""The last month Seedance takes: a later one's deadlines and bounds would pass year 9999."""


def parse_month(month: str) -> tuple[int, int]:
    """(year, month number) of exactly `YYYY-MM` in 0001-01..9998-12; UsageError otherwise (`2024-9` too)."""
    if not isinstance(month, str) or not MONTH_RE.fullmatch(month):
        raise UsageError(f"not a month (YYYY-MM): {month!r}", hint="write YYYY-MM, e.g. 2024-09")
    if not "0001-01" <= month <= LAST_MONTH:
        raise UsageError(f"month {month} is out of range", hint=f"a month from 0001-01 to {LAST_MONTH}")
    return int(month[:4]), int(month[5:])


def month_close(month: str) -> date:
    """The day a month closes on: the 1st of the next month (`2024-08` -> 2024-09-01)."""
    year, number = parse_month(month)
    return date(year + number // 12, number % 12 + 1, 1)


def zone(name: str) -> ZoneInfo:
    """The time zone `name` (IANA), or ConfigError naming `cost.actions.timezone`."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"cost.actions.timezone: unknown time zone {name!r}", hint="use an IANA name, e.g. UTC "
                          "or Europe/Paris") from None


@dataclass(frozen=True)
class Clock:
    """Calendar time -> instants: `anchor_day` (the close date) starts at `anchor`, and each
    calendar day after it lasts `day_length_s` seconds (86400 unless rehearsing)."""

    anchor_day: date
    anchor: datetime
    day_length_s: float = DAY_S

    def at_day(self, day: date) -> datetime:
        """The instant `day` starts (00:00 of it, on this clock)."""
        return self.anchor + timedelta(seconds=(day - self.anchor_day).days * self.day_length_s)

    def after_hours(self, hours: float) -> datetime:
        """The instant `hours` calendar hours after the anchor."""
        return self.anchor + timedelta(seconds=hours / 24 * self.day_length_s)

    def hours(self, hours: float) -> timedelta:
        """`hours` calendar hours as a span of this clock."""
        return timedelta(seconds=hours / 24 * self.day_length_s)


def close_instant(month: str, tz: str) -> datetime:
    """00:00 on the 1st of the month after `month`, in time zone `tz` (aware)."""
    day = month_close(month)
    return datetime(day.year, day.month, day.day, tzinfo=zone(tz))
