"""Billing and usage files nobody had tried: FOCUS tag values of every JSON type the spec allows,
CSV exports in other encodings, usage rows without an owner."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from tests.cost.helpers import line, write_focus, write_owners


def _recover(tmp_path, billing, *extra, owners=None, month="2024-09"):
    owners = owners or write_owners(tmp_path / "owners.yaml")
    return CliRunner().invoke(app, ["cost", "recover", "--month", month, "--billing", str(billing),
                                    "--owners", str(owners), "--out", str(tmp_path / "out"), "--json", *extra])


def _summary(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["summary"]


def test_a_true_false_tag_value_is_a_tag_and_the_line_keeps_its_owner(tmp_path):
    # FOCUS's key-value format allows string, number, true/false and null values
    rows = [line("2024-09-01 00:00:00", "1", tags={"owner": "a", "spot": True}),
            line("2024-09-02 00:00:00", "2", tags={"Team": "b", "gpu": False, "replicas": 3}),
            line("2024-09-03 00:00:00", "4", tags={"spot": True}),
            line("2024-09-04 00:00:00", "8", tags={"owner": True})]
    owners = write_owners(tmp_path / "owners.yaml", rules=[
        {"id": "spot", "match": {"tag": {"spot": "true"}}, "owner": "spot-pool"}])
    summary = _summary(_recover(tmp_path, write_focus(tmp_path / "b.csv", rows), owners=owners))
    assert summary["currencies"]["USD"]["by_owner"] == {"a": "1", "b": "2", "spot-pool": "4"}
    assert summary["currencies"]["USD"]["unallocated"] == "8"
    assert summary["malformed_tags_rows"] == [4]  # an owner tag that is true/false names nobody


def _rows():
    return [line("2024-09-01 00:00:00", "1", tags='{"owner": "zoé"}'),
            line("2024-09-02 00:00:00", "2", tags='{"owner": "b"}', resource="two\nlines"),
            line("2024-09-03 00:00:00", "4", tags='{"owner": "Søren"}'),
            line("2024-09-04 00:00:00", "8", tags='{"owner": "b"}')]


@pytest.mark.parametrize("encoding, name", [("utf-16", "b.csv"), ("utf-16-le", "b.csv"), ("utf-16-be", "b.csv"),
                                            ("utf-8-sig", "b.csv"), ("utf-16", "b.csv.gz")])
def test_a_utf16_or_bom_csv_reads_as_its_utf8_twin(tmp_path, encoding, name):
    text = write_focus(tmp_path / "plain.csv", _rows()).read_text(encoding="utf-8")
    data = text.encode(encoding)
    path = tmp_path / "in" / name
    path.parent.mkdir()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    summary = _summary(_recover(tmp_path, path))
    assert summary["currencies"]["USD"]["by_owner"] == {"zoé": "1", "b": "10", "Søren": "4"}
    assert summary["rejected_count"] == 0
    assert pq.read_table(tmp_path / "out" / "month=2024-09" / "allocations.parquet").num_rows == 4


@pytest.mark.parametrize("name", ["b.csv", "b.csv.gz"])
def test_bytes_that_are_not_utf8_name_the_file_the_data_row_and_the_byte_offset(tmp_path, name):
    data = write_focus(tmp_path / "plain.csv", _rows()).read_text(encoding="utf-8").replace(
        "zoé", "zoe").encode("latin-1")  # row 3's "ø" is the first non-ASCII byte; row 2 spans two lines
    path = tmp_path / "in" / name
    path.parent.mkdir()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    result = _recover(tmp_path, path)
    assert result.exit_code == 1 and "Traceback" not in result.output
    offset = data.index("ø".encode("latin-1"))
    assert f"error: {name}: data row 3 is not UTF-8 text (byte 0xf8 at byte offset {offset:,}" in result.output, \
        result.output
    assert "hint:" in result.output and "iconv" in result.output


@pytest.mark.parametrize("nobody", ["", "  "])
def test_a_usage_row_without_an_owner_is_left_out_of_the_totals_too_with_a_warning(tmp_path, nobody):
    (tmp_path / "usage").mkdir()
    (tmp_path / "usage" / "msk-2024-09.csv").write_text(
        f"owner,partitions,bytes\n{nobody},90,0\nml,10,50\nweb,0,50\n")
    shared = [{"id": "kafka", "match": {"service": "MSK"}, "method": "usage_share",
               "usage": "usage/msk-{month}.csv", "weights": {"partitions": "0.5", "bytes": "0.5"}}]
    owners = write_owners(tmp_path / "owners.yaml", shared=shared)
    summary = _summary(_recover(tmp_path, write_focus(tmp_path / "b.csv", [
        line("2024-09-01 00:00:00", "4", service="MSK")]), owners=owners))
    # ml holds all the partitions with an owner and half the bytes: 0.5 * 1 + 0.5 * 0.5 = 3/4
    assert summary["currencies"]["USD"]["by_owner"] == {"ml": "3", "web": "1"}
    [warning] = [w for w in summary["warnings"] if "kafka" in w]
    assert "1 row(s) left out of the split: row 2: no owner" in warning and "msk-2024-09.csv" in warning


def test_a_parquet_tags_column_of_type_null_is_an_untagged_month_not_a_refusal(tmp_path):
    # polars and DuckDB write a column with no value at all as Arrow's null type
    billing = tmp_path / "focus.parquet"
    pq.write_table(pa.table({"ChargePeriodStart": ["2024-09-01T00:00:00Z", "2024-09-02T00:00:00Z"],
                             "BillingCurrency": ["USD", "USD"], "BilledCost": [1.5, 2.0], "EffectiveCost": [1.5, 2.0],
                             "SubAccountId": ["111", "222"], "Tags": pa.nulls(2)}), billing)
    owners = write_owners(tmp_path / "owners.yaml", rules=[
        {"id": "acct", "match": {"sub_account": "111"}, "owner": "ml"}])
    summary = _summary(_recover(tmp_path, billing, owners=owners))
    assert summary["currencies"]["USD"]["by_owner"] == {"ml": "1.5"}
    assert summary["currencies"]["USD"]["unallocated"] == "2"


@pytest.mark.parametrize("section, entry", [("budgets", {"amount": "1"}), ("contacts", {"email": "x@example.com"}),
                                            ("approvers", ["ops"])])
def test_two_spellings_of_one_owner_in_the_owners_file_are_refused_not_one_silently_dropped(tmp_path, section, entry):
    from seedance_tasks.cost.owners import load_owners
    from seedance_tasks.errors import ConfigError

    owners = write_owners(tmp_path / "owners.yaml", **{section: {"ml": entry, " ml ": entry}})
    with pytest.raises(ConfigError) as refused:
        load_owners(str(owners))
    assert "'ml' and ' ml ' are the same owner" in str(refused.value) and section in str(refused.value)


def test_the_over_budget_notice_and_report_show_amounts_by_the_money_rule_and_a_zero_budget_plainly(tmp_path):
    from seedance_tasks.cost.recover import recover_month

    rows = [line("2024-09-01 00:00:00", "12.3456789", tags={"owner": "ml"}),
            line("2024-09-02 00:00:00", "1234.5", currency="JPY", tags={"owner": "web"})]
    owners = write_owners(tmp_path / "owners.yaml", budgets={"ml": {"amount": "10", "currency": "USD"},
                                                             "web": {"amount": "0", "currency": "JPY"}})
    out = tmp_path / "out"
    recover_month(month="2024-09", billing=str(write_focus(tmp_path / "b.csv", rows)), owners=str(owners),
                  out=str(out), apply=True, backfill=False)
    outbox = [json.loads(row) for row in (out / "_seedance" / "cost" / "outbox.jsonl").read_text().splitlines()]
    notices = {row["owner"]: row["message"] for row in outbox if row["key"].startswith("budget:")}
    assert "ml spent 12.35 USD in 2024-09 against a budget of 10.00 USD (+23.46%)." in notices["ml"]
    assert "web spent 1,235 JPY in 2024-09 against a budget of 0 JPY. The" in notices["web"]
    report = (out / "month=2024-09" / "report.html").read_text()
    assert "None" not in report and "+23.46%" in report


@pytest.mark.parametrize("approved, shown", [(True, "yes"), (False, "no"), ("false", "no"), ("no", "no"), (1, "no")])
def test_the_report_reads_approved_as_a_json_boolean_not_by_truthiness(approved, shown):
    from seedance_tasks.cost.report import render_report

    summary = {"month": "2024-09", "basis": "EffectiveCost", "lines": 1, "rejected_count": 0,
               "tag_conflicts": {"count": 0}, "currencies": {"USD": {
                   "by_owner": {"ml": "30"}, "unallocated": "0", "total": "30", "invoice_total": "30"}},
               "over_budget": [{"owner": "ml", "spend": "30", "budget": "10", "currency": "USD",
                                "over_percent": "200", "approved": approved}]}
    page = render_report(summary, [summary])
    assert f"<td>+200%</td><td>{shown}</td>" in page


@pytest.mark.parametrize("ragged", [False, True])
def test_a_csv_cut_short_inside_a_quoted_field_is_refused_naming_the_row(tmp_path, ragged):
    rows = [line("2024-09-01 00:00:00", "1", tags={"owner": "a"}), line("2024-09-02 00:00:00", "2", tags={"owner": "b"}),
            line("2024-09-03 00:00:00", "4", tags={"owner": "c", "env": "prod"}),
            line("2024-09-04 00:00:00", "8", tags={"owner": "d"})]
    text = write_focus(tmp_path / "whole.csv", rows).read_text()
    if ragged:  # a short row sends the reader down its record-by-record path
        text = text.replace("\n", "\n2024-09-01,USD\n", 1)
    cut = tmp_path / "in" / "cut.csv"
    cut.parent.mkdir()
    cut.write_text(text[:text.index('""env""')], newline="")  # the download stopped in row 3's Tags
    result = _recover(tmp_path, cut)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    row = 4 if ragged else 3
    assert f"error: cut.csv: data row {row} opens a quoted field that never closes" in result.output
    assert "hint: download or export the file again" in result.output


def test_a_literal_quote_in_an_unquoted_field_is_still_read(tmp_path):
    rows = [line("2024-09-01 00:00:00", "1", tags={"owner": "a"}, resource='pipe-12"'),
            line("2024-09-02 00:00:00", "2", tags={"owner": "b"})]
    text = write_focus(tmp_path / "whole.csv", rows).read_text().replace('"pipe-12"""', 'pipe-12"')
    billing = tmp_path / "in" / "b.csv"
    billing.parent.mkdir()
    billing.write_text(text, newline="")
    assert text.count('"') % 2
    summary = _summary(_recover(tmp_path, billing))
    assert summary["currencies"]["USD"]["by_owner"] == {"a": "1", "b": "2"}
    resources = pq.read_table(tmp_path / "out" / "month=2024-09" / "allocations.parquet").column("ResourceId")
    assert resources.to_pylist()[0] == 'pipe-12"'


