"""Billing data in, as one normalised FOCUS line schema: FOCUS CSV/Parquet, AWS CUR 2.0 Parquet,
and the Cost Explorer API.

Every reader yields `(batch, rejected)` pairs: `batch` holds the valid lines in the `LINES` schema
(money as decimal128, timestamps in UTC), `rejected` the lines that were not, each as
`{"file", "row", "column", "reason"}` with `row` the 1-based data row of its file (header
excluded). A malformed line never stops the run. Memory is bounded by the batch size.
"""

from __future__ import annotations

import codecs
import csv
import functools
import hashlib
import io
import itertools
import json
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from seedance_tasks import storage
from seedance_tasks.cost.money import (
    LIMIT,
    MAX_DIGITS,
    MONEY,
    amount_to_scale,
    decimals_as_money,
    float_amount,
)
from seedance_tasks.cost.workdays import CURRENCY_RE  # noqa: F401 (recover imports it from here)
from seedance_tasks.errors import InputError

TS = pa.timestamp("us", tz="UTC")
DICT = pa.dictionary(pa.int32(), pa.string())
"""Low-cardinality text travels dictionary-encoded (as Parquet stores it): rules run per distinct value."""
DICT_COLUMNS = ["BillingAccountId", "SubAccountId", "ServiceName", "ChargeCategory", "Tags"]
PLAIN_COLUMNS = ["ResourceId", "ResourceName"]
TEXT_COLUMNS = DICT_COLUMNS + PLAIN_COLUMNS
LINES = pa.schema(
    [
        ("x_Row", pa.int64()),
        ("ChargePeriodStart", TS),
        ("BillingCurrency", DICT),
        ("BilledCost", MONEY),
        ("EffectiveCost", MONEY),
        *[(name, DICT) for name in DICT_COLUMNS],
        *[(name, pa.string()) for name in PLAIN_COLUMNS],
        ("x_Estimated", pa.bool_()),
    ]
)
FOCUS_COLUMNS = frozenset(
    "AvailabilityZone BilledCost BillingAccountId BillingAccountName BillingAccountType BillingCurrency "
    "BillingPeriodEnd BillingPeriodStart CapacityReservationId CapacityReservationStatus ChargeCategory ChargeClass "
    "ChargeDescription ChargeFrequency ChargePeriodEnd ChargePeriodStart CommitmentDiscountCategory "
    "CommitmentDiscountId CommitmentDiscountName CommitmentDiscountQuantity CommitmentDiscountStatus "
    "CommitmentDiscountType CommitmentDiscountUnit ConsumedQuantity ConsumedUnit ContractedCost ContractedUnitPrice "
    "EffectiveCost InvoiceId InvoiceIssuerName ListCost ListUnitPrice PricingCategory PricingCurrency "
    "PricingCurrencyContractedUnitPrice PricingCurrencyEffectiveCost PricingCurrencyListUnitPrice PricingQuantity "
    "PricingUnit ProviderName PublisherName RegionId RegionName ResourceId ResourceName ResourceType ServiceCategory "
    "ServiceName ServiceSubcategory SkuId SkuMeter SkuPriceDetails SkuPriceId SubAccountId SubAccountName "
    "SubAccountType Tags".split()
)
"""The FOCUS 1.2 columns (what a source line keeps through allocation, typed as below)."""
CARRIED_MONEY = ["ListCost", "ContractedCost", "PricingCurrencyEffectiveCost"]
"""Carried cost columns: exact MONEY, split like BilledCost on a shared line."""
CARRIED_NUMBERS = ["ListUnitPrice", "ContractedUnitPrice", "PricingQuantity", "ConsumedQuantity",
                   "CommitmentDiscountQuantity", "PricingCurrencyListUnitPrice", "PricingCurrencyContractedUnitPrice"]
CARRIED_TIMES = ["BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodEnd"]
REQUIRED = ["ChargePeriodStart", "BillingCurrency", "BilledCost", "EffectiveCost"]
READ_COLUMNS = [*REQUIRED, "ChargePeriodEnd", *TEXT_COLUMNS, "x_Estimated"]
NULL_STRINGS = ["NULL", "null", ""]
"""An ISO 4217 code, as BillingCurrency holds it."""
_ZONE = r"([Zz]|[+-]\d\d:?\d\d)$"
_NAMED_UTC = r"(?i)\s*(?:UTC|GMT)$"
"""A zone written as its name, as BigQuery's CSV exports write timestamps (`2024-09-01 00:00:00 UTC`)."""
_FIRST = pa.scalar(datetime(1, 1, 1, tzinfo=UTC), TS)
_LAST = pa.scalar(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), TS)

Rejected = list[dict[str, Any]]
MAX_REJECTED = 1000
"""The most rejected rows a report lists (with `rejected_truncated` when there were more); all are counted."""


_FOCUS_FOLDED = {name.casefold(): name for name in (*FOCUS_COLUMNS, "x_Estimated")}


def focus_names(names: list[str]) -> list[str]:
    """A billing file's column names with the FOCUS ones in another case spelt as FOCUS does
    (`BILLEDCOST`, `billedcost` -> `BilledCost`, as databases export them), unless the file also
    has that exact name; the others as they are."""
    present = set(names)
    spelt = [_FOCUS_FOLDED.get(name.casefold(), name) for name in names]
    return [name if name in FOCUS_COLUMNS or focus in present else focus for name, focus in zip(names, spelt,
                                                                                               strict=True)]


def carried_name(column: str) -> str:
    """The name a carried source column has in the lines: FOCUS and `x_` names as they are, others `x_`-prefixed."""
    return column if column in FOCUS_COLUMNS or column.startswith("x_") else f"x_{column}"


def carried_type(column: str) -> pa.DataType:
    """The Arrow type of a carried source column (by its source name)."""
    if column in CARRIED_MONEY:
        return MONEY
    if column in CARRIED_NUMBERS:
        return pa.float64()
    if column in CARRIED_TIMES:
        return TS
    return pa.string()


def lines_schema(carry: list[str] | tuple[str, ...] = ()) -> pa.Schema:
    """LINES plus the source columns `carry` (source names, none of LINES), in their carried names and types."""
    return pa.schema([*LINES, *[(carried_name(name), carried_type(name)) for name in carry]])


def carried_columns(uri: str, reserved: tuple[str, ...] = ()) -> list[str]:
    """The columns of the FOCUS billing files at `uri` that LINES does not hold (first seen first).

    One whose carried name is a LINES column or `reserved` (the allocation's own) is left out.
    InputError naming the file and both columns when two would be carried under one name
    (`Id` and `x_Id`), in one file or in two.
    """
    taken = {*LINES.names, *reserved}
    found: dict[str, tuple[str, str]] = {}  # carried name -> (source column, file)
    for location, path in billing_files(uri):
        source = posixpath.basename(path) if location.path == path else location.relative(path)
        if is_parquet(path):
            names = _parquet_names(location.fs, path, source)
        else:
            names = _csv_header(location.fs, path, source)
        for name in names:
            carried = carried_name(name)
            if not name or carried in taken:
                continue
            first, where = found.setdefault(carried, (name, source))
            if first != name:
                also = "" if where == source else f" (and {where} has {first!r})"
                raise InputError(f"{source}: columns {first!r} and {name!r} would both be written as {carried!r}"
                                 f"{also}", hint="rename or remove one of them: a column not in FOCUS is kept "
                                 "with an x_ prefix")
    return [name for name, _ in found.values()]


