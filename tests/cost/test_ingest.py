"""Billing ingest: the FOCUS sample reconciles to the last digit, the spec's commitment examples,
malformed rows, month boundaries, two currencies, CUR 2.0 and Cost Explorer."""

from __future__ import annotations

import csv
import json
import urllib.request
from datetime import UTC, datetime
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seedance_tasks import storage
from seedance_tasks.cost import ingest
from seedance_tasks.cost.recover import recover_month
from tests.cost.helpers import SAMPLE, SPEC, line, write_focus, write_owners


def _source_sums(path, column):
    sums: dict[str, Decimal] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            month = row["ChargePeriodStart"][:7]
            sums[month] = sums.get(month, Decimal(0)) + Decimal(row[column])
    return sums


def _check_invariant(summary):
    for entry in summary["currencies"].values():
        owners = sum((Decimal(v) for v in entry["by_owner"].values()), Decimal(0))
        assert owners + Decimal(entry["unallocated"]) == Decimal(entry["total"])


@pytest.mark.parametrize("basis, column", [("BilledCost", "BilledCost"), ("EffectiveCost", "EffectiveCost")])
def test_focus_sample_reconciles_to_the_source_to_the_last_digit(tmp_path, basis, column):
    owners = write_owners(tmp_path / "owners.yaml", owner_tags=["owner", "team", "business_unit", "org"])
    expected = _source_sums(SAMPLE, column)
    billed = _source_sums(SAMPLE, "BilledCost")
    assert sum(billed.values()) == Decimal("20.52022672899")  # the file's own BilledCost total
    for month, amount in expected.items():
        result = recover_month(month=month, billing=str(SAMPLE), owners=str(owners), out=str(tmp_path / "out"),
                               basis=basis)
        summary = result["summary"]
        usd = summary["currencies"]["USD"]
        assert Decimal(usd["total"]) == amount
        assert Decimal(usd["invoice_total"]) == billed[month]  # invoice always on BilledCost
        assert summary["rejected"] == [] and summary["rows_read"] == 1000
        _check_invariant(summary)
    sept = json.loads((tmp_path / "out" / "month=2024-09" / "summary.json").read_text())["currencies"]["USD"]
    assert "trey" in sept["by_owner"]  # Azure's "org" / " org" tags


def test_spec_commitment_purchase_is_billed_not_amortized(tmp_path):
    owners = write_owners(tmp_path / "owners.yaml")
    billing = SPEC / "commitment_discount_purchase_scenario_1.csv"
    amounts = {}
    for basis in ("BilledCost", "EffectiveCost"):
        summary = recover_month(month="2023-01", billing=str(billing), owners=str(owners), currency="USD",
                                out=str(tmp_path / basis), basis=basis)["summary"]
        amounts[basis] = summary["currencies"]["USD"]["total"]
        assert summary["currencies"]["USD"]["invoice_total"] == "8760"
    assert amounts == {"BilledCost": "8760", "EffectiveCost": "0"}


def test_spec_commitment_usage_moves_cost_to_the_resource_when_amortized(tmp_path):
    owners = write_owners(tmp_path / "owners.yaml", rules=[
        {"id": "vm", "owner": "vm-team", "match": {"resource_id": "<my-large-vm-id>"}}])
    billing = SPEC / "one_hundred_percent_utilization_without_commitment_discount_flexibility.csv"
    results = {}
    for basis in ("BilledCost", "EffectiveCost"):
        summary = recover_month(month="2023-01", billing=str(billing), owners=str(owners), currency="USD",
                                out=str(tmp_path / basis), basis=basis)["summary"]
        results[basis] = summary["currencies"]["USD"]
    # cash: the commitment purchase (not owned by the VM) carries 1.50; amortized: the covered usage does
    assert results["BilledCost"]["by_owner"] == {"vm-team": "0"} and results["BilledCost"]["unallocated"] == "1.5"
    assert results["EffectiveCost"]["by_owner"] == {"vm-team": "1.5"}
    assert results["EffectiveCost"]["unallocated"] == "0"
    assert results["BilledCost"]["total"] == results["EffectiveCost"]["total"] == "1.5"
    usage = recover_month(month="2023-01", billing=str(SPEC / "commitment_discount_usage_scenario_3.csv"),
                          owners=str(owners), currency="USD", out=str(tmp_path / "u3"))["summary"]
    assert usage["currencies"]["USD"]["total"] == "1" and usage["currencies"]["USD"]["invoice_total"] == "0"


