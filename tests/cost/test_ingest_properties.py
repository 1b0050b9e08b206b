"""Property tests of billing ingest (hypothesis): random FOCUS rows, good and bad values in every
column, as CSV and as Parquet with float, decimal and string cost columns, in batches of any
size. Every row is accepted exactly (Decimal equal, same instant) or rejected with its row number,
a column that is bad in it and a reason; never an exception."""

from __future__ import annotations

import csv
import math
import os
from datetime import UTC, datetime, timedelta
from decimal import Decimal, localcontext

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seedance_tasks.cost import ingest

SETTINGS = settings(
    max_examples=int(os.environ.get("SEEDANCE_HYPOTHESIS_EXAMPLES", "60")),  # more for a deeper search
    deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
)
BAD = object()
"""Marks a cell that must get its row rejected."""

# ------------------------------------------------------------------------------ cells: (text, expected or BAD)

def _unscaled_decimals():
    """Exact amounts MONEY holds: at most 12 places, |value| < 1e18."""
    return st.integers(0, 12).flatmap(
        lambda places: st.integers(-(10 ** (18 + places)) + 1, 10 ** (18 + places) - 1).map(
            lambda unscaled: Decimal(f"{unscaled}e-{places}")))  # exact: scaleb would round to 28 digits


def _amount_texts(value: Decimal):
    with localcontext(prec=100):
        plain = format(value, "f")
    return st.sampled_from([str(value), plain, f" {plain} ", plain if plain.startswith("-") else "+" + plain,
                            format(value, "E") if value else plain])


GOOD_AMOUNTS = st.one_of(
    _unscaled_decimals(),
    st.sampled_from([Decimal("0"), Decimal("-0"), Decimal("0.1"), Decimal("-2.6137"), Decimal("1e16"),
                     Decimal("999999999999999999.999999999999")]),
).flatmap(lambda value: _amount_texts(value).map(lambda text: (text, value)))
ROUNDED_AMOUNTS = st.sampled_from([  # more than 12 places: rounded half-even to 12, kept
    ("0.0000000000001", Decimal("0")), ("0.0000000000005", Decimal("0")), ("0.0000000000015", Decimal("2e-12")),
    ("-0.0005459213038081", Decimal("-0.000545921304")), ("1.000000000000500000001", Decimal("1.000000000001"))])
BAD_AMOUNTS = st.sampled_from(["12,50", "abc", "nan", "-Infinity", "1e30", "1e18", "-1000000000000000000",
                               "999999999999999999.9999999999999", "1_000", "0x10", "1e", "..5", "١٢"]).map(
    lambda t: (t, BAD))
MISSING = st.sampled_from(["", "NULL"]).map(lambda text: (text, BAD))
AMOUNTS = st.one_of(GOOD_AMOUNTS, GOOD_AMOUNTS, GOOD_AMOUNTS, ROUNDED_AMOUNTS, BAD_AMOUNTS, MISSING)

INSTANTS = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2030, 12, 31))
GOOD_STARTS = st.one_of(
    INSTANTS.map(lambda d: d.replace(microsecond=0)).map(
        lambda d: (d.strftime("%Y-%m-%d %H:%M:%S"), d.replace(tzinfo=UTC))),
    INSTANTS.map(lambda d: (d.isoformat() + "Z", d.replace(tzinfo=UTC))),
    st.tuples(INSTANTS.map(lambda d: d.replace(microsecond=0)), st.integers(-14 * 4, 14 * 4)).map(
        lambda pair: (pair[0].isoformat() + _offset(pair[1] * 15),
                      (pair[0] - timedelta(minutes=pair[1] * 15)).replace(tzinfo=UTC))),
)
BAD_STARTS = st.sampled_from(["2024-13-45 00:00:00", "yesterday", "2024-02-30", "2024-09-01T24:00:00",
                              "9999-12-31T23:59:59-05:00", "2024-9-1 00:00", "12/01/2024"]).map(lambda t: (t, BAD))
STARTS = st.one_of(GOOD_STARTS, GOOD_STARTS, BAD_STARTS, MISSING)
ENDS = st.one_of(st.just(("", None)), GOOD_STARTS, BAD_STARTS)
CURRENCIES = st.one_of(st.sampled_from([("USD", "USD"), ("EUR", "EUR"), (" JPY ", "JPY")]),
                       st.sampled_from(["usd", "US", "EURO", "$"]).map(lambda t: (t, BAD)), MISSING)
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)


def _offset(minutes: int) -> str:
    sign = "-" if minutes < 0 else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


ROWS = st.lists(st.fixed_dictionaries({
    "ChargePeriodStart": STARTS, "ChargePeriodEnd": ENDS, "BillingCurrency": CURRENCIES,
    "BilledCost": AMOUNTS, "EffectiveCost": AMOUNTS,
    "ServiceName": TEXT, "Tags": TEXT, "ResourceId": TEXT,
}), min_size=0, max_size=25)
COLUMNS = ["ChargePeriodStart", "ChargePeriodEnd", "BillingCurrency", "BilledCost", "EffectiveCost",
           "ServiceName", "Tags", "ResourceId"]
CHECKED = ["ChargePeriodStart", "ChargePeriodEnd", "BillingCurrency", "BilledCost", "EffectiveCost"]


# ------------------------------------------------------------------------------ the property


