"""The allocation's fast paths give exactly what the general paths give (hypothesis):

- `money.decimals_as_money` (an integer multiply) against Arrow's checked cast to MONEY;
- `money.exact_sums` (integer adds per key) against Python's exact Decimal sums;
- `Attributor.totals` (sums from the attribution codes, no allocated lines built) against
  `Totals.add` over `Attributor.attribute`, on batches with every kind of tag, rule and amount;
- `allocate_month` (both cores, the in-process path the benchmark times) against the totals the
  `seedance cost recover` pipeline writes for the same month.
"""

from __future__ import annotations

import json
import os
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seedance_tasks.cost import ingest
from seedance_tasks.cost.allocate import Attributor, Totals, allocate_month
from seedance_tasks.cost.money import CONTEXT, MONEY, decimals_as_money, exact_sums
from seedance_tasks.cost.owners import load_owners
from seedance_tasks.cost.recover import recover_month
from tests.cost.helpers import line, write_focus, write_owners

SETTINGS = settings(
    max_examples=int(os.environ.get("SEEDANCE_HYPOTHESIS_EXAMPLES", "60")), deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# unscaled integers around every bound the fast paths test: int64, int64 / 10**k, and small ones
EDGES = [2**63 - 1, 2**63, 2**63 // 100, 2**63 // 100 + 1, 10**20, 10**37]
UNSCALED = st.one_of(
    st.integers(-(10**12), 10**12),
    st.sampled_from(EDGES + [-edge for edge in EDGES]),
    st.integers(-(10**38) + 1, 10**38 - 1),
)


def _decimals(unscaled: list[int | None], scale: int) -> pa.Array:
    return pa.array([None if value is None else Decimal(value).scaleb(-scale, context=CONTEXT) for value in unscaled],
                    pa.decimal128(38, scale))


@SETTINGS
@given(unscaled=st.lists(st.one_of(UNSCALED, st.none()), min_size=1, max_size=60), scale=st.integers(0, 12),
       offset=st.integers(0, 2))
def test_decimals_as_money_equals_arrows_checked_cast(unscaled, scale, offset):
    values = _decimals(unscaled, scale).slice(min(offset, len(unscaled) - 1))
    try:
        expected = pc.cast(values, MONEY)
    except pa.ArrowInvalid:  # too many digits for MONEY: the fast path must decline, not wrap
        expected = None
    fast = decimals_as_money(values)
    if fast is not None:
        assert expected is not None and fast.type == MONEY and fast.equals(expected)
        assert fast.to_pylist() == values.to_pylist()
    factor = 10 ** (12 - scale)
    valid = [value for value in unscaled[min(offset, len(unscaled) - 1):] if value is not None]
    if values.offset == 0 and valid and all(abs(value) * factor < 2**62 for value in valid):
        assert fast is not None  # small amounts take the fast path


@SETTINGS
@given(rows=st.lists(st.tuples(st.integers(0, 6), UNSCALED), min_size=1, max_size=80), scale=st.integers(0, 12))
def test_exact_sums_equal_decimal_sums_or_decline(rows, scale):
    keys = np.array([key for key, _ in rows], np.int64)
    values = _decimals([value for _, value in rows], scale)
    wanted = np.unique(keys)
    sums = exact_sums(keys, 7, values, wanted)
    expected = {}
    for key, value in zip(keys.tolist(), values.to_pylist(), strict=True):
        expected[key] = CONTEXT.add(expected.get(key, Decimal(0)), value)
    if sums is not None:
        assert dict(zip(wanted.tolist(), sums, strict=True)) == expected
    if all(abs(value) * len(rows) < 2**62 for _, value in rows):
        assert sums is not None


def test_exact_sums_decline_nulls():
    values = pa.array([Decimal("1.5"), None], pa.decimal128(38, 12))
    assert exact_sums(np.array([0, 0]), 1, values, np.array([0])) is None


LINE_AMOUNTS = st.one_of(  # unscaled at 10 places: below 1e18 (what a line may hold), mostly small
    st.integers(-(10**12), 10**12), st.integers(-(10**12), 10**12),
    st.sampled_from([2**63 // 100, 2**63 // 100 + 1, 10**27 - 1, -(10**27) + 1]), st.integers(-(10**27), 10**27),
)
TAGS = st.sampled_from([
    None, "", "{}", "not json", '{"owner": "alpha"}', '{"Owner ": "beta"}', '{"team": "gamma"}',
    '{"owner": "alpha", "team": "beta"}', '{"environment": "prod"}', '{"TEAM": "delta", "app": "x"}',
    '{"owner": ""}', '[1, 2]',
])
LINE = st.tuples(
    TAGS, st.sampled_from(["acct-001", "acct-100", "acct-200"]), st.sampled_from(["EC2", "S3", "CloudWatch"]),
    st.sampled_from(["USD", "EUR"]), LINE_AMOUNTS,
    st.integers(0, 29),
)
OWNERS = {
    "owner_tags": ["owner", "team"],
    "rules": [
        {"id": "accounts", "owner": "platform", "match": {"sub_account": "acct-1*"}},
        {"id": "cloudwatch", "owner": "observability", "match": {"service": "CloudWatch"},
         "valid_from": "2024-09-10T00:00:00Z"},
        {"id": "env", "owner": "prod-team", "match": {"tag": {"environment": "prod"}}},
    ],
}


def _lines_batch(lines, first_row: int) -> pa.RecordBatch:
    """LINES through `ingest.normalise`, from parsed Parquet-like columns (dictionary text, decimals)."""
    start = int(np.datetime64("2024-09-01T00:00:00", "us").astype(np.int64))
    columns = {
        "ChargePeriodStart": pa.array([start + day * 86_400_000_000 for *_, day in lines]).cast(
            pa.timestamp("us", "UTC")),
        "BillingCurrency": pc.dictionary_encode(pa.array([currency for _, _, _, currency, _, _ in lines])),
        "BilledCost": _decimals([amount for _, _, _, _, amount, _ in lines], 10),
        "EffectiveCost": _decimals([amount // 3 for _, _, _, _, amount, _ in lines], 10),
        "SubAccountId": pc.dictionary_encode(pa.array([account for _, account, *_ in lines])),
        "ServiceName": pc.dictionary_encode(pa.array([service for _, _, service, *_ in lines])),
        "Tags": pc.dictionary_encode(pa.array([tags for tags, *_ in lines], pa.string())),
    }
    batch, rejected = ingest.normalise(columns, first_row, "test")
    assert not rejected
    return batch


@SETTINGS
@given(batches=st.lists(st.lists(LINE, min_size=1, max_size=40), min_size=1, max_size=4),
       basis=st.sampled_from(["EffectiveCost", "BilledCost"]))
def test_totals_from_codes_equal_totals_of_the_allocated_lines(tmp_path, batches, basis):
    owners = load_owners(str(write_owners(tmp_path / "owners.yaml", **OWNERS)))
    fast, general = Attributor(owners, basis), Attributor(owners, basis)
    by_codes, by_lines = Totals(), Totals()
    first = 1
    for lines in batches:
        batch = _lines_batch(lines, first)
        first += len(lines)
        by_codes.fold(fast.totals(batch))
        for out in general.attribute(batch):
            by_lines.add(out)
    assert by_codes.to_json() == by_lines.to_json()
    assert fast.malformed_tags == general.malformed_tags
    assert by_codes.lines == first - 1


def test_allocate_month_in_process_equals_the_pipelines_totals(tmp_path):
    rows = []
    for day in range(1, 29):
        stamp = f"2024-09-{day:02d} 00:00:00"
        rows += [
            line(stamp, "10.125", "9.5", tags={"owner": "alpha"}, service="EC2"),
            line(stamp, "3.3", tags={"Team": "beta", "owner": "alpha"}, currency="EUR"),
            line(stamp, "0.000000000001", tags="not json", sub_account="acct-101"),
            line(stamp, "-2.5", service="CloudWatch"),
            line(stamp, "7", tags={"environment": "prod"}, service="S3"),
            line(stamp, "99999999.999999999999", tags={"team": "gamma"}),
        ]
    rows.append(line("2024-08-31 23:00:00", "1000", tags={"owner": "alpha"}))  # another month
    billing = write_focus(tmp_path / "billing" / "focus.csv", rows)
    owners = write_owners(tmp_path / "owners.yaml", **OWNERS)
    totals = allocate_month(str(billing), load_owners(str(owners)), "2024-09", batch_rows=7)
    recover_month(billing=str(billing), owners=str(owners), out=str(tmp_path / "out"), month="2024-09")
    summary = json.loads((tmp_path / "out" / "month=2024-09" / "summary.json").read_text())
    assert totals.lines == 28 * 6
    for currency, entry in totals.currencies().items():
        published = summary["currencies"][currency]
        assert {owner: Decimal(amount) for owner, amount in published["by_owner"].items()} == entry["by_owner"]
        assert Decimal(published["unallocated"]) == entry["unallocated"]
    assert set(totals.currencies()) == {"USD", "EUR"}
    assert totals.conflicts == 28
    for currency, entry in totals.currencies().items():  # against Python's own sums of the month's rows
        assert entry["total"] == sum(Decimal(row["EffectiveCost"]) for row in rows
                                     if row["BillingCurrency"] == currency and row["ChargePeriodStart"] >= "2024-09")


@pytest.mark.parametrize("rows", [1, 5, 500_000])
def test_shared_null_columns_are_all_null_and_of_their_type(rows):
    for kind in (MONEY, ingest.DICT, pa.string()):
        column = ingest.nulls(rows, kind)
        assert column.type == kind and len(column) == rows and column.null_count == rows
        assert ingest.nulls(rows, kind) is column