def test_a_csv_with_old_mac_line_endings_reads_like_its_twin(tmp_path):
    rows = [line("2024-09-01 00:00:00", "1", tags={"owner": "a"}), line("2024-09-02 00:00:00", "2", tags={"owner": "b"})]
    text = write_focus(tmp_path / "whole.csv", rows).read_text()
    billing = tmp_path / "in" / "mac.csv"
    billing.parent.mkdir()
    billing.write_bytes(text.replace("\r\n", "\r").replace("\n", "\r").encode())  # Excel's "CSV (Macintosh)"
    assert _summary(_recover(tmp_path, billing))["currencies"]["USD"]["by_owner"] == {"a": "1", "b": "2"}


UTILIZATION = "resource_id,date,cpu_percent,network_in_bytes,network_out_bytes,owner\n"


def test_a_utilization_file_that_is_not_utf8_is_named_with_its_line_and_utf16_is_read(tmp_path):
    billing = write_focus(tmp_path / "b.csv", [line("2024-09-01 00:00:00", "1", resource="i-1")])
    latin = tmp_path / "util.csv"
    latin.write_bytes((UTILIZATION + "i-1,2024-09-30,1,0,0,zoé\n").encode("latin-1"))
    result = _recover(tmp_path, billing, "--utilization", str(latin))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"error: utilization file {latin}: can't decode line 2 as UTF-8 (byte 0xe9 at byte offset" in result.output
    wide = tmp_path / "util16.csv"
    wide.write_bytes((UTILIZATION + "".join(f"i-1,2024-09-{day},1,0,0,zoé\n" for day in range(20, 31))).encode("utf-16"))
    summary = _summary(_recover(tmp_path, billing, "--utilization", str(wide)))
    assert [item["resource_id"] for item in summary["idle"]] == ["i-1"]


