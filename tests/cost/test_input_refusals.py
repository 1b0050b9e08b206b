"""Bad arguments and bad input files of the cost pipeline: each refused with an `error:` line naming
what is wrong and a hint, never an internal error."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from tests.cost.helpers import DATA, line, write_focus, write_owners


def _recover(tmp_path, billing, *extra, month="2024-09", owners=None):
    owners = owners or write_owners(tmp_path / "owners.yaml")
    return CliRunner().invoke(app, ["cost", "recover", "--month", month, "--billing", str(billing),
                                    "--owners", str(owners), "--out", str(tmp_path / "out"), *extra])


def _refused(result, *words):
    assert result.exit_code not in (0, 70), result.output
    assert "Traceback" not in result.output and "unexpected" not in result.output
    assert "hint:" in result.output
    for word in words:
        assert word in result.output, result.output


@pytest.mark.parametrize("month, words", [
    ("2024-9", ["not a month", "'2024-9'", "YYYY-MM"]),
    ("2024-009", ["not a month"]),
    ("9999-12", ["9999-12 is out of range"]),
    ("0000-01", ["0000-01 is out of range"]),
])
def test_a_month_not_exactly_yyyy_mm_or_out_of_range_is_a_usage_error(tmp_path, month, words):
    billing = write_focus(tmp_path / "b.csv", [line("2024-09-01 00:00:00", "1")])
    result = _recover(tmp_path, billing, month=month)
    _refused(result, *words)
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    actions = CliRunner().invoke(app, ["cost", "actions", "--month", month, "--out", str(tmp_path / "out")])
    _refused(actions, *words)


def test_a_rejected_list_cut_at_its_limit_says_so(tmp_path):
    from seedance_tasks.cost.ingest import MAX_REJECTED

    rows = [line("2024-09-01 00:00:00", "x")] * (MAX_REJECTED + 1) + [line("2024-09-02 00:00:00", "1")]
    result = _recover(tmp_path, write_focus(tmp_path / "b.csv", rows))
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "month=2024-09" / "summary.json").read_text())
    assert summary["rejected_count"] == MAX_REJECTED + 1 and len(summary["rejected"]) == MAX_REJECTED
    assert summary["rejected_truncated"] is True
    assert f"the first {MAX_REJECTED:,} of {MAX_REJECTED + 1:,}" in result.output
    few = _recover(tmp_path, write_focus(tmp_path / "c.csv", rows[-2:]))
    assert few.exit_code == 0
    assert json.loads((tmp_path / "out" / "month=2024-09" / "summary.json").read_text())["rejected_truncated"] is False


def _tags_parquet(tmp_path, tags: pa.Array):
    path = tmp_path / "focus.parquet"
    pq.write_table(pa.table({"ChargePeriodStart": ["2024-09-01", "2024-09-02", "2024-09-03"],
                             "BillingCurrency": ["USD"] * 3, "BilledCost": ["1", "2", "4"],
                             "EffectiveCost": ["1", "2", "4"], "Tags": tags}), path)
    return path


@pytest.mark.parametrize("tags", [
    pa.array([[("owner", "a")], [("Team", "b"), ("x", "y")], None], pa.map_(pa.string(), pa.string())),
    pa.array([{"owner": "a", "team": None}, {"owner": None, "team": "b"}, None],
             pa.struct([("owner", pa.string()), ("team", pa.string())])),
])
def test_map_and_struct_tags_in_parquet_are_read_like_json_tags(tmp_path, tags):
    billing = _tags_parquet(tmp_path, tags)
    owners = write_owners(tmp_path / "owners.yaml")
    result = _recover(tmp_path, billing, "--json", owners=owners)
    assert result.exit_code == 0, result.output
    usd = json.loads(result.stdout)["summary"]["currencies"]["USD"]
    assert usd["by_owner"] == {"a": "1", "b": "2"} and usd["unallocated"] == "4"
    audit = CliRunner().invoke(app, ["signals", "run", "--date", "2024-09-03", "--billing", str(billing),
                                     "--out", "none", "--json"])
    assert audit.exit_code == 0, audit.output


def test_tags_of_another_parquet_type_are_refused_naming_file_column_and_type(tmp_path):
    billing = _tags_parquet(tmp_path, pa.array([1, 2, 3], pa.int64()))
    result = _recover(tmp_path, billing)
    _refused(result, "focus.parquet: column 'Tags' has type int64")
    assert result.exit_code == 1


def test_a_non_string_owner_tag_is_a_malformed_tag_not_an_owner_and_is_named(tmp_path):
    rows = [line("2024-09-01 00:00:00", "1", tags={"owner": {"name": "a"}}),
            line("2024-09-02 00:00:00", "2", tags={"owner": True}),
            line("2024-09-03 00:00:00", "4", tags={"owner": ["a"]}),
            line("2024-09-04 00:00:00", "8", tags={"owner": 42}),
            line("2024-09-05 00:00:00", "16", tags={"owner": "b", "note": None})]
    result = _recover(tmp_path, write_focus(tmp_path / "b.csv", rows), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    assert summary["currencies"]["USD"]["by_owner"] == {"42": "8", "b": "16"}  # a number: its JSON text
    assert summary["currencies"]["USD"]["unallocated"] == "7"
    assert summary["malformed_tags_rows"] == [1, 2, 3]
    assert "warning: 3 lines of" in result.stderr and "malformed Tags" in result.stderr
    assert "data rows 1, 2, 3" in result.stderr


@pytest.mark.parametrize("section, kind, rules", [
    ("shared", "shared rule", [{"id": "s", "match": {"service": "A"}, "method": "usage_share", "usage": f"u{n}.csv",
                                "weights": {"bytes": "1"}} for n in (1, 2)]),
    ("rules", "CMDB rule", [{"id": "r", "owner": f"o{n}", "match": {"service": "A"}} for n in (1, 2)]),
])
def test_duplicate_rule_ids_in_the_owners_file_are_refused(tmp_path, section, kind, rules):
    owners = write_owners(tmp_path / "owners.yaml", **{section: rules})
    result = _recover(tmp_path, write_focus(tmp_path / "b.csv", [line("2024-09-01 00:00:00", "1")]), owners=owners)
    _refused(result, f"duplicate {kind} id '{rules[0]['id']}'")
    assert result.exit_code == 2


def test_format_cur_on_a_csv_is_refused_naming_it_and_publishes_nothing(tmp_path):
    billing = write_focus(tmp_path / "min.csv", [line("2024-09-01 00:00:00", "1")])
    assert _recover(tmp_path, billing).exit_code == 0
    published = (tmp_path / "out" / "month=2024-09" / "summary.json").read_bytes()
    result = _recover(tmp_path, billing, "--format", "cur")
    _refused(result, "--format cur reads CUR 2.0 Parquet; min.csv is not Parquet")
    assert (tmp_path / "out" / "month=2024-09" / "summary.json").read_bytes() == published


def test_billing_file_names_are_matched_in_any_case_and_skipped_files_are_named(tmp_path):
    import gzip

    folder = tmp_path / "billing"
    write_focus(folder / "b.CSV", [line("2024-09-01 00:00:00", "1")])
    plain = write_focus(tmp_path / "e.csv", [line("2024-09-02 00:00:00", "2")])
    (folder / "e.csv.GZ").write_bytes(gzip.compress(plain.read_bytes()))
    (folder / "notes.txt").write_text("not billing\n")
    result = _recover(tmp_path, folder, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    assert summary["rows_read"] == 2 and summary["currencies"]["USD"]["total"] == "3"
    assert "1 files in" in result.stderr and "not read: notes.txt" in result.stderr


@pytest.mark.parametrize("row, where", [
    ("i-1,2024-09-01,1,0,0,2024/01/01", "row 2, column created: not a YYYY-MM-DD date: '2024/01/01'"),
    ("i-1", "row 2, column date: missing"),
    ("i-1,2024-09-01,sNaN,0,0,", "row 2, column cpu_percent: not a finite number: 'sNaN'"),
    ("i-1,2024-09-01,abc,0,0,", "row 2, column cpu_percent: not a number: 'abc'"),
    ("i-1,2024-09-01,-1,0,0,", "row 2, column cpu_percent: negative: '-1'"),
    ("i-1,2024-09-01,1,0,-5,", "row 2, column network_out_bytes: negative: '-5'"),
])
def test_a_malformed_utilization_row_is_an_error_naming_file_row_and_column(tmp_path, row, where):
    usage = tmp_path / "u.csv"
    usage.write_text("resource_id,date,cpu_percent,network_in_bytes,network_out_bytes,created\n"
                     f"i-0,2024-09-01,1,0,0,\n{row}\n")
    billing = write_focus(tmp_path / "b.csv", [line("2024-09-01 00:00:00", "1")])
    result = _recover(tmp_path, billing, "--utilization", str(usage))
    _refused(result, f"utilization file {usage}, {where}")
    assert result.exit_code == 1


@pytest.mark.parametrize("currency", ["usd", "US", "US$"])
def test_a_currency_option_that_is_no_currency_code_is_a_usage_error(tmp_path, currency):
    billing = write_focus(tmp_path / "b.csv", [line("2024-09-01 00:00:00", "1")])
    result = _recover(tmp_path, billing, "--currency", currency)
    _refused(result, f"--currency {currency!r} is not a currency code")
    assert result.exit_code == 2 and not (tmp_path / "out").exists()


def test_a_charge_period_ending_before_it_starts_rejects_the_row(tmp_path):
    rows = [line("2024-09-02 00:00:00", "1", end="2024-09-01 00:00:00"),
            line("2024-09-02 00:00:00", "2", end="2024-09-03 00:00:00"),
            line("2024-09-02 00:00:00", "4")]
    result = _recover(tmp_path, write_focus(tmp_path / "b.csv", rows), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    assert summary["rejected"] == [{"file": str(tmp_path / "b.csv").split("/")[-1], "row": 1,
                                    "column": "ChargePeriodEnd", "reason": "ChargePeriodEnd 2024-09-01 00:00:00 is "
                                    "before ChargePeriodStart 2024-09-02 00:00:00"}]
    assert summary["currencies"]["USD"]["total"] == "6"


def test_the_human_table_shows_cents_with_thousands_and_the_json_stays_exact(tmp_path):
    billing = write_focus(tmp_path / "bill.csv", [
        line("2024-09-01T00:00:00Z", "1234.005", tags={"owner": "alpha"}),
        line("2024-09-02T00:00:00Z", "2.004", tags={"owner": "beta"}),
        line("2024-09-03T00:00:00Z", "0.333"),
    ])
    result = CliRunner().invoke(app, ["cost", "recover", "--month", "2024-09", "--billing", str(billing),
                                      "--owners", str(write_owners(tmp_path / "owners.yaml")),
                                      "--out", str(tmp_path / "out"), "--basis", "BilledCost"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = {cells[0]: cells[1] for cells in (
        [cell.strip() for cell in row.strip("│┃ ").split("│")] for row in result.output.splitlines() if "│" in row)
        if len(cells) == 2}
    assert rows["alpha"] == "1,234.01 USD" and rows["beta"] == "2.00 USD" and rows["(unallocated)"] == "0.33 USD"
    assert rows["TOTAL"] == "1,236.34 USD"
    summary = json.loads((tmp_path / "out" / "month=2024-09" / "summary.json").read_text())
    assert summary["currencies"]["USD"]["by_owner"]["alpha"] == "1234.005"  # the outputs keep every digit


@pytest.mark.parametrize("batch_rows", ["2", "500000"])
def test_malformed_tags_are_named_by_file_and_row_across_a_folder_of_files(tmp_path, monkeypatch, batch_rows):
    monkeypatch.setenv("SEEDANCE__COST__BATCH_ROWS", batch_rows)  # lines of a file split over batches, or not
    folder = tmp_path / "billing"
    write_focus(folder / "a.csv", [line("2024-09-01 00:00:00", "1", tags={"owner": "a"}),
                                   line("2024-09-02 00:00:00", "2", tags="{not json"),
                                   line("2024-08-31 00:00:00", "9", tags="{not json"),  # another month: not staged
                                   line("2024-09-03 00:00:00", "x"),  # rejected
                                   line("2024-09-04 00:00:00", "4", tags="[1]")])
    write_focus(folder / "b.csv", [line("2024-09-05 00:00:00", "8", tags="{oops"),
                                   line("2024-09-06 00:00:00", "16", tags={"owner": "b"}),
                                   line("2024-09-07 00:00:00", "32", tags="{oops")])
    result = _recover(tmp_path, folder, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    assert summary["malformed_tags"] == [{"file": "a.csv", "row": 2}, {"file": "a.csv", "row": 5},
                                         {"file": "b.csv", "row": 1}, {"file": "b.csv", "row": 3}]
    assert summary["malformed_tags_rows"] == [2, 5, 1, 3]  # as before: each the data row of its own file
    [warning] = [w for w in summary["warnings"] if "malformed Tags" in w]
    assert warning == (f"4 lines of {folder} have malformed Tags (not a JSON object of strings), attributed as "
                       "untagged: a.csv data rows 2, 5; b.csv data rows 1, 3 (malformed_tags in summary.json)\n"
                       '  hint: fix the Tags of those rows at the source: a JSON object of strings, e.g. '
                       '{"owner": "team-a"}')
    assert "hint: fix the Tags" in result.stderr and "a.csv data rows 2, 5; b.csv data rows 1, 3" in result.stderr


def test_line_files_map_a_staged_line_to_its_file():
    from seedance_tasks.cost.ingest import LineFiles

    files = LineFiles()
    assert files.to_json() == [] and files.file_at(0) is None
    for name, count in (("a.csv", 2), ("a.csv", 3), ("b.csv", 0), ("c.csv", 1)):
        files.add(name, count)
    assert files.to_json() == [["a.csv", 5], ["c.csv", 1]]
    assert [files.file_at(position) for position in range(7)] == ["a.csv"] * 5 + ["c.csv", None]
    assert LineFiles(files.to_json()).to_json() == files.to_json()


@pytest.mark.parametrize("section, key, value", [
    ({}, "overbudget_percent", "-5"),
    ({}, "overbudget_percent", "1000000"),
    ({}, "idle_cpu_percent", "-1"),
    ({}, "idle_cpu_percent", "101"),
    ({}, "gpu_busy_percent", "-0.5"),
    ({}, "idle_days", 100000),
    ({}, "cost_explorer_page_price", "-0.01"),
    ({}, "cost_explorer_page_price", ".inf"),
    ("actions", "reminders_after_hours", [24, -3]),
    ("actions", "reminders_after_hours", [0]),
    ("actions", "confirm_within_hours", 10**18),
    ("actions", "isolate_within_hours", -1),
    ("actions", "deduct_on_working_day", 400),
    ("actions", "day_length", "30d"),
])
def test_a_cost_setting_out_of_its_range_is_refused_naming_the_key(tmp_path, section, key, value):
    from seedance_tasks.config import load_section
    from seedance_tasks.errors import ConfigError

    setting = {key: value}
    config = tmp_path / "seedance.yaml"
    config.write_text(json.dumps({"cost": {section: setting} if section else setting}))
    with pytest.raises(ConfigError) as caught:
        load_section("cost", config, environ={})
    name = f"'cost.{section}.{key}" if section else f"'cost.{key}'"
    assert name in caught.value.message and str(config) in caught.value.message, caught.value.message
    assert caught.value.hint


def test_cost_settings_at_the_edges_of_their_ranges_are_accepted(tmp_path):
    from seedance_tasks.config import load_section

    config = tmp_path / "seedance.yaml"
    config.write_text(json.dumps({"cost": {"overbudget_percent": "0", "idle_cpu_percent": "100",
                                           "cost_explorer_page_price": "0",
                                           "actions": {"isolate_within_hours": 0, "reminders_after_hours": [],
                                                       "day_length": "10s"}}}))
    settings = load_section("cost", config, environ={})
    assert settings.overbudget_percent == 0 and settings.actions.reminders_after_hours == []


AZURE_EA = DATA / "azure-ea" / "EA_ActualCost_Small.csv"


@pytest.mark.parametrize("name, content, words", [
    ("ea.csv", AZURE_EA.read_bytes(), ["an Azure cost details", "MeterCategory", "Cost and usage details (FOCUS)"]),
    ("mca.csv", b"billingAccountId,date,meterCategory,costInBillingCurrency,billingCurrency\nA,09/01/2024,VM,1,USD\n",
     ["an Azure cost details", "costInBillingCurrency", "(FOCUS)"]),
    ("gcp.csv", b"billing_account_id,service.description,sku.description,usage_start_time,cost,currency\n"
     b"A,Compute Engine,N1,2024-09-01 00:00:00 UTC,1.5,USD\n", ["Google Cloud billing export", "FOCUS view"]),
    ("cur2.csv", b"bill_payer_account_id,line_item_usage_start_date,line_item_unblended_cost\n1,2024-09-01,1\n",
     ["AWS CUR 2.0", "--format cur", "Parquet"]),
    ("cur1.csv", b"identity/LineItemId,lineItem/UsageStartDate,lineItem/UnblendedCost,lineItem/CurrencyCode\n"
     b"x,2024-09-01T00:00:00Z,1,USD\n", ["legacy AWS Cost and Usage Report", "CUR 2.0", "--format cur"]),
    ("oci.csv", b"lineItem/referenceNo,lineItem/intervalUsageStart,cost/myCost,cost/currencyCode\nx,2024-09-01,1,USD\n",
     ["Oracle Cloud (OCI) cost report", "FOCUS Reports"]),
])
def test_a_provider_export_that_is_not_focus_is_named_with_what_to_pass_instead(tmp_path, name, content, words):
    billing = tmp_path / name
    billing.write_bytes(content)
    result = _recover(tmp_path, billing)
    _refused(result, name, "not a FOCUS file", "no ChargePeriodStart column", *words)
    assert not (tmp_path / "out" / "month=2024-09").exists()


def test_a_cur_parquet_given_as_focus_is_refused_with_the_cur_format_in_the_hint(tmp_path):
    from tests.cost.cur_sample import write_cur_month

    billing = write_cur_month(tmp_path / "cur" / "cur-2024-09.parquet")
    _refused(_recover(tmp_path, billing), "cur-2024-09.parquet: this looks like an AWS CUR 2.0 export",
             "line_item_unblended_cost", "--format cur")