def _carried(values: pa.Array, column: str, rounded: list[int] | None = None) -> tuple[pa.Array, dict[int, str]]:
    """One carried source column in its carried type; bad values null + reason (`rounded`: see `_money`)."""
    kind = carried_type(column)
    if kind == MONEY:
        return _money(values, rounded)
    if kind == TS:
        return _timestamps(_blank_as_null(values))
    if kind == pa.float64():
        values = _blank_as_null(values)
        try:
            return pc.cast(values, pa.float64()), {}
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return _parse_each(values, lambda item: float(str(item)), pa.float64())
    return _text(values), {}


# --------------------------------------------------------------------------- conversions


def _money(values: pa.Array, rounded: list[int] | None = None) -> tuple[pa.Array, dict[int, str]]:
    """`values` as MONEY, exactly; bad ones become null and are returned as {index: reason}.

    Strings and decimals are cast by Arrow (all-or-nothing); when that fails, value by value with
    `money.amount_to_scale`, which accepts the same values, rounds those with more than SCALE
    places (their count is appended to `rounded`) and says why about the others. Floats become
    their shortest repr first (`money.float_amount`), never through a rounding kernel.
    """
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    count = [0]

    def parse(item) -> Decimal:
        amount, was_rounded = amount_to_scale(str(item))
        count[0] += was_rounded
        return amount

    if pa.types.is_floating(values.type):
        values, parse = _shortest_repr(values), lambda item: float_amount(float(item))
    fast = decimals_as_money(values)
    if fast is not None:
        return fast, {}
    try:
        money = pc.cast(values, MONEY)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        found = _parse_each(values, parse, MONEY)
        if rounded is not None:
            rounded.append(count[0])
        return found
    bounds = pc.min_max(money)  # one pass: the usual batch is all in range
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None or (-LIMIT < low and high < LIMIT):
        return money, {}
    too_big = pc.greater_equal(pc.abs(money), pa.scalar(LIMIT, MONEY))
    if not pc.any(too_big).as_py():
        return money, {}
    bad = {int(index): f"out of range: {str(values[int(index)].as_py())!r} (an amount is below 1e{MAX_DIGITS})"
           for index in np.flatnonzero(pc.fill_null(too_big, False).to_numpy(zero_copy_only=False))}
    return pc.if_else(too_big, pa.scalar(None, MONEY), money), bad


def _shortest_repr(values: pa.Array) -> pa.Array:
    """Floats as the strings Python's `repr` (float64) or NumPy (float16/32) gives: the shortest
    that reads back as the same float."""
    if values.type == pa.float64():
        text = [None if item is None else repr(item) for item in values.to_pylist()]
    else:
        valid = values.is_valid().to_numpy(zero_copy_only=False)
        numbers = values.fill_null(0).to_numpy(zero_copy_only=False)
        text = [str(item) if ok else None for item, ok in zip(numbers, valid, strict=True)]
    return pa.array(text, pa.string())


def _parse_each(values: pa.Array, parse, kind: pa.DataType) -> tuple[pa.Array, dict[int, str]]:
    """The slow path, value by value: what `parse` refuses becomes null, with its reason."""
    out: list = []
    bad: dict[int, str] = {}
    for index, item in enumerate(values.to_pylist()):
        if item is None:
            out.append(None)
            continue
        try:
            out.append(parse(item))
        except ValueError as exc:
            out.append(None)
            bad[index] = str(exc)
    return pa.array(out, type=kind), bad