def _read(path, batch_rows: int):
    kept, rejected = [], []
    for batch, bad in ingest.read_focus(str(path), batch_rows=batch_rows):
        kept.extend(batch.to_pylist())
        rejected.extend(bad)
    return kept, rejected


def _reversed(row: dict) -> set[str]:
    """{"ChargePeriodEnd"} when the row's period ends before it starts (both valid), else empty."""
    start, end = row["ChargePeriodStart"][1], row["ChargePeriodEnd"][1]
    valid = all(value is not BAD and value is not None for value in (start, end))
    return {"ChargePeriodEnd"} if valid and end < start else set()


def _check(rows: list[dict], kept: list[dict], rejected: list[dict], source: str) -> None:
    """Every row accepted with exactly its expected values, or rejected naming one of its bad columns."""
    bad_columns = {number: {name for name in CHECKED if row[name][1] is BAD} | _reversed(row)
                   for number, row in enumerate(rows, start=1)}
    assert sorted(item["row"] for item in rejected) == [n for n, bad in bad_columns.items() if bad]
    for item in rejected:
        assert item["file"] == source and item["reason"]
        assert item["column"] in bad_columns[item["row"]], (item, rows[item["row"] - 1])
    assert [line["x_Row"] for line in kept] == [n for n, bad in bad_columns.items() if not bad]
    for line in kept:
        row = rows[line["x_Row"] - 1]
        assert line["ChargePeriodStart"] == row["ChargePeriodStart"][1]
        assert line["BillingCurrency"] == row["BillingCurrency"][1]
        for name in ("BilledCost", "EffectiveCost"):
            assert line[name] == row[name][1] and line[name].is_finite(), (name, row[name], line[name])


def _write_csv(path, rows: list[dict]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([row[name][0] if isinstance(row[name], tuple) else row[name] for name in COLUMNS])


@SETTINGS
@given(rows=ROWS, batch_rows=st.sampled_from([1, 3, 500_000]))
def test_csv_rows_are_accepted_exactly_or_rejected_with_row_and_reason(tmp_path, rows, batch_rows):
    path = tmp_path / "billing.csv"
    _write_csv(path, rows)
    kept, rejected = _read(path, batch_rows)
    _check(rows, kept, rejected, "billing.csv")


def _parquet_costs(kind: str, cells: list[tuple]) -> tuple[pa.Array, list[tuple]]:
    """A cost column of Arrow type `kind` for `cells`, and the cells as that type reads them."""
    if kind == "string":  # Parquet keeps "" as a string (not a null): still no number
        return pa.array([None if text == "NULL" else text for text, _ in cells], pa.string()), cells
    if kind == "decimal":
        values, out = [], []
        for text, expected in cells:
            good = expected is not BAD and abs(expected) < Decimal("1e18")
            values.append(expected if good else None)
            out.append((text, expected if good else BAD))
        return pa.array(values, pa.decimal128(38, 12)), out
    raise AssertionError(kind)


FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.floats(min_value=-1e6, max_value=1e6),
                   st.decimals(min_value=-10**6, max_value=10**6, places=4, allow_nan=False).map(float),
                   st.none())


def _float_expected(value: float | None):
    """What a float cost must become: its shortest repr, rounded half-even past 12 places; BAD if none."""
    if value is None or not math.isfinite(value):
        return BAD
    with localcontext(prec=1000, Emax=10**6, Emin=-(10**6)):
        amount = Decimal(repr(value))
        if amount.as_tuple().exponent < -12:
            amount = amount.quantize(Decimal("1e-12"))
    return BAD if abs(amount) >= Decimal("1e18") else amount


@SETTINGS
@given(rows=ROWS, kind=st.sampled_from(["string", "decimal", "float"]), floats=st.lists(FLOATS, min_size=25,
       max_size=25), timestamps=st.booleans(), batch_rows=st.sampled_from([2, 500_000]))
def test_parquet_rows_are_accepted_exactly_or_rejected_with_row_and_reason(tmp_path, rows, kind, floats,
                                                                           timestamps, batch_rows):
    columns: dict[str, pa.Array] = {}
    for name in COLUMNS:
        texts = [row[name][0] if isinstance(row[name], tuple) else row[name] for row in rows]
        columns[name] = pa.array([None if text in ("NULL",) else text for text in texts], pa.string())
    for name in ("BilledCost", "EffectiveCost"):
        if kind == "float":
            cells = [(repr(value), _float_expected(value)) for value in floats[:len(rows)]]
            columns[name] = pa.array(floats[:len(rows)], pa.float64())
        else:
            columns[name], cells = _parquet_costs(kind, [row[name] for row in rows])
        for row, cell in zip(rows, cells, strict=True):
            row[name] = cell
    if timestamps:  # a native timestamp column: the good instants, nulls for the rest
        starts = [row["ChargePeriodStart"] for row in rows]
        columns["ChargePeriodStart"] = pa.array([None if expected is BAD else expected for _, expected in starts],
                                                pa.timestamp("us", "UTC"))
    for row in rows:  # in Parquet an empty string is a value, not a null
        for name in ("ChargePeriodStart", "BillingCurrency"):
            if row[name][0] == "" and not (timestamps and name == "ChargePeriodStart"):
                row[name] = ("", BAD)
    path = tmp_path / "billing.parquet"
    pq.write_table(pa.table(columns), path, row_group_size=7)
    kept, rejected = _read(path, batch_rows)
    _check(rows, kept, rejected, "billing.parquet")
