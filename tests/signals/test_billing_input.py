"""Billing input the audit cannot fully use: rejected rows and unusable quantities are reported
(count, file, row, reason), never silently dropped; the other rows and rules go on."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app

HEADER = "ChargePeriodStart,BillingCurrency,BilledCost,EffectiveCost,ServiceName,ConsumedQuantity,Tags\n"


def _run(tmp_path, body: str, day: str = "2024-09-30", *extra):
    billing = tmp_path / "billing.csv"
    billing.write_text(HEADER + body)
    result = CliRunner().invoke(app, ["signals", "run", "--date", day, "--billing", str(billing), "--out", "none",
                                      *extra])
    assert "Traceback" not in result.output and "unexpected" not in result.output, result.output
    return result


def test_rejected_billing_rows_are_reported_in_the_json_and_as_a_warning(tmp_path):
    body = ('2024-09-29,USD,10,10,EC2,,"{""owner"":""a""}"\n'
            '2024-09-30,USD,"1,000.00","1,000.00",EC2,,\n')
    result = _run(tmp_path, body, "2024-09-30", "--json")
    assert result.exit_code == 0, result.output
    billing = json.loads(result.stdout)["billing"]
    assert billing["rejected_count"] == 1 and billing["rejected_truncated"] is False
    assert billing["rejected"] == [{"file": "billing.csv", "row": 2, "column": "EffectiveCost",
                                    "reason": "malformed EffectiveCost: not a number: '1,000.00'"}]
    assert "warning: 1 billing row(s) rejected" in result.stderr and "billing.csv:2" in result.stderr
    assert not (tmp_path / "none").exists() and not Path("none").exists()


def test_a_non_numeric_consumed_quantity_is_named_and_the_audit_goes_on(tmp_path):
    body = "2024-09-29,USD,10,10,EC2,n/a,\n2024-09-30,USD,1,1,EC2,\"1,000\",\n"
    result = _run(tmp_path, body, "2024-09-30", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["billing"]["quantity_unknown"] == [{"file": "billing.csv", "row": 1, "column": "ConsumedQuantity",
                                                   "reason": "ConsumedQuantity is not a number: 'n/a'"}]
    share = next(s for s in doc["signals"] if s["id"] == "unallocated-share")
    assert share["fired"] and "skipped" not in share  # both lines are unowned: the rule ran on them
    assert "billing.csv:1" in result.stderr


def test_billing_rules_say_skipped_when_no_line_is_in_their_window(tmp_path):
    result = _run(tmp_path, "2024-09-29,USD,10,10,EC2,,\n", "2023-09-30", "--json")
    assert result.exit_code == 0, result.output
    billing_rules = [s for s in json.loads(result.stdout)["signals"] if s["id"] in
                     ("egress-jump", "cost-surge", "unallocated-share")]
    assert [s["skipped"] for s in billing_rules] == ["no billing lines in the window 2023-08-06..2023-09-30",
                                                     "no billing lines in the window 2023-09-02..2023-09-30",
                                                     "no billing lines in the window 2023-09-01..2023-09-30"]


@pytest.mark.parametrize("day", ["9999-12-31", "0001-01-01"])
def test_a_night_out_of_range_is_a_usage_error(tmp_path, day):
    result = _run(tmp_path, "2024-09-29,USD,10,10,EC2,,\n", day)
    assert result.exit_code == 2 and f"--date {day} is out of range" in result.output and "hint:" in result.output


def _metrics(tmp_path) -> str:
    from tests.signals.builders import samples_file

    return samples_file(tmp_path / "samples.parquet", [("DCGM_FI_DEV_GPU_UTIL", {"job": "j"}, [(1727654400, 50.0)])])


def test_a_billing_file_whose_every_row_is_rejected_skips_the_billing_rules_and_the_metric_rules_run(tmp_path):
    from seedance_tasks.signals.registry import RULES

    body = '2024-09-29,USD,ten,ten,EC2,,\n2024-09-30,usd$,1,1,EC2,,\n'
    result = _run(tmp_path, body, "2024-09-30", "--metrics", _metrics(tmp_path), "--json")
    assert result.exit_code == 0, result.output  # a warning, as for some rows rejected: the rest of the night ran
    doc = json.loads(result.stdout)
    reason = f"billing source {tmp_path / 'billing.csv'} is present but unusable: all 2 rows rejected (see the warnings)"
    assert doc["billing_skipped"] == reason
    billing_rules = [rule_id for rule_id, rule in RULES.items() if "billing" in rule.needs]
    assert {s["id"]: s.get("skipped") for s in doc["signals"] if s["id"] in billing_rules} == dict.fromkeys(
        billing_rules, reason)
    blind = next(s for s in doc["signals"] if s["id"] == "metrics-blind-spot")
    assert "skipped" not in blind and blind["fired"]  # the metric rules ran
    assert doc["billing"]["all_rejected"] is True and doc["billing"]["rejected_by_file"] == {"billing.csv": 2}
    [warning] = doc["warnings"]
    assert warning.startswith(f"billing source {tmp_path / 'billing.csv'}: all 2 billing rows rejected "
                              "(billing.csv: 2), no line left to audit: billing.csv:1: malformed EffectiveCost")
    assert "billing.csv:2: malformed BillingCurrency: 'usd$'" in warning
    assert "the billing rules are skipped, the others ran" in warning
    assert "warning: billing source" in result.stderr and "hint: fix those rows at the source" in result.stderr
    assert "error:" not in result.stderr


def test_no_billing_configured_and_billing_rejected_are_told_apart(tmp_path):
    from seedance_tasks.signals.audit import render_html, run_audit
    from tests.signals.builders import inputs

    billing = tmp_path / "billing.csv"
    billing.write_text(HEADER + "2024-09-29,USD,ten,ten,EC2,,\n")
    rejected = run_audit(date(2024, 9, 30), inputs(billing_uri=str(billing)))
    none = run_audit(date(2024, 9, 30), inputs())
    assert none["billing_skipped"] == "no billing source (--billing or signals.billing_uri)"
    assert none["warnings"] == [] and "billing" not in none
    assert rejected["billing_skipped"].startswith(f"billing source {billing} is present but unusable: all 1 rows")
    page = render_html(rejected)
    assert "Billing rules skipped: billing source" in page and "all 1 billing rows rejected" in page


def test_a_billing_file_with_a_header_only_skips_the_billing_rules_with_a_warning(tmp_path):
    result = _run(tmp_path, "", "2024-09-30", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["billing_skipped"] == f"billing source {tmp_path / 'billing.csv'} is present but has no data rows"
    assert doc["warnings"] == [f"billing source {tmp_path / 'billing.csv'} has no data rows (a header only): the "
                               "billing rules are skipped, the others ran\n  hint: check that the export finished, "
                               "or point --billing / signals.billing_uri at the right file"]
    share = next(s for s in doc["signals"] if s["id"] == "unallocated-share")
    assert share["skipped"] == doc["billing_skipped"]


@pytest.mark.parametrize("quantity", ["NaN", "inf", "-Infinity", "1e400"])
def test_a_consumed_quantity_that_is_not_finite_is_unknown_never_nan_in_the_json(tmp_path, quantity):
    """NaN in the evidence made findings.json invalid JSON; +Inf passed for a usage rise that
    explained (silenced) a cost surge."""
    from datetime import timedelta

    from seedance_tasks.signals.sample import focus_file, template
    from tests.signals.builders import NIGHT, days

    row = template("On Demand Linux g5.4xlarge Instance Hour")
    lines = [(row, day, 98 if i % 2 else 102, 24) for i, day in enumerate(days(28, NIGHT - timedelta(days=1)))]
    lines.append((row, NIGHT, 150, quantity))
    result = CliRunner().invoke(app, ["signals", "run", "--date", NIGHT.isoformat(), "--billing",
                                      focus_file(tmp_path / "billing.csv", lines), "--out", "none", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    assert doc["billing"]["quantity_unknown_count"] == 1
    assert doc["billing"]["quantity_unknown"][0]["reason"] == f"ConsumedQuantity is not a number: {quantity!r}"
    surge = next(s for s in doc["signals"] if s["id"] == "cost-surge")
    assert [f["evidence"]["usage"] for f in surge["findings"]] == [0.0, 0.0]  # by service and by owner