def _parse_ts(text: str) -> datetime:
    body = re.sub(_NAMED_UTC, "Z", text.strip()).replace(" ", "T", 1)
    if body.endswith(("Z", "z")):
        body = body[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(body)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ValueError(f"not a timestamp: {text!r}") from None


def _timestamps(values: pa.Array) -> tuple[pa.Array, dict[int, str]]:
    """`values` as UTC timestamps (`2024-09-18 22:00:00`, `...T...Z`, offsets); bad ones null + reason.

    Instants outside years 1..9999 (UTC) are bad too: Python cannot represent them.
    """
    stamps, bad = _timestamps_unchecked(values)
    bounds = pc.min_max(stamps)  # one pass: the usual batch is all in range
    if bounds["min"].is_valid and pc.greater_equal(bounds["min"], _FIRST).as_py() and pc.less_equal(
            bounds["max"], _LAST).as_py():
        return stamps, bad
    outside = pc.invert(pc.fill_null(pc.and_(pc.greater_equal(stamps, _FIRST), pc.less_equal(stamps, _LAST)), True))
    if not pc.any(outside).as_py():
        return stamps, bad
    for index in np.flatnonzero(outside.to_numpy(zero_copy_only=False)):
        bad[int(index)] = f"out of range (years 1-9999 UTC): {str(values[int(index)])!r}"
    return pc.if_else(outside, pa.scalar(None, TS), stamps), bad


def _timestamps_unchecked(values: pa.Array) -> tuple[pa.Array, dict[int, str]]:
    if pa.types.is_timestamp(values.type):
        if values.type.tz is None:
            return pc.cast(pc.assume_timezone(values, "UTC"), TS, safe=False), {}
        return pc.cast(values, TS, safe=False), {}
    if pa.types.is_date(values.type):
        return pc.cast(pc.cast(values, pa.timestamp("us")), TS), {}
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if not pa.types.is_string(values.type) and not pa.types.is_large_string(values.type):
        values = pc.cast(values, pa.string())
    values = pc.utf8_trim_whitespace(values)
    for text in (values, pc.replace_substring_regex(values, _NAMED_UTC, "Z")):
        zoned = pc.if_else(pc.match_substring_regex(text, _ZONE), text, pc.binary_join_element_wise(text, "Z", ""))
        try:
            return pc.cast(zoned, TS), {}
        except pa.ArrowInvalid:
            pass
    return _parse_each(values, _parse_ts, TS)


_FLAGS = {"true": True, "false": False, "1": True, "0": False}


def _flag(text: str) -> bool:
    try:
        return _FLAGS[str(text).strip().lower()]
    except KeyError:
        raise ValueError(f"not true/false: {text!r}") from None


def _flags(values: pa.Array) -> tuple[pa.Array, dict[int, str]]:
    """`values` as booleans (true/false/1/0, any case); bad ones null + reason."""
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    try:
        return pc.cast(values, pa.bool_()), {}
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return _parse_each(values, _flag, pa.bool_())


def _text(values: pa.Array) -> pa.Array:
    """`values` as plain strings; a list, struct or map value as its JSON text (`as_json_text`)."""
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if pa.types.is_nested(values.type):
        return as_json_text(values)
    return values if values.type == pa.string() else pc.cast(values, pa.string())


def _blank_as_null(values: pa.Array) -> pa.Array:
    """Text `values` with empty or whitespace-only strings as nulls (other types as they are)."""
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        return values
    blank = pc.equal(pc.utf8_trim_whitespace(values), "")
    return pc.if_else(blank, pa.scalar(None, values.type), values)


@functools.lru_cache(maxsize=8)
def nulls(length: int, kind: pa.DataType) -> pa.Array:
    """An all-null array of `length` values of `kind`, shared between calls (Arrow arrays are
    immutable): every batch of a run has a few columns that were not read, mostly of one length.
    The few kept hold at most ~70 MB (8 of the widest, decimal128, at 500,000 rows)."""
    return pa.nulls(length, kind)


def as_dict(values: pa.Array) -> pa.Array:
    """`values` as dictionary<int32, string> (Parquet's dictionary pages come through as is)."""
    if pa.types.is_dictionary(values.type):
        if values.type == DICT:
            return values
        return pa.DictionaryArray.from_arrays(pc.cast(values.indices, pa.int32()), _text(values.dictionary))
    return pc.dictionary_encode(_text(values))


SOURCE_KEY = "seedance.source"
"""The schema-metadata key naming the billing file a batch of lines was read from (`normalise`)."""


ROUNDED_KEY = "seedance.rounded"
"""The schema-metadata key counting the amounts of a batch's rows (read, rejected ones too) that had
more than `money.SCALE` decimal places and were rounded to it (`normalise`); absent for none."""


def rounded_amounts(batch: pa.RecordBatch) -> int:
    """How many amounts of the rows `batch` was normalised from were rounded to `money.SCALE` places."""
    return int((batch.schema.metadata or {}).get(ROUNDED_KEY.encode(), b"0"))


def source_of(batch: pa.RecordBatch) -> str | None:
    """The billing file a batch of LINES (or a slice or filter of one) was read from; None if unknown."""
    found = (batch.schema.metadata or {}).get(SOURCE_KEY.encode())
    return None if found is None else found.decode()


class LineFiles:
    """Which billing file each staged line comes from, without a column per line: the files in
    the order their lines were written, each with its number of lines (a file's lines are
    contiguous, as the readers yield them). A few bytes per file, whatever the lines."""

    def __init__(self, spans: list[list] | None = None):
        self.names: list[str] = [name for name, _ in spans or []]
        self.ends: list[int] = list(np.cumsum([count for _, count in spans or []], dtype=np.int64).tolist())

    def add(self, name: str, count: int) -> None:
        """`count` more lines written, read from `name`."""
        if not count:
            return
        end = (self.ends[-1] if self.ends else 0) + count
        if self.names and self.names[-1] == name:
            self.ends[-1] = end
        else:
            self.names.append(name)
            self.ends.append(end)

    def file_at(self, position: int) -> str | None:
        """The file of the line at `position` (0-based, in write order); None past the last line."""
        import bisect

        index = bisect.bisect_right(self.ends, position)
        return self.names[index] if index < len(self.names) else None

    def to_json(self) -> list[list]:
        """`[[file, lines], ...]` in write order (what `LineFiles(spans)` takes back)."""
        starts = [0, *self.ends][:-1]
        return [[name, end - start] for name, start, end in zip(self.names, starts, self.ends, strict=True)]


def per_value(values: pa.Array, function) -> pa.Array:
    """`function` applied to each distinct value of a dictionary array (or to every value)."""
    if pa.types.is_dictionary(values.type):
        return function(values.dictionary).take(values.indices)
    return function(values)


def normalise(
    columns: dict[str, pa.Array], first_row: int, source: str, *, default_currency: str | None = None,
    costs: tuple[str, ...] = ("BilledCost", "EffectiveCost"), known: dict[int, tuple[str, str]] | None = None,
    carry: list[str] | tuple[str, ...] = (),
) -> tuple[pa.RecordBatch, Rejected]:
    """One batch of FOCUS-named columns as LINES, and the rows rejected with their reasons.

    A missing or malformed required value (ChargePeriodStart, BillingCurrency, BilledCost,
    EffectiveCost) or a malformed ChargePeriodEnd rejects the row; the other rows go on. `costs`
    narrows the cost columns read and checked (an allocation on one basis needs only that one);
    the other comes back null. `known` adds rejections the caller found ({index: (column, reason)}).
    `carry` names source columns kept as they are (typed, see `lines_schema`); a malformed value
    of a carried cost, number or timestamp rejects the row. The batch names `source` in its
    schema's metadata (`source_of`), not in a column: lines carry no per-line file name.
    """
    length = len(next(iter(columns.values()))) if columns else 0
    reasons: dict[int, tuple[str, str]] = dict(known or {})

    def note(index: int, column: str, reason: str) -> None:
        reasons.setdefault(index, (column, reason))

    def note_nulls(array: pa.Array, column: str) -> None:
        if array.null_count:
            for index in np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False)):
                note(int(index), column, f"missing {column}")

    if "BillingCurrency" not in columns:
        if not default_currency:
            raise InputError(
                f"{source}: no BillingCurrency column", hint="set cost.default_currency or pass --currency"
            )
        columns = {**columns, "BillingCurrency": pa.array([default_currency] * length, pa.string())}
    for name in ["ChargePeriodStart", *costs]:
        if name not in columns:
            raise InputError(f"{source}: no {name} column", hint="a FOCUS file needs " + ", ".join(REQUIRED))

    out: dict[str, pa.Array] = {}
    rounded: list[int] = []  # amounts with more than SCALE places, rounded to SCALE (see `_money`)
    start = columns["ChargePeriodStart"]
    note_nulls(start, "ChargePeriodStart")
    out["ChargePeriodStart"], bad = _timestamps(start)
    for index, reason in bad.items():
        note(index, "ChargePeriodStart", f"malformed ChargePeriodStart: {reason}")
    currency = as_dict(columns["BillingCurrency"])
    trimmed = pc.utf8_trim_whitespace(currency.dictionary)
    if not trimmed.equals(currency.dictionary):
        currency = pc.dictionary_encode(pc.utf8_trim_whitespace(currency.dictionary_decode()))
    note_nulls(currency, "BillingCurrency")
    malformed = pc.fill_null(per_value(currency, lambda v: pc.invert(pc.match_substring_regex(v, CURRENCY_RE))),
                             False)
    if pc.any(malformed).as_py():
        for index in np.flatnonzero(malformed.to_numpy(zero_copy_only=False)):
            note(int(index), "BillingCurrency", f"malformed BillingCurrency: {currency[int(index)].as_py()!r}")
    out["BillingCurrency"] = currency
    for name in ("BilledCost", "EffectiveCost"):
        if name not in costs:
            out[name] = nulls(length, MONEY)
            continue
        note_nulls(columns[name], name)
        out[name], bad = _money(columns[name], rounded)
        for index, reason in bad.items():
            note(index, name, f"malformed {name}: {reason}")
    ends = None
    if "ChargePeriodEnd" in columns and "ChargePeriodEnd" not in carry:  # optional: blank is as good as none
        ends, bad = _timestamps(_blank_as_null(columns["ChargePeriodEnd"]))
        for index, reason in bad.items():
            note(index, "ChargePeriodEnd", f"malformed ChargePeriodEnd: {reason}")
    for name in carry:
        if name not in columns:
            out[carried_name(name)] = nulls(length, carried_type(name))
            continue
        out[carried_name(name)], bad = _carried(columns[name], name, rounded)
        for index, reason in bad.items():
            note(index, name, f"malformed {name}: {reason}")
    if "ChargePeriodEnd" in carry and "ChargePeriodEnd" in columns:
        ends = out["ChargePeriodEnd"]
    if ends is not None:
        for index, reason in _reversed_periods(out["ChargePeriodStart"], ends).items():
            note(index, "ChargePeriodEnd", reason)
    for name in DICT_COLUMNS:
        out[name] = as_dict(columns[name]) if name in columns else nulls(length, DICT)
    for name in PLAIN_COLUMNS:
        out[name] = _text(columns[name]) if name in columns else nulls(length, pa.string())
    estimated = columns.get("x_Estimated")
    if estimated is None:
        out["x_Estimated"] = pa.array(np.zeros(length, bool))
    else:
        out["x_Estimated"], bad = _flags(estimated)
        for index, reason in bad.items():
            note(index, "x_Estimated", f"malformed x_Estimated: {reason}")
    out["x_Row"] = pa.array(np.arange(first_row, first_row + length, dtype=np.int64))

    metadata = {SOURCE_KEY: source, **({ROUNDED_KEY: str(sum(rounded))} if sum(rounded) else {})}
    schema = (lines_schema(carry) if carry else LINES).with_metadata(metadata)
    batch = pa.RecordBatch.from_arrays([out[field.name] for field in schema], schema=schema)
    rejected: Rejected = []
    if reasons:
        keep = np.ones(length, bool)
        keep[list(reasons)] = False
        batch = batch.filter(pa.array(keep))
        indices = sorted(reasons)  # formatted in one pass: a month can hold millions of bad lines
        months = _utc_text(out["ChargePeriodStart"].take(pa.array(indices, pa.int64())), "M")
        rejected = [{"file": source, "row": first_row + index, "column": reasons[index][0],
                     "reason": reasons[index][1], "month": month} for index, month in zip(indices, months, strict=True)]
    return batch, rejected