def test_a_utf16_usage_file_splits_like_its_utf8_twin(tmp_path):
    (tmp_path / "usage").mkdir()
    (tmp_path / "usage" / "msk-2024-09.csv").write_bytes("owner,bytes\r\nml,10\r\nweb,30\r\n".encode("utf-16"))
    shared = [{"id": "kafka", "match": {"service": "MSK"}, "method": "usage_share",
               "usage": "usage/msk-{month}.csv", "weights": {"bytes": "1"}}]
    owners = write_owners(tmp_path / "owners.yaml", shared=shared)
    summary = _summary(_recover(tmp_path, write_focus(tmp_path / "b.csv", [
        line("2024-09-01 00:00:00", "4", service="MSK")]), owners=owners))
    assert summary["currencies"]["USD"]["by_owner"] == {"ml": "1", "web": "3"}


def test_tags_nested_deeper_than_the_stack_are_malformed_tags_not_a_crash(tmp_path):
    deep = '{"owner": "a", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    rows = [line("2024-09-01 00:00:00", "1", tags=deep), line("2024-09-02 00:00:00", "2", tags={"owner": "b"})]
    summary = _summary(_recover(tmp_path, write_focus(tmp_path / "b.csv", rows)))
    assert summary["currencies"]["USD"]["by_owner"] == {"b": "2"}
    assert summary["malformed_tags_rows"] == [1]