def test_spec_example_with_impossible_timestamp_is_rejected_with_row_and_column(tmp_path):
    owners = write_owners(tmp_path / "owners.yaml")
    summary = recover_month(month="2023-01", billing=str(SPEC / "commitment_discount_purchase_scenario_2.csv"),
                            owners=str(owners), currency="USD", out=str(tmp_path / "out"),
                            basis="BilledCost")["summary"]
    assert [(item["row"], item["column"]) for item in summary["rejected"]] == [(3, "ChargePeriodEnd")]
    assert "2023-02-01T30:00:00Z" in summary["rejected"][0]["reason"]
    assert summary["currencies"]["USD"]["total"] == "2"  # the two good rows still count


def test_malformed_rows_are_rejected_and_the_run_goes_on(tmp_path):
    rows = [
        line("2024-09-01 00:00:00", "1.25"),
        line("2024-09-02 00:00:00", "NULL"),  # missing BilledCost
        line("2024-09-03 00:00:00", "12,50"),  # not a number
        line("2024-09-04 00:00:00", "2", currency="usd$"),  # bad currency
        line("2024-13-45 00:00:00", "3"),  # impossible date
        line("NULL", "4"),  # missing start
        line("2024-09-05 00:00:00", "0.0000000000006"),  # 13 decimal places: kept, rounded half-even to 12
        line("2024-09-06 00:00:00", "7", tags="{not json"),  # tags are optional: kept, noted
    ]
    billing = write_focus(tmp_path / "bad.csv", rows)
    owners = write_owners(tmp_path / "owners.yaml")
    summary = recover_month(month="2024-09", billing=str(billing), owners=str(owners),
                            out=str(tmp_path / "out"))["summary"]
    got = {(item["row"], item["column"]) for item in summary["rejected"]}
    assert got == {(2, "BilledCost"), (3, "BilledCost"), (4, "BillingCurrency"), (5, "ChargePeriodStart"),
                   (6, "ChargePeriodStart")}
    assert all(item["reason"] for item in summary["rejected"])
    assert summary["currencies"]["USD"]["total"] == "8.250000000001"
    assert any(warning.startswith("2 amounts in ") and "rounded half-even to 12" in warning
               for warning in summary["warnings"])  # its BilledCost and EffectiveCost
    assert summary["malformed_tags_rows"] == [8]


def test_month_boundaries_are_utc_and_end_exclusive(tmp_path):
    rows = [
        line("2024-08-31T23:59:59Z", "1"),
        line("2024-09-01T00:00:00Z", "10"),
        line("2024-09-30 23:59:59", "100"),
        line("2024-10-01T01:30:00+02:00", "1000"),  # 2024-09-30 23:30 UTC
        line("2024-10-01 00:00:00", "10000"),
    ]
    billing = write_focus(tmp_path / "b.csv", rows)
    owners = write_owners(tmp_path / "owners.yaml")
    totals = {}
    for month in ("2024-08", "2024-09", "2024-10"):
        summary = recover_month(month=month, billing=str(billing), owners=str(owners), out=str(tmp_path / "o"))
        totals[month] = summary["summary"]["currencies"]["USD"]["total"]
    assert totals == {"2024-08": "1", "2024-09": "1110", "2024-10": "10000"}


def test_two_currencies_are_never_mixed(tmp_path):
    rows = [
        line("2024-09-01 00:00:00", "10.10", tags={"owner": "a"}),
        line("2024-09-02 00:00:00", "20.20", currency="EUR", tags={"owner": "a"}),
        line("2024-09-03 00:00:00", "0.30", currency="EUR"),
        line("2024-09-04 00:00:00", "5", currency="USD", tags={"team": "b"}),
    ]
    billing = write_focus(tmp_path / "b.csv", rows)
    owners = write_owners(tmp_path / "owners.yaml")
    summary = recover_month(month="2024-09", billing=str(billing), owners=str(owners), out=str(tmp_path / "o"))["summary"]
    assert summary["currencies"] == {
        "EUR": {"total": "20.5", "by_owner": {"a": "20.2"}, "unallocated": "0.3", "invoice_total": "20.5",
                "effective_total": "20.5"},
        "USD": {"total": "15.1", "by_owner": {"a": "10.1", "b": "5"}, "unallocated": "0", "invoice_total": "15.1",
                "effective_total": "15.1"},
    }
    statement = (tmp_path / "o" / "month=2024-09" / "statements" / "owner=a.csv").read_text().splitlines()
    assert any(",EUR,TOTAL," in row for row in statement) and any(",USD,TOTAL," in row for row in statement)


