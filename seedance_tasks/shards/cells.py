"""Parquet cells as member bytes: how a Parquet source turns each column's values into a member.

Bytes are written as they are, strings as UTF-8, booleans as `1`/`0`, numbers as their own text
(a decimal with its own digits: `12.30` stays `12.30`; a NaN or infinity as `nan`, `inf`,
`-inf`), and anything else as strict JSON: numbers nested in a struct, list or map as JSON
numbers with the same text (decimals too, every digit kept), a nested NaN or infinity as the
string of its text (`"nan"`, `"inf"`, `"-inf"`, as JSON has no such number), dates, times,
timestamps and durations as the text Python gives them (`2024-05-01 12:00:00.123456+00:00`,
`0:00:01.500000`), with nine fractional digits for nanosecond columns
(`1970-01-01 00:00:00.000001500`), and bytes nested in a struct, list or map as base64 text
(standard alphabet, padded). A value that cannot be encoded is a `CellError` in its row, so the
row is rejected and the rest of the column is kept.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

_NS = 10**9
_FRACTION_AT = {"timestamp": 19, "time": 8}  # where str() puts the fraction: after YYYY-MM-DD HH:MM:SS / HH:MM:SS
_NON_FINITE = ("nan", "inf", "-inf")


@dataclass(frozen=True)
class NanosecondValue:
    """A nanosecond timestamp, time or duration, as its text: JSON-encoded like its microsecond peers."""

    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class CellError:
    """A cell that could not be converted, and why."""

    reason: str


def _ns_kind(arrow_type: pa.DataType) -> str | None:
    """`timestamp`, `time` or `duration` for a nanosecond temporal type, else None."""
    if getattr(arrow_type, "unit", None) != "ns":
        return None
    if pa.types.is_timestamp(arrow_type):
        return "timestamp"
    if pa.types.is_time64(arrow_type):
        return "time"
    return "duration" if pa.types.is_duration(arrow_type) else None


def _children(arrow_type: pa.DataType) -> list[pa.DataType]:
    if pa.types.is_struct(arrow_type):
        return [field.type for field in arrow_type]
    if pa.types.is_map(arrow_type):
        return [arrow_type.key_type, arrow_type.item_type]
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        return [arrow_type.value_type]
    return []


def _has_ns(arrow_type: pa.DataType) -> bool:
    if pa.types.is_dictionary(arrow_type):
        return _has_ns(arrow_type.value_type)
    return _ns_kind(arrow_type) is not None or any(_has_ns(child) for child in _children(arrow_type))


def _plain_type(arrow_type: pa.DataType) -> pa.DataType:
    """`arrow_type` with every nanosecond temporal type (nested ones too) replaced by int64."""
    if pa.types.is_dictionary(arrow_type):
        return _plain_type(arrow_type.value_type)
    if _ns_kind(arrow_type):
        return pa.int64()
    if pa.types.is_struct(arrow_type):
        return pa.struct([field.with_type(_plain_type(field.type)) for field in arrow_type])
    if pa.types.is_map(arrow_type):
        return pa.map_(_plain_type(arrow_type.key_type), _plain_type(arrow_type.item_type))
    if pa.types.is_fixed_size_list(arrow_type):
        return pa.list_(_plain_type(arrow_type.value_type), arrow_type.list_size)
    if pa.types.is_large_list(arrow_type):
        return pa.large_list(_plain_type(arrow_type.value_type))
    if pa.types.is_list(arrow_type):
        return pa.list_(_plain_type(arrow_type.value_type))
    return arrow_type


def ns_text(value: int, arrow_type: pa.DataType) -> str:
    """A nanosecond timestamp, time or duration as Python writes its microsecond peer, with 9 digits."""
    kind = _ns_kind(arrow_type)
    whole, fraction = divmod(value, _NS)
    micro = {"timestamp": pa.timestamp("us", getattr(arrow_type, "tz", None)), "time": pa.time64("us"),
             "duration": pa.duration("us")}[kind]
    text = str(pa.scalar(whole * 10**6, micro).as_py())  # whole seconds: exact in Python's types
    if not fraction:
        return text
    cut = _FRACTION_AT.get(kind, len(text))
    return f"{text[:cut]}.{fraction:09d}{text[cut:]}"


def _restore(value: Any, arrow_type: pa.DataType) -> Any:
    """Python `value` of `_plain_type(arrow_type)` with its nanosecond integers back as text."""
    if value is None:
        return None
    if pa.types.is_dictionary(arrow_type):
        return _restore(value, arrow_type.value_type)
    if _ns_kind(arrow_type):
        return NanosecondValue(ns_text(value, arrow_type))
    if pa.types.is_struct(arrow_type):
        return {field.name: _restore(value[field.name], field.type) for field in arrow_type}
    if pa.types.is_map(arrow_type):
        return [(_restore(k, arrow_type.key_type), _restore(v, arrow_type.item_type)) for k, v in value]
    if _children(arrow_type):
        return [_restore(item, arrow_type.value_type) for item in value]
    return value


def _python_values(column: pa.ChunkedArray | pa.Array) -> list:
    if not _has_ns(column.type):
        return column.to_pylist()
    plain = column.cast(_plain_type(column.type))
    return [_restore(value, column.type) for value in plain.to_pylist()]


def column_values(column: pa.ChunkedArray | pa.Array) -> list:
    """The Python value of every cell of `column`; a cell that cannot be converted is a CellError."""
    try:
        return _python_values(column)
    except (pa.ArrowException, ValueError, TypeError, OverflowError, KeyError):
        pass
    values: list = []
    for row in range(len(column)):  # only for a column that failed as a whole: find the bad cells
        try:
            values.extend(_python_values(column.slice(row, 1)))
        except (pa.ArrowException, ValueError, TypeError, OverflowError, KeyError) as exc:
            values.append(CellError(f"{type(exc).__name__}: {exc}"))
    return values


class _ExactNumber(ValueError):
    """A decimal met by json's encoder, which cannot write its digits: `_strict_json` writes it instead."""


def number_text(value: int | float | Decimal) -> str:
    """A number as its own text: an int's digits, a float as Python writes it, a decimal's digits as
    they are (never through a float); a NaN or infinity, float or decimal, is `nan`, `inf` or `-inf`."""
    if isinstance(value, Decimal) and not value.is_finite():
        return "nan" if value.is_nan() else "-inf" if value.is_signed() else "inf"
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        raise _ExactNumber
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)  # dates, times, NanosecondValue...: their text


def _strict_json(value: Any) -> str:
    """`value` as json.dumps writes it, but with decimals as JSON numbers and NaN and infinities as text."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(key))}: {_strict_json(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_strict_json(item) for item in value) + "]"
    if isinstance(value, float | Decimal):
        text = number_text(value)
        return json.dumps(text) if text in _NON_FINITE else text
    if value is None or isinstance(value, str | int):
        return json.dumps(value)
    return _strict_json(_json_default(value))


def cell_bytes(value: Any) -> bytes:
    """A cell's Python value as member bytes (see the module's docstring): anything written as JSON
    is strict JSON (no NaN or Infinity), and every number keeps its own digits."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, int | float | Decimal):
        return number_text(value).encode()
    try:
        return json.dumps(value, default=_json_default, allow_nan=False).encode()
    except ValueError:  # a decimal, a NaN or an infinity inside: written by `_strict_json` instead
        return _strict_json(value).encode()