def _reversed_periods(starts: pa.Array, ends: pa.Array) -> dict[int, str]:
    """{index: reason} of the lines whose ChargePeriodEnd is before their ChargePeriodStart."""
    if ends.null_count == len(ends):
        return {}
    before = pc.fill_null(pc.less(ends, starts), False)
    if not pc.any(before).as_py():
        return {}
    indices = pa.array(np.flatnonzero(before.to_numpy(zero_copy_only=False)))
    texts = [_utc_text(values.take(indices), "s") for values in (ends, starts)]
    return {index: f"ChargePeriodEnd {end.replace('T', ' ')} is before ChargePeriodStart {start.replace('T', ' ')}"
            for index, end, start in zip(indices.to_pylist(), *texts, strict=True)}


def _utc_text(stamps: pa.Array, unit: str) -> list[str | None]:
    """Each UTC timestamp as ISO text to `unit` ("M": `YYYY-MM`, "s": `YYYY-MM-DDTHH:MM:SS`, the
    finer part dropped, years padded to 4 digits); None for a null."""
    values = stamps.to_numpy(zero_copy_only=False)
    texts = np.datetime_as_string(values, unit=unit).tolist()
    if stamps.null_count:
        return [None if null else text for text, null in zip(texts, np.isnat(values).tolist(), strict=True)]
    return texts


# --------------------------------------------------------------------------- FOCUS files


BILLING_SUFFIXES = (".csv", ".csv.gz", ".parquet")


def is_parquet(path: str) -> bool:
    """True if `path` names a Parquet file (`.parquet`, any case)."""
    return path.lower().endswith(".parquet")


def _is_billing(path: str) -> bool:
    return path.lower().endswith(BILLING_SUFFIXES)


def billing_files(uri: str) -> list[tuple[storage.Location, str]]:
    """The billing files at `uri`: the file itself, or every visible .csv/.csv.gz/.parquet (any case) below a folder."""
    location = storage.resolve(uri)
    files = [info for info in storage.list_files(location) if _is_billing(info.path)]
    if not files:
        raise InputError(f"no billing files (.csv, .csv.gz, .parquet) at {uri}", hint="check --billing")
    _refuse_copies(location, files)
    return [(location, info.path) for info in files]


def _refuse_copies(location: storage.Location, files: list) -> None:
    """InputError naming both files when a billing folder holds one export twice, which would charge
    every line of it twice: `x.csv` beside `x.csv.gz` (an archive and its unpacked copy), or two
    files byte for byte the same (`focus (1).csv`, a second download) with data in them. Only files
    of equal size are read (hashed) for it."""
    hint = "remove the copy from the billing folder: Seedance reads every billing file in it"
    names = {info.path.lower(): info.path for info in files}
    for info in files:
        twin = names.get(info.path.lower() + ".gz")
        if twin is not None:
            raise InputError(f"{location.relative(info.path)} and {location.relative(twin)} look like one export, "
                             "unpacked and packed: each line would be charged twice", hint=hint)
    by_size: dict[int, list[str]] = {}
    for info in files:
        by_size.setdefault(info.size, []).append(info.path)
    for size, paths in by_size.items():
        if len(paths) < 2 or not size:
            continue
        seen: dict[str, str] = {}
        for path in paths:
            digest = hashlib.sha256(storage.read_bytes(location.fs, path)).hexdigest() if size <= 1 << 26 else \
                _streamed_digest(location.fs, path)
            first = seen.setdefault(digest, path)
            if first != path and _has_rows(location.fs, path):
                raise InputError(f"{location.relative(first)} and {location.relative(path)} are the same file, byte "
                                 f"for byte ({size:,} bytes): each line would be charged twice", hint=hint)