def test_parquet_billing_on_s3(tmp_path, s3_bucket):
    rows = [line("2024-09-01 00:00:00", "1.5", tags={"owner": "a"}), line("2024-09-02 00:00:00", "2.5")]
    local = write_focus(tmp_path / "b.csv", rows)
    table = pa.csv.read_csv(local, convert_options=pa.csv.ConvertOptions(column_types={
        "BilledCost": pa.string(), "EffectiveCost": pa.string()}))
    location = storage.resolve(f"s3://{s3_bucket}/billing/2024-09.parquet")
    with location.fs.open_output_stream(location.path) as sink:
        pq.write_table(table, sink)
    owners = write_owners(tmp_path / "owners.yaml")
    result = recover_month(month="2024-09", billing=f"s3://{s3_bucket}/billing/", owners=str(owners),
                           out=f"s3://{s3_bucket}/chargeback")
    usd = result["summary"]["currencies"]["USD"]
    assert (usd["by_owner"], usd["unallocated"]) == ({"a": "1.5"}, "2.5")
    out = storage.resolve(f"s3://{s3_bucket}/chargeback/month=2024-09")
    names = {out.relative(info.path) for info in storage.list_files(out)}
    assert {"summary.json", "allocations.parquet", "report.html", "statements/owner=a.csv"} <= names


def test_cur2_amortized_cost_follows_the_cur_rules(tmp_path):
    def cur(kind, unblended, **extra):
        return {"line_item_usage_start_date": datetime(2024, 9, 5, tzinfo=UTC), "line_item_currency_code": "USD",
                "line_item_line_item_type": kind, "line_item_unblended_cost": unblended,
                "line_item_usage_account_id": "222", "bill_payer_account_id": "111",
                "line_item_resource_id": "i-1", "line_item_product_code": "AmazonEC2",
                "savings_plan_savings_plan_effective_cost": extra.get("sp_eff"),
                "savings_plan_total_commitment_to_date": extra.get("sp_total"),
                "savings_plan_used_commitment": extra.get("sp_used"),
                "reservation_effective_cost": extra.get("ri_eff"),
                "reservation_unused_amortized_upfront_fee_for_billing_period": extra.get("ri_upfront"),
                "reservation_unused_recurring_fee": extra.get("ri_recurring"),
                "reservation_reservation_a_r_n": extra.get("ri_arn", ""),
                "resource_tags": extra.get("tags", [("user_owner", "ml")])}
    lines = [
        cur("Usage", 1.1),
        cur("SavingsPlanCoveredUsage", 3.0, sp_eff=2.0),
        cur("SavingsPlanNegation", -3.0),
        cur("SavingsPlanRecurringFee", 10.0, sp_total=10.0, sp_used=7.5, tags=[]),
        cur("DiscountedUsage", 0.0, ri_eff=0.3),
        cur("RIFee", 5.0, ri_upfront=0.25, ri_recurring=0.5, tags=[]),
        cur("Fee", 100.0, ri_arn="arn:aws:ec2:us-east-1:1:reserved-instances/x", tags=[]),
    ]
    schema = pa.schema([
        ("line_item_usage_start_date", pa.timestamp("ms")), ("line_item_currency_code", pa.string()),
        ("line_item_line_item_type", pa.string()), ("line_item_unblended_cost", pa.float64()),
        ("line_item_usage_account_id", pa.string()), ("bill_payer_account_id", pa.string()),
        ("line_item_resource_id", pa.string()), ("line_item_product_code", pa.string()),
        ("savings_plan_savings_plan_effective_cost", pa.float64()),
        ("savings_plan_total_commitment_to_date", pa.float64()), ("savings_plan_used_commitment", pa.float64()),
        ("reservation_effective_cost", pa.float64()),
        ("reservation_unused_amortized_upfront_fee_for_billing_period", pa.float64()),
        ("reservation_unused_recurring_fee", pa.float64()), ("reservation_reservation_a_r_n", pa.string()),
        ("resource_tags", pa.map_(pa.string(), pa.string())),
    ])
    path = tmp_path / "cur" / "data.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(lines, schema=schema), path)
    owners = write_owners(tmp_path / "owners.yaml")
    amortized = recover_month(month="2024-09", billing=str(path), format="cur", owners=str(owners),
                              out=str(tmp_path / "a"))["summary"]["currencies"]["USD"]
    # 1.1 + 2.0 + 0 + (10-7.5) + 0.3 + (0.25+0.5) + 0 = 6.65; ml owns 1.1 + 2.0 + 0 + 0.3
    assert (amortized["total"], amortized["by_owner"], amortized["unallocated"]) == ("6.65", {"ml": "3.4"}, "3.25")
    assert amortized["invoice_total"] == "116.1"