def _folder_with(tmp_path, files: dict[str, bytes]):
    folder = tmp_path / "billing"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_a_second_download_of_one_export_is_refused_naming_both_not_charged_twice(tmp_path):
    data = write_focus(tmp_path / "x.csv", [line("2024-09-01 00:00:00", "1", tags={"owner": "a"})]).read_bytes()
    other = write_focus(tmp_path / "y.csv", [line("2024-09-02 00:00:00", "2", tags={"owner": "a"})]).read_bytes()
    result = _recover(tmp_path, _folder_with(tmp_path, {"focus.csv": data, "focus (1).csv": data, "z.csv": other}))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "error: focus (1).csv and focus.csv are the same file, byte for byte" in result.output
    assert "hint: remove the copy" in result.output


def test_an_export_beside_its_gzip_is_refused_naming_both(tmp_path):
    data = write_focus(tmp_path / "x.csv", [line("2024-09-01 00:00:00", "1", tags={"owner": "a"})]).read_bytes()
    result = _recover(tmp_path, _folder_with(tmp_path, {"part-1.csv": data, "part-1.csv.gz": gzip.compress(data)}))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "error: part-1.csv and part-1.csv.gz look like one export, unpacked and packed" in result.output


def test_alike_parts_without_lines_are_not_copies(tmp_path):
    header = write_focus(tmp_path / "h.csv", []).read_bytes()
    data = write_focus(tmp_path / "x.csv", [line("2024-09-01 00:00:00", "1", tags={"owner": "a"})]).read_bytes()
    empty = pa.table({"ChargePeriodStart": pa.array([], pa.string()), "BillingCurrency": pa.array([], pa.string()),
                      "BilledCost": pa.array([], pa.float64()), "EffectiveCost": pa.array([], pa.float64())})
    folder = _folder_with(tmp_path, {"part-0.csv": header, "part-1.csv": header, "part-2.csv": data})
    pq.write_table(empty, folder / "p-0.parquet")
    pq.write_table(empty, folder / "p-1.parquet")
    assert _summary(_recover(tmp_path, folder))["currencies"]["USD"]["by_owner"] == {"a": "1"}