def _streamed_digest(fs, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open_input_stream(path) as stream:
        while chunk := stream.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _has_rows(fs, path: str) -> bool:
    """True unless the billing file at `path` plainly holds no line (a header-only CSV, a Parquet
    file of 0 rows: parts of an export may be that, and alike)."""
    try:
        if is_parquet(path):
            with fs.open_input_file(path) as handle:
                return pq.ParquetFile(handle).metadata.num_rows > 0
        with fs.open_input_stream(path, compression=_compression(path)) as stream:
            head = stream.read(1 << 20)
        return len([line for line in head.splitlines() if line.strip(b"\x00\r\n\t ")]) > 1
    except (pa.ArrowInvalid, OSError):
        return True  # unreadable: the reader names it


def skipped_files(uri: str) -> list[str]:
    """The visible files at `uri` that are not billing files (by name), which the readers leave out."""
    location = storage.resolve(uri)
    return [location.relative(info.path) or posixpath.basename(info.path)
            for info in storage.list_files(location) if not _is_billing(info.path)]


def _wanted(source: str, names: list[str], columns: list[str]) -> list[str]:
    """The `columns` among a file's column `names`; InputError if one of them appears twice."""
    wanted = [name for name in names if name in columns]
    for name in dict.fromkeys(wanted):
        if wanted.count(name) > 1:
            raise InputError(f"{source}: column {name!r} appears {wanted.count(name)} times in the header",
                             hint="remove or rename the duplicate: Seedance cannot tell which one holds the data")
    return wanted


def _compression(path: str) -> str | None:
    """How a CSV billing file is compressed, by its name (any case: Arrow's "detect" knows `.gz` only)."""
    return "gzip" if path.lower().endswith(".gz") else None


DELIMITERS = (",", ";", "\t", "|")
"""The field separators a CSV billing file may use (a spreadsheet's export in many locales: `;`)."""


def _csv_header(fs, path: str, source: str) -> list[str]:
    """The column names of a CSV billing file, FOCUS ones spelt as `focus_names` spells them."""
    return _csv_head(fs, path, source)[0]


_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
"""Byte-order marks and the Python codec that reads past them (UTF-32's first: it starts like UTF-16's)."""


def text_encoding(head: bytes) -> str:
    """The encoding of a CSV file that starts with `head`: the one its byte-order mark names
    (UTF-8, UTF-16, UTF-32, as spreadsheets and Windows tools export), UTF-16 without one when
    every other byte of the start is NUL (an ASCII header in UTF-16), else UTF-8."""
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            return encoding
    pairs = head[:64]
    if len(pairs) >= 4 and not any(pairs[1::2]) and all(pairs[0::2]):
        return "utf-16-le"
    if len(pairs) >= 4 and not any(pairs[0::2]) and all(pairs[1::2]):
        return "utf-16-be"
    return "utf-8-sig"


def decode_text(data: bytes) -> str:
    """A small CSV file's bytes as text, in its `text_encoding` (UTF-8, or the UTF-16/32 a byte-order
    mark names); ValueError saying which line and byte offset is not text in it (`can't decode ...`)."""
    encoding = text_encoding(data)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1 if encoding == "utf-8-sig" else None
        where = f"line {line}" if line else "the text"
        raise ValueError(f"can't decode {where} as {encoding.removesuffix('-sig').upper()} (byte "
                         f"0x{data[exc.start:exc.end].hex()} at byte offset {exc.start:,})") from None


def _arrow_encoding(encoding: str) -> str:
    """`encoding` as Arrow's CSV reader takes it: its own UTF-8 decoder (which skips a UTF-8 BOM) for
    UTF-8, Python's codec (transcoding the stream) for the others."""
    return "utf8" if encoding == "utf-8-sig" else encoding


def _csv_head(fs, path: str, source: str) -> tuple[list[str], str, str]:
    """A CSV billing file's column names (see `_csv_header`), its delimiter: of `DELIMITERS`, the
    one that splits the header line into the most fields (`,` on a tie), and its `text_encoding`;
    InputError naming the file when it has no header."""
    try:  # a `.gz` that is not gzip fails here, as an OSError (zlib's), not a storage error
        with fs.open_input_stream(path, compression=_compression(path)) as stream:
            raw = stream.read(1 << 16)
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, FileNotFoundError | PermissionError):
            raise
        raise unreadable_billing(source, exc) from None
    encoding = text_encoding(raw)
    head = raw.decode(encoding, errors="replace")
    try:
        headers = {delimiter: next(csv.reader(io.StringIO(head, newline=""), delimiter=delimiter), None) or []
                   for delimiter in DELIMITERS}
    except csv.Error as exc:
        raise unreadable_billing(source, exc) from None
    delimiter = max(DELIMITERS, key=lambda each: len(headers[each]))
    header = headers[delimiter]
    if not header or not any(name.strip() for name in header):
        raise InputError(f"{source}: empty file, no header line",
                         hint="a FOCUS CSV starts with a header naming its columns: " + ", ".join(REQUIRED))
    return focus_names([name.strip() for name in header]), delimiter, encoding


def _undecodable(fs, path: str, source: str, encoding: str, delimiter: str) -> InputError:
    """The error for a CSV billing file with bytes that are not text in its `encoding`, naming the
    file, the data row and the byte offset of the first such byte (in the decompressed text of a
    `.gz`). Only on that failure: the file is streamed up to that byte, twice at most."""
    decoder = codecs.getincrementaldecoder(encoding)("strict")
    offset, found, byte = 0, None, b""
    with fs.open_input_stream(path, compression=_compression(path)) as stream:
        while found is None and (chunk := stream.read(1 << 20)):
            pending = decoder.getstate()[0]
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as exc:  # its positions count the bytes it held back too
                found = offset - len(pending) + exc.start
                byte = (pending + chunk)[exc.start:exc.end]
            offset += len(chunk)
    if found is None:
        return unreadable_billing(source, ValueError(f"not {encoding} text"))
    row = _data_row_at(fs, path, encoding, delimiter, found)
    where = "the header line" if row == 0 else f"data row {row:,}"
    return InputError(f"{source}: {where} is not {encoding.removesuffix('-sig').upper()} text (byte 0x{byte.hex()} "
                      f"at byte offset {found:,}{' of the decompressed file' if _compression(path) else ''})",
                      hint="export the file as UTF-8 (UTF-16 and UTF-8 with a byte-order mark are read as they "
                      "are); to convert a Latin-1 or Windows-1252 export: iconv -f CP1252 -t UTF-8 FILE > NEW.csv")


def _data_row_at(fs, path: str, encoding: str, delimiter: str, offset: int) -> int:
    """The 1-based data row (0: the header) of the record holding the byte at `offset`, counting
    records as the readers do (quoted newlines inside a record, empty lines none)."""
    def lines() -> Iterator[str]:
        decoder = codecs.getincrementaldecoder(encoding)("strict")
        left, tail = offset, ""
        with fs.open_input_stream(path, compression=_compression(path)) as stream:
            while left and (chunk := stream.read(min(left, 1 << 20))):
                left -= len(chunk)
                *whole, tail = (tail + decoder.decode(chunk)).splitlines(keepends=True) or [""]
                yield from whole
        yield tail + "?"  # the bad record's start ("?": where the bad byte was, so it is a record)

    records = 0
    try:
        for record in csv.reader(lines(), delimiter=delimiter):
            records += bool(record)
    except csv.Error:  # the bad byte was inside a quoted field: its record is the one cut short
        records += 1
    return records - 1


