"""The actions workflow reads a month's published summary.json as untrusted input: an amount or a
currency the recovery would never write is an error naming the file and the key, not a crash."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app


@pytest.mark.parametrize("summary, key", [
    ({"currencies": {"USD": {"by_owner": {"a": "1e400"}}}}, "currencies.USD.by_owner.a"),
    ({"currencies": {"USD": {"by_owner": {"a": "1"}}},
      "over_budget": [{"owner": "a", "spend": "1e999", "budget": "1", "currency": "USD"}]}, "over_budget.0.spend"),
    ({"currencies": {"USD": {"by_owner": {"a": True}}}}, "currencies.USD.by_owner.a"),
    ({"currencies": {"<b>US": {"by_owner": {"a": "1"}}}}, "currencies.<b>US"),
    ({"currencies": {"USD": {"by_owner": {"a": "1"}}},
      "over_budget": [{"owner": "a", "spend": "3", "budget": "1", "currency": "dollars"}]}, "over_budget.0.currency"),
])
def test_an_amount_or_currency_the_recovery_never_writes_is_named(tmp_path, summary, key):
    path = tmp_path / "out" / "month=2024-09" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(summary))
    result = CliRunner().invoke(app, ["cost", "actions", "--month", "2024-09", "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "Traceback" not in result.output and "unexpected" not in result.output
    assert f"error: {path}: not a cost summary ({key}" in result.output, result.output
    assert "hint: re-run seedance_cost_recovery" in result.output


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "1e400", "-sNaN"])
def test_an_earlier_month_with_an_amount_no_run_writes_is_left_out_of_the_trend_not_a_crash(tmp_path, bad):
    from tests.cost.helpers import line, write_focus, write_owners

    earlier = tmp_path / "out" / "month=2024-08" / "summary.json"
    earlier.parent.mkdir(parents=True)
    earlier.write_text(json.dumps({"month": "2024-08", "currencies": {"USD": {"unallocated": bad}}}))
    result = CliRunner().invoke(app, [
        "cost", "recover", "--month", "2024-09", "--billing",
        str(write_focus(tmp_path / "b.csv", [line("2024-09-01 00:00:00", "1")])),
        "--owners", str(write_owners(tmp_path / "owners.yaml")), "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["report"]["trend_skipped"] == ["month=2024-08/summary.json"]
    assert (tmp_path / "out" / "month=2024-09" / "report.html").is_file()