def _queue_ce_results(endpoint: str, results: list[dict]) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/static/ce/cost-and-usage-results", data=json.dumps({"results": results}).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request) as response:
        assert response.status == 201


def test_cost_explorer_pages_are_read_cached_and_never_requeried_when_closed(tmp_path, s3_server):
    def group(owner, service, amortized, unblended):
        return {"Keys": [f"owner${owner}", service],
                "Metrics": {"AmortizedCost": {"Amount": amortized, "Unit": "USD"},
                            "UnblendedCost": {"Amount": unblended, "Unit": "USD"}}}
    period = {"Start": "2024-09-01", "End": "2024-10-01"}
    _queue_ce_results(s3_server, [
        {"ResultsByTime": [{"TimePeriod": period, "Estimated": False, "Total": {},
                            "Groups": [group("alpha", "Amazon EC2", "10.0000000001", "12")]}],
         "NextPageToken": "page-2"},
        {"ResultsByTime": [{"TimePeriod": period, "Estimated": True, "Total": {},
                            "Groups": [group("", "Amazon S3", "2.5", "2.5")]}]},
    ])
    cache = storage.resolve(str(tmp_path / "state"))
    pages, info = ingest.cost_explorer_pages("2024-09", group_tag="owner", cache=cache)
    assert info == {"pages_queried": 2, "from_cache": False, "estimated": True}
    again, info = ingest.cost_explorer_pages("2024-09", group_tag="owner", cache=cache)
    assert again == pages and info["pages_queried"] == 0 and info["from_cache"]
    batch, rejected = next(ingest.read_cost_explorer(pages, group_tag="owner"))
    assert rejected == [] and batch.column("EffectiveCost").to_pylist() == [Decimal("10.0000000001"), Decimal("2.5")]
    assert batch.column("Tags").to_pylist() == ['{"owner": "alpha"}', None]

    owners = write_owners(tmp_path / "owners.yaml")
    summary = recover_month(month="2024-09", billing="ce://owner", format="ce", owners=str(owners),
                            out=str(tmp_path / "out"))["summary"]
    assert summary["estimated"] is True
    assert summary["currencies"]["USD"]["by_owner"] == {"alpha": "10.0000000001"}


def test_every_rejected_row_of_a_large_batch_has_its_own_reason_and_month():
    """Reasons and months are formatted for the whole batch at once; each must still be the row's own
    (fractions of a second dropped, a null start gives no month), in row order."""
    rng = np.random.default_rng(3)
    n = 20_000
    base = int(datetime(2024, 8, 31, 23, 0, tzinfo=UTC).timestamp() * 1_000_000)
    starts = base + rng.integers(0, 3 * 3_600_000_000, n)  # fractional seconds, across a month boundary
    ends = base + rng.integers(0, 3 * 3_600_000_000, n)
    start_values = [None if index % 997 == 0 else int(value) for index, value in enumerate(starts)]
    columns = {
        "ChargePeriodStart": pa.array(start_values, pa.timestamp("us", "UTC")),
        "ChargePeriodEnd": pa.array(ends, pa.timestamp("us", "UTC")),
        "BillingCurrency": pa.array(["USD"] * n),
        "BilledCost": pa.array(["1"] * n),
        "EffectiveCost": pa.array(["1"] * n),
    }
    batch, rejected = ingest.normalise(columns, 100, "b.parquet")

    def text(micros):
        return datetime.fromtimestamp(micros // 1_000_000, UTC).strftime("%Y-%m-%d %H:%M:%S")

    expected = []
    for index, (start, end) in enumerate(zip(start_values, ends.tolist(), strict=True)):
        if start is None:
            expected.append((100 + index, "ChargePeriodStart", "missing ChargePeriodStart", None))
        elif end < start:
            expected.append((100 + index, "ChargePeriodEnd", f"ChargePeriodEnd {text(end)} is before "
                             f"ChargePeriodStart {text(start)}", text(start)[:7]))
    assert [(r["row"], r["column"], r["reason"], r["month"]) for r in rejected] == expected
    assert {r["file"] for r in rejected} == {"b.parquet"}
    assert len(batch) == n - len(expected) and {r["month"] for r in rejected} == {None, "2024-08", "2024-09"}
