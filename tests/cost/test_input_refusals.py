"""Bad arguments and bad input files of the cost pipeline: each refused with an `error:` line naming
what is wrong and a hint, never an internal error."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from tests.cost.helpers import line, write_focus, write_owners


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