OTHER_EXPORTS: list[tuple[str, tuple[frozenset[str], ...], str]] = [
    ("an AWS CUR 2.0 export", (frozenset({"line_item_unblended_cost", "line_item_usage_start_date"}),),
     "pass it with --format cur (Seedance reads CUR 2.0 as Parquet: for a CSV export, set its file format to "
     "Parquet in AWS Data Exports), or create a FOCUS export there and pass that"),
    ("a legacy AWS Cost and Usage Report (CUR 1)",
     (frozenset({"lineitem/unblendedcost", "lineitem/usagestartdate"}), frozenset({"identity/lineitemid"})),
     "create a CUR 2.0 export as Parquet in AWS Data Exports and pass it with --format cur, or create a FOCUS "
     "export there and pass that"),
    ("an Azure cost details (EA/MCA usage) export",
     (frozenset({"metercategory", "date", "costinbillingcurrency"}), frozenset({"metercategory", "date", "cost"}),
      frozenset({"metercategory", "usagedatetime", "pretaxcost"})),
     "in Azure Cost Management create an export of the 'Cost and usage details (FOCUS)' type and pass its files"),
    ("a Google Cloud billing export (BigQuery)",
     (frozenset({"usage_start_time", "cost", "billing_account_id"}), frozenset({"usage_start_time", "cost", "sku"}),
      frozenset({"usage_start_time", "cost", "sku.description"})),
     "query the billing export through Google Cloud's FOCUS view in BigQuery and export that result as CSV or "
     "Parquet"),
    ("an Oracle Cloud (OCI) cost report",
     (frozenset({"lineitem/intervalusagestart", "cost/mycost"}),),
     "pass OCI's FOCUS reports instead (the FOCUS Reports folder of the usage-report bucket)"),
]
"""Billing exports that are not FOCUS, each as (what it is, column sets of which one identifies it
(names compared case-folded), what to do instead)."""


def refuse_other_export(source: str, names: list[str]) -> None:
    """InputError naming `source` and what it is when its column `names` lack ChargePeriodStart and
    identify one of OTHER_EXPORTS (a provider's own schema), with what to pass instead; else nothing."""
    if "ChargePeriodStart" in names:
        return
    folded = {name.casefold() for name in names}
    for kind, signatures, hint in OTHER_EXPORTS:
        signature = next((each for each in signatures if each <= folded), None)
        if signature is not None:
            shown = ", ".join(name for name in names if name.casefold() in signature)
            raise InputError(f"{source}: this looks like {kind}, not a FOCUS file: it has {shown} and no "
                             "ChargePeriodStart column", hint=hint)


def _csv_batches(fs, path: str, source: str, batch_rows: int, columns: list[str]) -> Iterator[dict[str, pa.Array]]:
    import pyarrow.csv as pacsv

    header, delimiter, encoding = _csv_head(fs, path, source)
    refuse_other_export(source, header)
    wanted = _wanted(source, header, columns)
    if not wanted:
        return
    stream = fs.open_input_stream(path, compression=_compression(path))
    counted = _QuoteCount(stream) if encoding == "utf-8-sig" else None

    def joined(pending: list[pa.RecordBatch]) -> dict[str, pa.Array]:
        table = pa.Table.from_batches(pending).combine_chunks()
        return {name: table.column(name).chunk(0) if table.num_rows else pa.array([], pa.string()) for name in wanted}

    done = 0  # data rows yielded
    try:  # open_csv reads the first block already
        reader = pacsv.open_csv(
            counted or stream,
            read_options=pacsv.ReadOptions(block_size=8 << 20, column_names=header, skip_rows=1,
                                           encoding=_arrow_encoding(encoding)),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(
                column_types={name: pa.string() for name in header},
                null_values=NULL_STRINGS,
                strings_can_be_null=True,
                include_columns=wanted,
            ),
        )
        pending: list[pa.RecordBatch] = []
        size = 0
        for batch in reader:
            pending.append(batch)
            size += batch.num_rows
            if size >= batch_rows:
                yield joined(pending)
                done += size
                pending, size = [], 0
        if counted is not None and counted.quotes % 2:
            _check_quotes_close(fs, path, source, encoding, delimiter)
        if pending:
            yield joined(pending)
        return
    except UnicodeDecodeError:  # from Python's codec, transcoding for Arrow
        raise _undecodable(fs, path, source, encoding, delimiter) from None
    except pa.ArrowInvalid as exc:
        if "invalid UTF8" in str(exc):
            raise _undecodable(fs, path, source, encoding, delimiter) from None
        if not _RAGGED.search(str(exc)):
            raise
    finally:
        stream.close()
    yield from _csv_records(fs, path, source, batch_rows, header, wanted, delimiter=delimiter, skip=done,
                            encoding=encoding)


class _QuoteCount:
    """A binary stream that counts the `"` bytes read through it (a UTF-8 CSV's quotes; for Arrow's
    reader, which reads it in blocks): a well-formed CSV has an even number of them."""

    def __init__(self, stream):
        self.stream, self.quotes = stream, 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.quotes += data.count(b'"')
        return data

    @property
    def closed(self) -> bool:
        return self.stream.closed

    def close(self) -> None:
        self.stream.close()


def _check_quotes_close(fs, path: str, source: str, encoding: str, delimiter: str) -> None:
    """InputError naming the file and data row when the CSV file ends inside a quoted field (a
    download or export cut short there: Arrow's reader would take the rest of the file as that
    field's value, silently); nothing when its odd count of quotes has another cause (a literal
    `"` inside an unquoted field). Python's csv, strict, tells the two apart; one pass."""
    records = 0
    with fs.open_input_stream(path, compression=_compression(path)) as stream:
        try:
            for record in csv.reader(io.TextIOWrapper(stream, encoding=encoding, newline=""), delimiter=delimiter,
                                     strict=True):
                records += bool(record)
        except csv.Error as exc:
            if "unexpected end of data" not in str(exc):
                return  # another irregularity, which Arrow's reader reads as it always has
            raise InputError(f"{source}: data row {records:,} opens a quoted field that never closes: the file "
                             "ends inside it, as a download or export cut short does",
                             hint="download or export the file again (compare its size with the source's)") from None


_RAGGED = re.compile(r"CSV parse error: Expected \d+ columns, got \d+")
"""Arrow's error for a CSV row with more or fewer fields than the header."""


class RawColumns(dict):
    """One batch of a billing file's columns as read, `{name: array}`, and in `known` the rows that
    could not be read ({index: (column, reason)}; their values are null): what `normalise` rejects."""

    def __init__(self, columns: dict[str, pa.Array], known: dict[int, tuple[str | None, str]]):
        super().__init__(columns)
        self.known = known


