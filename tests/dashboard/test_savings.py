"""Savings from the pipelines' reports: a report is untrusted input (a damaged or hand-edited XCom)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from seedance_tasks.dashboard import pages
from seedance_tasks.dashboard.savings import RunReport, savings

WHEN = datetime(2026, 3, 5, tzinfo=UTC)
GOOD = RunReport("seedance_checkpoint_lifecycle", "good", WHEN,
                 {"applied": True, "monthly_usd_saved": "1.50", "bytes_freed": 2048, "moved": 3})


@pytest.mark.parametrize(("dag_id", "report", "key"), [
    ("seedance_compaction", {"partitions_compacted": 2, "estimated_monthly_saving": {"usd": "abc", "s3_requests": 10}},
     "estimated_monthly_saving.usd"),
    ("seedance_compaction", {"partitions_compacted": 2, "estimated_monthly_saving": {"usd": "1", "s3_requests": [4]}},
     "estimated_monthly_saving.s3_requests"),
    ("seedance_compaction", {"partitions_compacted": 2, "estimated_monthly_saving": "lots"}, "estimated_monthly_saving"),
    ("seedance_compaction", {"partitions_compacted": 2, "bytes_before": "1e999999999", "bytes_after": 0}, "bytes_before"),
    ("seedance_checkpoints", {"raw_bytes": 100, "stored_bytes": "forty"}, "stored_bytes"),
    ("seedance_checkpoint_lifecycle", {"applied": True, "monthly_usd_saved": "NaN"}, "monthly_usd_saved"),
    ("seedance_checkpoint_lifecycle", {"applied": True, "bytes_freed": 10.5}, "bytes_freed"),
    ("seedance_checkpoint_lifecycle", {"applied": True, "moved": True}, "moved"),
])
def test_a_figure_that_is_not_a_number_is_named_and_the_other_savings_still_show(dag_id, report, key):
    bad = RunReport(dag_id, "bad-run", WHEN, report)
    result = savings([GOOD, bad])
    assert len(result["errors"]) == 1
    assert f"{dag_id} run bad-run" in result["errors"][0] and f"{key} is " in result["errors"][0]
    lifecycle = next(row for row in result["rows"] if "good" in row.run_ids)
    assert lifecycle.usd >= Decimal("1.50") and lifecycle.bytes_saved >= 2048
    page = pages.savings_page(result, None)
    assert page.count("<p class='err'>") == 1 and key in page and "bad-run" in page
    assert "$1.50" in page or "1.50" in page


def test_the_readable_figures_of_a_damaged_report_are_kept():
    bad = RunReport("seedance_compaction", "half", WHEN, {
        "partitions_compacted": 1, "bytes_before": 1000, "bytes_after": 400,
        "estimated_monthly_saving": {"usd": {"amount": 3}, "s3_requests": "120"}})
    result = savings([bad])
    (row,) = result["rows"]
    assert (row.usd, row.requests, row.bytes_saved, row.unreadable) == (Decimal(0), 120, 600, 1)
    assert "estimated_monthly_saving.usd" in result["errors"][0]
    assert "1 figure(s) unreadable" in pages.savings_page(result, None)
