"""Billing files as other tools write them: ragged CSV rows, Parquet from polars/DuckDB (large and
view strings), nested extra columns, a `.gz` that is not gzip, two columns carried under one name."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from seedance_tasks.cli import app
from tests.cost.helpers import write_owners


def _recover(tmp_path, billing, *extra, owners=None):
    owners = owners or write_owners(tmp_path / "owners.yaml")
    return CliRunner().invoke(app, ["cost", "recover", "--month", "2024-09", "--billing", str(billing),
                                    "--owners", str(owners), "--out", str(tmp_path / "out"), "--json", *extra])


def _summary(result) -> dict:
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return json.loads(result.stdout)["summary"]


HEADER = "ChargePeriodStart,BillingCurrency,BilledCost,EffectiveCost,ChargeDescription,Tags\n"


def test_a_csv_row_with_more_or_fewer_fields_than_the_header_is_rejected_by_its_row_and_the_rest_is_read(tmp_path):
    billing = tmp_path / "ragged.csv"
    billing.write_text(HEADER + "\n".join([
        '2024-09-01,USD,1,1,plain,"{""owner"": ""a""}"',
        '2024-09-02,USD,2,2,plain,"{""owner"": ""a""}",extra',  # one field too many
        '2024-09-03,USD,4,4,"two\nlines","{""owner"": ""b""}"',  # a quoted newline: still one row
        "2024-09-04,USD,8",  # too few
        "",  # an empty line is no row
        '2024-09-05,USD,16,16,plain,"{""owner"": ""b""}"',
    ]) + "\n")
    summary = _summary(_recover(tmp_path, billing))
    assert summary["currencies"]["USD"]["by_owner"] == {"a": "1", "b": "20"}
    assert summary["rejected"] == [
        {"file": "ragged.csv", "row": 2, "column": None, "reason": "the row has 7 fields, the header 6"},
        {"file": "ragged.csv", "row": 4, "column": None, "reason": "the row has 3 fields, the header 6"},
    ]
    rows = pq.read_table(tmp_path / "out" / "month=2024-09" / "allocations.parquet").column("x_Row").to_pylist()
    assert sorted(rows) == [1, 3, 5]  # each line keeps its own data row number


def test_parquet_with_large_and_view_strings_is_read_like_plain_strings(tmp_path):
    billing = tmp_path / "polars.parquet"
    pq.write_table(pa.table({
        "ChargePeriodStart": pa.array(["2024-09-01T00:00:00Z", "2024-09-02 00:00:00"], pa.large_string()),
        "BillingCurrency": pa.array(["USD", "EUR"], pa.large_string()).dictionary_encode(),
        "BilledCost": pa.array(["1.5", "2"], pa.string_view()),
        "EffectiveCost": pa.array(["1.5", "2"], pa.large_string()),
        "Tags": pa.array(['{"owner": "a"}', '{"team": "b"}'], pa.string_view()),
    }), billing)
    summary = _summary(_recover(tmp_path, billing))
    assert summary["rejected_count"] == 0
    assert {cur: entry["by_owner"] for cur, entry in summary["currencies"].items()} == {"EUR": {"b": "2"},
                                                                                         "USD": {"a": "1.5"}}


def test_list_struct_and_map_extra_columns_in_parquet_are_carried_as_json_text(tmp_path):
    billing = tmp_path / "nested.parquet"
    pq.write_table(pa.table({
        "ChargePeriodStart": ["2024-09-01", "2024-09-02"], "BillingCurrency": ["USD", "USD"],
        "BilledCost": ["1", "2"], "EffectiveCost": ["1", "2"], "Tags": ['{"owner": "a"}', None],
        "SkuPriceDetails": pa.array([{"CoreCount": 4}, None]),
        "Zones": pa.array([["a", "b"], []]),
        "Labels": pa.array([[("k", "v")], None], pa.map_(pa.string(), pa.string())),
    }), billing)
    summary = _summary(_recover(tmp_path, billing))
    assert summary["currencies"]["USD"]["by_owner"] == {"a": "1"}
    out = pq.read_table(tmp_path / "out" / "month=2024-09" / "allocations.parquet").sort_by("x_Row").to_pydict()
    assert out["SkuPriceDetails"] == ['{"CoreCount": 4}', None]
    assert out["x_Zones"] == ['["a", "b"]', "[]"]
    assert out["x_Labels"] == ['{"k": "v"}', None]


def test_a_gz_file_that_is_not_gzip_is_an_unreadable_billing_file_naming_it(tmp_path):
    billing = tmp_path / "bill.csv.gz"
    billing.write_text(HEADER + "2024-09-01,USD,1,1,plain,\n")
    result = _recover(tmp_path, billing)
    assert result.exit_code == 1, result.output  # an input error, not a retryable storage error
    assert "error: bill.csv.gz: unreadable billing file" in result.output and "hint:" in result.output
    assert "Traceback" not in result.output


def test_two_columns_that_would_be_carried_under_one_name_are_refused_naming_both(tmp_path):
    billing = tmp_path / "both.csv"
    billing.write_text("ChargePeriodStart,BillingCurrency,BilledCost,EffectiveCost,Id,x_Id\n"
                       "2024-09-01,USD,1,1,one,two\n")
    result = _recover(tmp_path, billing)
    assert result.exit_code == 1, result.output
    assert "error: both.csv: columns 'Id' and 'x_Id' would both be written as 'x_Id'" in result.output
    assert "hint:" in result.output and "Traceback" not in result.output


def test_focus_column_names_in_another_case_are_read_as_focus_columns(tmp_path):
    csv_file = tmp_path / "lower" / "export.csv"  # a database export: names folded to one case
    csv_file.parent.mkdir()
    csv_file.write_text("chargeperiodstart,billingcurrency,billedcost,effectivecost,tags,chargedescription\n"
                        '2024-09-01,USD,1,2,"{""owner"": ""a""}",d\n')
    parquet_file = tmp_path / "upper" / "export.parquet"
    parquet_file.parent.mkdir()
    pq.write_table(pa.table({"CHARGEPERIODSTART": ["2024-09-01"], "BILLINGCURRENCY": ["USD"], "BILLEDCOST": ["4"],
                             "EFFECTIVECOST": ["8"], "TAGS": ['{"owner": "b"}'], "Other": ["o"]}), parquet_file)
    for billing, owner, amount, carried in ((csv_file, "a", "2", "ChargeDescription"),
                                            (parquet_file, "b", "8", "x_Other")):
        summary = _summary(_recover(tmp_path, billing))
        assert summary["currencies"]["USD"]["by_owner"] == {owner: amount}
        assert summary["currencies"]["USD"]["invoice_total"] == str(int(amount) // 2)
        names = pq.read_schema(tmp_path / "out" / "month=2024-09" / "allocations.parquet").names
        assert carried in names and not any(name.islower() or name.isupper() for name in names)


def test_semicolon_and_tab_separated_csv_files_are_read_by_their_delimiter(tmp_path):
    for name, sep in (("semi.csv", ";"), ("tab.csv", "\t")):
        billing = tmp_path / name
        billing.write_text(sep.join(["ChargePeriodStart", "BillingCurrency", "BilledCost", "EffectiveCost", "Tags"])
                           + "\r\n" + sep.join(["2024-09-01", "USD", "1.5", "1.5", '"{""owner"": ""a""}"']) + "\r\n"
                           + sep.join(["2024-09-02", "USD", "2,5", "2,5", ""]) + "\r\n")  # a decimal comma
        summary = _summary(_recover(tmp_path, billing))
        assert summary["currencies"]["USD"]["by_owner"] == {"a": "1.5"}
        assert [(item["row"], item["reason"]) for item in summary["rejected"]] == [
            (2, "malformed BilledCost: not a number: '2,5'")]


def test_an_owner_tag_too_long_for_a_file_name_or_differing_in_case_only_gets_a_statement_of_its_own(tmp_path):
    long_owner = "team-" + "a" * 250  # tag values run to 256 characters; a file name to 255 bytes
    rows = [f'2024-09-0{day},USD,{amount},{amount},"{{""owner"": ""{owner}""}}"'
            for day, amount, owner in ((1, 1, long_owner), (2, 2, long_owner + "b"), (3, 4, "a/b"), (4, 8, "a_b"),
                                       (5, 16, "Alpha"), (6, 32, "alpha"))]
    billing = tmp_path / "long.csv"
    billing.write_text("ChargePeriodStart,BillingCurrency,BilledCost,EffectiveCost,Tags\n" + "\n".join(rows) + "\n")
    summary = _summary(_recover(tmp_path, billing))
    expected = {long_owner: "1", long_owner + "b": "2", "a/b": "4", "a_b": "8", "Alpha": "16", "alpha": "32"}
    assert summary["currencies"]["USD"]["by_owner"] == expected
    statements = sorted((tmp_path / "out" / "month=2024-09" / "statements").iterdir())
    assert len(statements) == 6 and all(len(path.name) < 128 for path in statements)
    assert len({path.name.casefold() for path in statements}) == 6  # apart where file names ignore case too
    owners = {}
    for path in statements:
        cells = path.read_text().splitlines()[1].split(",")
        owners[cells[1]] = cells[7]
    assert owners == expected



def test_an_owner_named_in_other_scripts_keeps_its_letters_in_its_statement_name(tmp_path):
    import csv
    import unicodedata

    owners = ["\u00e9quipe", "\u00c9QUIPE", "e\u0301quipe", "\u30c7\u30fc\u30bf", "\u0928\u093f\u0924\u093f\u0928",
              "\u00e9" * 200, "a\u202eb/c", "x\u0001y\\z"]
    billing = tmp_path / "unicode.csv"
    with open(billing, "w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        out.writerow(["ChargePeriodStart", "BillingCurrency", "BilledCost", "EffectiveCost", "Tags"])
        for day, owner in enumerate(owners, start=1):
            out.writerow([f"2024-09-0{day}", "USD", day, day, json.dumps({"owner": owner})])
    summary = _summary(_recover(tmp_path, billing))
    assert summary["currencies"]["USD"]["by_owner"] == {owner: str(day) for day, owner in enumerate(owners, start=1)}
    names = {path.name for path in (tmp_path / "out" / "month=2024-09" / "statements").iterdir()}
    assert {"owner=\u00e9quipe.csv", "owner=\u30c7\u30fc\u30bf.csv", "owner=\u0928\u093f\u0924\u093f\u0928.csv",
            "owner=a_b_c.csv", "owner=x_y_z.csv"} <= names, names
    assert len(names) == len(owners) and len({unicodedata.normalize("NFC", name).casefold() for name in names}) == 8
    assert all(unicodedata.is_normalized("NFC", name) and len(name.encode()) < 128 for name in names), names
    assert all(unicodedata.category(char)[0] != "C" and char not in "/\\" for name in names for char in name)

def test_a_blank_owner_name_in_the_owners_file_is_refused_naming_its_key(tmp_path):
    billing = tmp_path / "b.csv"
    billing.write_text("ChargePeriodStart,BillingCurrency,BilledCost,EffectiveCost,ServiceName\n2024-09-01,USD,1,1,A\n")
    owners = write_owners(tmp_path / "owners.yaml", rules=[{"id": "r", "owner": " ", "match": {"service": "A"}}],
                          budgets={"": {"amount": "1"}})
    result = _recover(tmp_path, billing, owners=owners)
    assert result.exit_code not in (0, 70), result.output
    assert "'rules.0.owner'" in result.output and "'budgets'" in result.output and "must not be empty" in result.output
    assert "hint:" in result.output and not (tmp_path / "out" / "month=2024-09").exists()


def test_owner_names_in_the_owners_file_are_compared_without_surrounding_spaces(tmp_path):
    billing = tmp_path / "b.csv"
    billing.write_text("ChargePeriodStart,BillingCurrency,BilledCost,EffectiveCost,ServiceName,Tags\n"
                       '2024-09-01,USD,1,1,A,\n2024-09-02,USD,2,2,B,"{""owner"": ""alpha""}"\n')
    owners = write_owners(tmp_path / "owners.yaml", rules=[{"id": "r", "owner": " alpha ", "match": {"service": "A"}}])
    summary = _summary(_recover(tmp_path, billing, owners=owners))
    assert summary["currencies"]["USD"]["by_owner"] == {"alpha": "3"}


def test_a_tag_key_repeated_with_another_value_is_a_tag_conflict_not_last_one_wins(tmp_path):
    billing = tmp_path / "b.csv"
    billing.write_text("ChargePeriodStart,BillingCurrency,BilledCost,EffectiveCost,Tags\n"
                       '2024-09-01,USD,1,1,"{""owner"": ""b"", ""owner"": ""a""}"\n'
                       '2024-09-02,USD,2,2,"{""owner"": ""c"", ""owner"": ""c""}"\n')
    summary = _summary(_recover(tmp_path, billing))
    assert summary["currencies"]["USD"]["by_owner"] == {"a": "1", "c": "2"}  # as for two spellings of one key
    assert summary["tag_conflicts"] == {"count": 1, "sample": [{"row": 1, "tags": {"owner": ["a", "b"]}}]}


def _cur_variant(tmp_path, change) -> tuple[dict, dict]:
    """The summaries of the CUR sample month as written and with `change(table)` applied."""
    from tests.cost.cur_sample import write_cur_month

    plain = write_cur_month(tmp_path / "plain" / "cur.parquet")
    table = pq.read_table(plain)
    changed = tmp_path / "changed" / "cur.parquet"
    changed.parent.mkdir()
    pq.write_table(change(table), changed)
    summaries = []
    for billing in (plain, changed):
        summaries.append(_summary(_recover(tmp_path, billing, "--format", "cur")))
    return summaries[0], summaries[1]


def test_cur_resource_tags_as_json_text_attribute_like_a_map(tmp_path):
    def as_text(table):
        tags = [None if value is None else json.dumps(dict(value)) for value in table.column("resource_tags").to_pylist()]
        return table.set_column(table.schema.get_field_index("resource_tags"), "resource_tags", pa.array(tags))

    plain, text = _cur_variant(tmp_path, as_text)
    assert text["currencies"] == plain["currencies"] and text["rejected_count"] == 0


def test_a_cur_usage_amount_that_is_no_number_rejects_its_row_not_the_file(tmp_path):
    def garbled(table):
        amounts = ["abc"] + [None if value is None else repr(value) for value in
                             table.column("line_item_usage_amount").to_pylist()[1:]]
        return table.set_column(table.schema.get_field_index("line_item_usage_amount"), "line_item_usage_amount",
                                pa.array(amounts))

    plain, changed = _cur_variant(tmp_path, garbled)
    assert [(item["row"], item["column"]) for item in changed["rejected"]] == [(1, "PricingQuantity")]
    assert "'abc'" in changed["rejected"][0]["reason"]
    assert changed["lines"] == plain["lines"] - 1


def test_timestamps_with_the_zone_as_a_name_are_read_as_bigquery_exports_write_them(tmp_path):
    billing = tmp_path / "bigquery.csv"
    billing.write_text("BillingPeriodStart,ChargePeriodStart,ChargePeriodEnd,BillingCurrency,BilledCost,EffectiveCost\n"
                       "2024-09-01 00:00:00 UTC,2024-09-30 23:00:00 UTC,2024-10-01 00:00:00 UTC,USD,1,1\n"
                       "2024-09-01 00:00:00 UTC,2024-09-02 00:00:00.5 gmt,2024-09-02 01:00:00 UTC,USD,2,2\n"
                       "2024-10-01 00:00:00 UTC,2024-10-01 00:00:00 UTC,2024-10-01 01:00:00 UTC,USD,4,4\n")
    summary = _summary(_recover(tmp_path, billing))
    assert summary["rejected_count"] == 0 and summary["lines"] == 2
    assert summary["currencies"]["USD"]["total"] == "3"


def test_budget_currencies_are_read_as_codes_in_capitals_and_anything_else_is_refused(tmp_path):
    billing = tmp_path / "b.csv"
    billing.write_text("ChargePeriodStart,BillingCurrency,BilledCost,EffectiveCost,Tags\n"
                       '2024-09-01,USD,100,100,"{""owner"": ""alpha""}"\n')
    owners = write_owners(tmp_path / "owners.yaml", budgets={"alpha": {"amount": "10", "currency": " usd"}})
    summary = _summary(_recover(tmp_path, billing, owners=owners))
    assert [(item["owner"], item["currency"]) for item in summary["over_budget"]] == [("alpha", "USD")]
    owners = write_owners(tmp_path / "owners.yaml", budgets={"alpha": {"amount": "10", "currency": "dollars"}})
    result = _recover(tmp_path, billing, owners=owners)
    assert result.exit_code not in (0, 70) and "'budgets.alpha.currency'" in result.output, result.output
    assert "not a currency code" in result.output and "hint:" in result.output


def test_an_earlier_months_unreadable_summary_is_left_out_of_the_trend_not_fatal(tmp_path):
    from tests.cost.helpers import three_months

    billing, owners = three_months(tmp_path)
    for month in ("2024-07", "2024-08"):
        assert _recover_month(tmp_path, billing, owners, month).exit_code == 0
    (tmp_path / "out" / "month=2024-07" / "summary.json").write_text("not json")
    (tmp_path / "out" / "month=2024-08" / "summary.json").write_text('{"month": "2024-08", "currencies": []}')
    result = _recover_month(tmp_path, billing, owners, "2024-09")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["report"]["trend_skipped"] == ["month=2024-07/summary.json",
                                                                    "month=2024-08/summary.json"]
    assert "Unallocated by month" in (tmp_path / "out" / "month=2024-09" / "report.html").read_text()


def _recover_month(tmp_path, billing, owners, month):
    return CliRunner().invoke(app, ["cost", "recover", "--month", month, "--billing", str(billing),
                                    "--owners", str(owners), "--out", str(tmp_path / "out"), "--json"])


def test_a_malformed_state_ledger_is_an_error_naming_it_not_an_internal_error(tmp_path):
    billing = tmp_path / "b.csv"
    billing.write_text("ChargePeriodStart,BillingCurrency,BilledCost,EffectiveCost,Tags\n"
                       '2024-09-01,USD,100,100,"{""owner"": ""alpha""}"\n')
    owners = write_owners(tmp_path / "owners.yaml", budgets={"alpha": {"amount": "10"}})
    ledger = tmp_path / "out" / "_seedance" / "cost" / "quota-ledger.json"
    ledger.parent.mkdir(parents=True)
    for text, problem in (("[1, 2]", "a JSON list, not an object"), ("{not json", "not JSON")):
        ledger.write_text(text)
        result = _recover(tmp_path, billing, "--current", "--apply", owners=owners)
        assert result.exit_code == 1, result.output
        assert f"quota-ledger.json: malformed state file ({problem}" in result.output and "hint:" in result.output
        assert ledger.read_text() == text  # kept as it was


def test_a_malformed_cost_explorer_cache_is_an_error_naming_it_and_odd_values_in_one_are_rejected_rows(tmp_path):
    cache = tmp_path / "out" / "_seedance" / "cost" / "cost-explorer" / "2024-09-owner.json"
    cache.parent.mkdir(parents=True)
    for text in ('{"ResultsByTime": []}', "[1]", "[{", '[{"ResultsByTime": [{"Groups": {"a": 1}}]}]'):
        cache.write_text(text)
        result = _recover(tmp_path, "ce://owner", "--format", "ce")
        assert result.exit_code == 1, result.output
        assert "2024-09-owner.json: malformed Cost Explorer cache" in result.output and "--refresh" in result.output
    cache.write_text(json.dumps([{"ResultsByTime": [{"TimePeriod": {"Start": "2024-09-01"}, "Groups": [
        {"Keys": ["owner$alpha", "Amazon EC2"], "Metrics": {"AmortizedCost": {"Amount": 1.5, "Unit": "USD"},
                                                           "UnblendedCost": {"Amount": "2", "Unit": "USD"}}},
        {"Keys": [7], "Metrics": ["not", "an", "object"]}]}]}]))
    summary = _summary(_recover(tmp_path, "ce://owner", "--format", "ce"))
    assert summary["currencies"]["USD"]["by_owner"] == {"alpha": "1.5"}
    assert [(item["row"], item["column"]) for item in summary["rejected"]] == [(2, "BillingCurrency")]


def test_amounts_with_more_than_twelve_decimals_are_rounded_to_twelve_and_counted_not_rejected(tmp_path):
    from decimal import Decimal

    csv_file = tmp_path / "azure" / "focus.csv"  # Azure's exports print 16-24 decimals (binary float noise)
    csv_file.parent.mkdir()
    csv_file.write_text("ChargePeriodStart,BillingCurrency,BilledCost,EffectiveCost,ListCost,Tags\n"
                        '2024-09-01,USD,0.0005459213038081,0.000545921303808100000000,1.0000000000005,'
                        '"{""owner"": ""a""}"\n2024-09-02,USD,2,2,2,\n')
    summary = _summary(_recover(tmp_path, csv_file))
    assert summary["rejected_count"] == 0 and summary["lines"] == 2
    assert summary["currencies"]["USD"]["by_owner"] == {"a": "0.000545921304"}
    assert summary["currencies"]["USD"]["invoice_total"] == "2.000545921304"
    assert [w for w in summary["warnings"] if "decimal places" in w] == [
        f"3 amounts in {csv_file} had more than 12 decimal places and were rounded half-even to 12 "
        "(each changed by at most 5e-13)"]
    allocations = pq.read_table(tmp_path / "out" / "month=2024-09" / "allocations.parquet").sort_by("x_Row")
    assert allocations.column("ListCost").to_pylist()[0] == Decimal("1.000000000000")  # half-even: 0.5e-12 down

    parquet_file = tmp_path / "decimal" / "focus.parquet"
    parquet_file.parent.mkdir()
    pq.write_table(pa.table({"ChargePeriodStart": ["2024-09-01"], "BillingCurrency": ["USD"],
                             "BilledCost": pa.array([Decimal("1.12345678901234567890")], pa.decimal128(38, 20)),
                             "EffectiveCost": pa.array([Decimal("1.5")], pa.decimal128(38, 20))}), parquet_file)
    summary = _summary(_recover(tmp_path, parquet_file))
    assert summary["rejected_count"] == 0
    assert summary["currencies"]["USD"]["invoice_total"] == "1.123456789012"