def _csv_records(fs, path: str, source: str, batch_rows: int, header: list[str], wanted: list[str], *,
                 delimiter: str, skip: int, encoding: str = "utf-8-sig") -> Iterator[RawColumns]:
    """The rows of a CSV billing file after its first `skip` data rows, record by record (Python's
    csv, slower than Arrow's reader), for a file with a row of more or fewer fields than the header:
    such a row comes as nulls, in `known`, so it is rejected with its row number and the others go on.
    Rows are counted as Arrow counts them (empty lines are none)."""
    positions = [header.index(name) for name in wanted]
    nulls_ = set(NULL_STRINGS)
    try:
        with fs.open_input_stream(path, compression=_compression(path)) as stream:
            text = io.TextIOWrapper(stream, encoding=encoding, newline="")
            records = (record for record in csv.reader(text, delimiter=delimiter) if record)
            for _ in itertools.islice(records, skip + 1):  # the header, then the rows already read
                pass
            while chunk := list(itertools.islice(records, batch_rows)):
                known: dict[int, tuple[str | None, str]] = {}
                values: list[list[str | None]] = [[] for _ in wanted]
                for index, record in enumerate(chunk):
                    if len(record) != len(header):
                        known[index] = (None, f"the row has {len(record)} fields, the header {len(header)}")
                    for column, position in zip(values, positions, strict=True):
                        value = record[position] if index not in known else None
                        column.append(None if value is None or value in nulls_ else value)
                yield RawColumns({name: pa.array(column, pa.string()) for name, column in zip(wanted, values,
                                                                                               strict=True)}, known)
    except UnicodeDecodeError:
        raise _undecodable(fs, path, source, encoding, delimiter) from None
    except csv.Error as exc:
        raise unreadable_billing(source, exc) from None
    _check_quotes_close(fs, path, source, encoding, delimiter)  # this slow path reads the file twice


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def as_json_text(values: pa.Array) -> pa.Array:
    """A list, struct or map column as JSON text, what a FOCUS CSV holds (a map as an object, null
    stays null); values JSON has no type for (timestamps, decimals, bytes) as their text."""
    is_map = pa.types.is_map(values.type)

    def text(row):
        if row is None:
            return None
        return json.dumps(dict(row) if is_map else row, sort_keys=True, default=str)

    return pa.array([text(row) for row in values.to_pylist()], pa.string())


def _tags_reader(source: str, schema: pa.Schema) -> Any:
    """How to read a Parquet file's Tags column: None as text (or as the nulls of a column of type
    null: an export whose lines are all untagged), `as_json_text` for a map or struct; InputError
    naming the file, column and type for any other type."""
    if "Tags" not in schema.names:
        return None
    kind = schema.field("Tags").type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if _is_text(kind) or pa.types.is_null(kind):
        return None
    if pa.types.is_map(kind) or pa.types.is_struct(kind):
        return as_json_text
    raise InputError(f"{source}: column 'Tags' has type {kind}, which Seedance cannot read as tags",
                     hint="Tags holds a JSON object as text, a map<string, string> or a struct of strings")


def _plain_strings(values: pa.Array) -> pa.Array:
    """`values` with large or view strings (as polars and DuckDB write them) as plain strings, also
    inside a dictionary: the kernels the readers use take plain ones only."""
    kind = values.type.value_type if pa.types.is_dictionary(values.type) else values.type
    if not (pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        return values
    if pa.types.is_dictionary(values.type):
        return pa.DictionaryArray.from_arrays(values.indices, pc.cast(values.dictionary, pa.string()))
    return pc.cast(values, pa.string())


def _parquet_batches(fs, path: str, source: str, batch_rows: int, columns: list[str]) -> Iterator[dict[str, pa.Array]]:
    handle = fs.open_input_file(path)
    try:
        stored = pq.ParquetFile(handle).schema_arrow
        schema = pa.schema([field.with_name(name) for field, name in zip(stored, focus_names(stored.names),
                                                                         strict=True)])
        in_file = dict(zip(schema.names, stored.names, strict=True))  # FOCUS spelling -> the file's
        refuse_other_export(source, schema.names)
        wanted = _wanted(source, schema.names, columns)
        if not wanted:
            return
        tags = _tags_reader(source, schema) if "Tags" in wanted else None
        # Parquet dictionary pages are read as they are, for text columns (a map or number cannot be)
        dictionary = [in_file[name] for name in ("BillingCurrency", *DICT_COLUMNS)
                      if name in wanted and _is_text(schema.field(name).type)]
        # no pre_buffer: it would hold every row group's compressed chunks at once (memory growing
        # with the file: +390 MB at 50M lines); read one column chunk at a time, it is faster too
        parquet = pq.ParquetFile(handle, read_dictionary=dictionary, pre_buffer=False)
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=[in_file[name] for name in wanted],
                                          use_threads=True):
            read = {name: _plain_strings(batch.column(in_file[name])) for name in wanted}
            if tags is not None:
                read["Tags"] = tags(read["Tags"])
            yield read
    except pa.ArrowInvalid as exc:  # not Parquet, truncated, a damaged page
        raise unreadable_billing(source, exc) from None
    finally:
        handle.close()


def _parquet_names(fs, path: str, source: str) -> list[str]:
    """The column names of the Parquet file at `path`; InputError naming `source` if it is not one."""
    with fs.open_input_file(path) as handle:
        try:
            return focus_names(pq.ParquetFile(handle).schema_arrow.names)
        except pa.ArrowInvalid as exc:
            raise unreadable_billing(source, exc) from None


def unreadable_billing(source: str, exc: Exception) -> InputError:
    """The error for a billing file the reader cannot parse (not CSV/Parquet, truncated, damaged), naming it."""
    return InputError(f"{source}: unreadable billing file ({exc})",
                      hint="it must be a whole CSV or Parquet export: download or export it again, or move it "
                      "out of the billing folder")


@dataclass(frozen=True)
class FocusChunk:
    """One batch of a FOCUS file's columns as read, before `normalise` (which `lines` runs).

    Reading is sequential; normalising a chunk needs nothing from the others, so chunks can be
    normalised on any thread (`allocate_month` does, on both cores).
    """

    columns: dict[str, pa.Array]
    first_row: int
    source: str
    default_currency: str | None
    costs: tuple[str, ...]
    carry: tuple[str, ...]

    def lines(self) -> tuple[pa.RecordBatch, Rejected]:
        """The chunk as LINES and its rejected rows; an unreadable value is an InputError naming the file."""
        try:
            return normalise(self.columns, self.first_row, self.source, default_currency=self.default_currency,
                             costs=self.costs, carry=self.carry, known=getattr(self.columns, "known", None))
        except pa.ArrowInvalid as exc:
            raise unreadable_billing(self.source, exc) from None


def focus_chunks(
    uri: str, *, batch_rows: int = 500_000, default_currency: str | None = None, columns: list[str] | None = None,
    costs: tuple[str, ...] = ("BilledCost", "EffectiveCost"), carry: list[str] | tuple[str, ...] = (),
) -> Iterator[FocusChunk]:
    """The FOCUS files at `uri` (CSV, plain or .gz, or Parquet; a file or a folder, local or S3)
    as chunks of at most `batch_rows` rows, in file order; see `read_focus` for the arguments."""
    base = {"ChargePeriodStart", "BillingCurrency", *costs}
    wanted = READ_COLUMNS if columns is None else [name for name in READ_COLUMNS if name in {*base, *columns}]
    wanted = [*wanted, *(name for name in carry if name not in wanted)]
    for location, path in billing_files(uri):
        source = posixpath.basename(path) if location.path == path else location.relative(path)
        raw = _parquet_batches if is_parquet(path) else _csv_batches
        first = 1
        try:
            for read in raw(location.fs, path, source, batch_rows, wanted):
                yield FocusChunk(read, first, source, default_currency, tuple(costs), tuple(carry))
                first += len(next(iter(read.values())))
        except (pa.ArrowInvalid, OSError) as exc:
            raise unreadable_billing(source, exc) from None
        if first == 1 and not _has_columns(location.fs, path, source, base, raw):
            raise InputError(f"{source}: none of the FOCUS columns {', '.join(sorted(base))} found",
                             hint="is this a FOCUS file? CUR 2.0 exports need --format cur")


