"""Human sizes (`512MiB`, `8MB`) and durations (`0`, `30m`, `1h`, `7d`) parsed and printed."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

from seedance_tasks.errors import UsageError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Far above any real size (1 EiB) or duration (~31,700 years); keeps int() and timers finite.
_LARGEST = float(2**60)
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def quoted(value: object) -> str:
    """`value` as quoted in an error message: its repr, cut to 60 characters (a form field or an
    environment variable may hold a whole file)."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4300-digit limit of int -> str (or a value holding one)
        if isinstance(value, int):
            return f"an integer of about {int(value.bit_length() * math.log10(2)):,} digits"
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= 60 else text[:57] + "..."


def _parse(value: str | int | float, units: dict[str, float], kind: str, hint: str) -> Decimal:
    if isinstance(value, bool):
        raise UsageError(f"not a {kind}: {quoted(value)}", hint=hint)
    if isinstance(value, int | float):
        # Decimal() of an int of 4300+ digits raises; past _LARGEST it is refused anyway
        number, unit = (math.inf if value > 0 else -math.inf) if abs(value) > _LARGEST else value, ""
    else:
        match = _NUMBER_UNIT.match(str(value))
        unit = match.group(2).lower() if match else None
        if not match or unit not in units:
            raise UsageError(f"not a {kind}: {quoted(value)}", hint=hint)
        number = match.group(1)
    result = Decimal(number) * units[unit]  # exact: a byte count above 2**53 survives (a float would not)
    if result.is_nan():
        raise UsageError(f"not a {kind}: {quoted(value)}", hint=hint)
    if result < 0:
        raise UsageError(f"a {kind} cannot be negative: {quoted(value)}", hint=hint)
    if result > _LARGEST:
        raise UsageError(f"{kind} too large: {quoted(value)}", hint=hint)
    return result


def parse_size(value: str | int | float) -> int:
    """Bytes in `value` (`512MiB`, `8MB`, `1.5GiB`, `1048576`); raises UsageError if malformed."""
    return int(_parse(value, _SIZE_UNITS, "size", "write a number with a unit, like 512MiB, 64MB or 1GiB"))


def parse_duration(value: str | int | float) -> float:
    """Seconds in `value` (`0`, `90s`, `30m`, `1h`, `7d`); raises UsageError if malformed."""
    return float(_parse(value, _DURATION_UNITS, "duration", "write a number with a unit: 0, 90s, 30m, 1h or 7d"))


def format_size(num_bytes: int | float) -> str:
    """`num_bytes` in binary units with three significant digits, e.g. `512 MiB`, `1.46 GiB`."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" or abs(value) >= 100 else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """`seconds` as the largest whole unit that fits: `7d`, `1h`, `30m`, `45s`; else exact seconds
    without an exponent (`1234567s`, `0.0000001s`), so `parse_duration` reads back the same value."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    value = float(seconds)
    return f"{int(value)}s" if value.is_integer() else f"{Decimal(repr(value)):f}s"


def exact_size(num_bytes: int) -> str:
    """`num_bytes` in the unit that writes it exactly in the fewest characters (`512MiB`, `512MB`,
    `100000001`): what a size setting serializes to, so `parse_size` reads back the same bytes
    (`format_size`, for people, rounds)."""
    number = int(num_bytes)
    exact = [f"{number // size}{unit}" for unit, size in _EXACT_UNITS if number >= size and number % size == 0]
    return min([*exact, str(number)], key=len)


_EXACT_UNITS = [(unit, _SIZE_UNITS[unit.lower()]) for unit in ("TiB", "TB", "GiB", "GB", "MiB", "MB", "KiB", "KB")]


def _size_or_error(value: object) -> int:
    try:
        return parse_size(value)  # type: ignore[arg-type]
    except UsageError as exc:
        raise ValueError(exc.message) from None


def _duration_or_error(value: object) -> float:
    try:
        return parse_duration(value)  # type: ignore[arg-type]
    except UsageError as exc:
        raise ValueError(exc.message) from None


ByteSize = Annotated[int, BeforeValidator(_size_or_error), PlainSerializer(exact_size, return_type=str)]
"""A size setting: accepts `512MiB` or a byte count, holds bytes."""

Duration = Annotated[
    float, BeforeValidator(_duration_or_error), PlainSerializer(format_duration, return_type=str)
]
"""A duration setting: accepts `1h` or seconds, holds seconds."""