def read_focus(
    uri: str, *, batch_rows: int = 500_000, default_currency: str | None = None, columns: list[str] | None = None,
    costs: tuple[str, ...] = ("BilledCost", "EffectiveCost"), carry: list[str] | tuple[str, ...] = (),
) -> Iterator[tuple[pa.RecordBatch, Rejected]]:
    """FOCUS lines from a CSV (plain or .gz) or Parquet file, or a folder of them, local or S3.

    `columns` limits what is read (ChargePeriodStart, BillingCurrency and the `costs` always
    are); the others come back null. `carry` (see `carried_columns`) adds source columns kept
    as they are, for a FOCUS output (`lines_schema(carry)`).
    """
    for chunk in focus_chunks(uri, batch_rows=batch_rows, default_currency=default_currency, columns=columns,
                              costs=costs, carry=carry):
        yield chunk.lines()


def _has_columns(fs, path: str, source: str, base: set[str], raw) -> bool:
    """True if the file at `path` (which had no data rows) names at least one of the `base` columns."""
    if raw is _csv_batches:
        return bool(base & set(_csv_header(fs, path, source)))
    return bool(base & set(_parquet_names(fs, path, source)))


# --------------------------------------------------------------------------- AWS CUR 2.0


def read_cur(uri: str, *, batch_rows: int = 500_000, carry: list[str] | tuple[str, ...] = ()
             ) -> Iterator[tuple[pa.RecordBatch, Rejected]]:
    """AWS CUR 2.0 Parquet lines as FOCUS lines: see `cur_focus.read_cur` (the column mapping lives there)."""
    from seedance_tasks.cost.cur_focus import read_cur as read

    return read(uri, batch_rows=batch_rows, carry=carry)


# --------------------------------------------------------------------------- Cost Explorer


def month_bounds(month: str) -> tuple[datetime, datetime]:
    """[first instant, first instant of the next month) of exactly `YYYY-MM`, UTC; UsageError otherwise."""
    from seedance_tasks.cost.workdays import month_close, parse_month

    year, number = parse_month(month)
    end = month_close(month)
    return datetime(year, number, 1, tzinfo=UTC), datetime(end.year, end.month, end.day, tzinfo=UTC)


def cost_explorer_pages(
    month: str, *, group_tag: str, cache: storage.Location, client=None, refresh: bool = False,
    now: datetime | None = None,
) -> tuple[list[dict], dict[str, Any]]:
    """GetCostAndUsage pages for `month` (monthly, grouped by tag `group_tag` and SERVICE), cached.

    A closed month already in the cache is never queried again unless `refresh`; an open month
    is queried each time. Returns (pages, {"pages_queried", "from_cache", "estimated"}).
    """
    start, end = month_bounds(month)
    now = now or datetime.now(UTC)
    cache_path = cache.join("cost-explorer", f"{month}-{group_tag}.json")
    closed = end <= now
    if closed and not refresh and storage.is_file(cache.fs, cache_path):
        pages = _cached_pages(cache, cache_path)
        return pages, {"pages_queried": 0, "from_cache": True, "estimated": _estimated(pages)}
    client = client or storage.boto3_client("ce")
    request = {
        "TimePeriod": {"Start": start.strftime("%Y-%m-%d"), "End": end.strftime("%Y-%m-%d")},
        "Granularity": "MONTHLY",
        "Metrics": ["AmortizedCost", "UnblendedCost"],
        "GroupBy": [{"Type": "TAG", "Key": group_tag}, {"Type": "DIMENSION", "Key": "SERVICE"}],
    }
    pages, token = [], None
    while True:
        response = client.get_cost_and_usage(**request, **({"NextPageToken": token} if token else {}))
        response.pop("ResponseMetadata", None)
        pages.append(response)
        token = response.get("NextPageToken")
        if not token:
            break
    storage.write_json_atomic(cache.fs, cache_path, pages)
    return pages, {"pages_queried": len(pages), "from_cache": False, "estimated": _estimated(pages)}


def _cached_pages(cache: storage.Location, path: str) -> list[dict]:
    """The Cost Explorer pages cached at `path`; InputError naming it unless it is a JSON list of
    response objects (each `ResultsByTime` a list of objects, each `Groups` a list of objects)."""
    try:
        pages = storage.read_json(cache.fs, path)
        valid = isinstance(pages, list) and all(
            isinstance(page, dict) and isinstance(page.get("ResultsByTime", []), list)
            and all(isinstance(result, dict) and isinstance(result.get("Groups", []), list)
                    and all(isinstance(group, dict) for group in result.get("Groups", []))
                    for result in page.get("ResultsByTime", []))
            for page in pages)
        problem = None if valid else "not a list of GetCostAndUsage responses"
    except (ValueError, UnicodeDecodeError) as exc:
        problem = f"not JSON: {exc}"
    if problem:
        raise InputError(f"{cache.uri_of(path)}: malformed Cost Explorer cache ({problem})",
                         hint="pass --refresh to query Cost Explorer again and rewrite it")
    return pages


def _estimated(pages: list[dict]) -> bool:
    return any(result.get("Estimated") for page in pages for result in page.get("ResultsByTime", []))


def read_cost_explorer(pages: list[dict], *, group_tag: str) -> Iterator[tuple[pa.RecordBatch, Rejected]]:
    """Cost Explorer groups as FOCUS lines: one per (tag value, service); `tag$` (untagged) has no tag."""
    columns: dict[str, list] = {name: [] for name in REQUIRED + ["ServiceName", "Tags", "x_Estimated"]}
    def obj(value) -> dict:  # a cached page is a file: any part of it may be of another type
        return value if isinstance(value, dict) else {}

    def text(value) -> str | None:
        return None if value is None else str(value)

    for page in pages:
        for result in page.get("ResultsByTime", []):
            for group in result.get("Groups", []):
                keys = [str(key) for key in group.get("Keys") or []] if isinstance(group.get("Keys"), list) else []
                tag_value = keys[0].split("$", 1)[1] if keys and "$" in keys[0] else ""
                metrics = obj(group.get("Metrics"))
                amortized = obj(metrics.get("AmortizedCost"))
                unblended = obj(metrics.get("UnblendedCost"))
                columns["ChargePeriodStart"].append(text(obj(result.get("TimePeriod")).get("Start")))
                columns["BillingCurrency"].append(text(unblended.get("Unit") or amortized.get("Unit")))
                columns["BilledCost"].append(text(unblended.get("Amount")))
                columns["EffectiveCost"].append(text(amortized.get("Amount")))
                columns["ServiceName"].append(keys[1] if len(keys) > 1 else None)
                columns["Tags"].append(json.dumps({group_tag: tag_value}) if tag_value else None)
                columns["x_Estimated"].append(bool(result.get("Estimated")))
    arrays = {
        name: pa.array(values, pa.bool_() if name == "x_Estimated" else pa.string())
        for name, values in columns.items()
    }
    yield normalise(arrays, 1, "cost-explorer")
