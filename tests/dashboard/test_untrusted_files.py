"""The files the pages read are untrusted: a month summary, a quarantine reason or a night's finding
that is not what the pipeline writes is an error box (or left out), never a failed page, and the
rest of the root is still shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedance_tasks import ui
from seedance_tasks.dashboard import pages
from seedance_tasks.dashboard.sources import FINDINGS, Root, Sources
from tests.browser_support import Browser, chromium

GOOD = {"month": "2024-08", "lines": 1, "currencies": {"USD": {"by_owner": {"ml": "12.34"}, "total": "12.34",
                                                                "unallocated": "0"}}}


def _usd(**entry) -> dict:
    return {"month": "2024-09", "lines": 1,
            "currencies": {"USD": {"by_owner": {"ml": "1"}, "total": "1", "unallocated": "0", **entry}}}


MALFORMED_SUMMARIES = {
    "a list": [1, 2],
    "an amount that is no number": _usd(by_owner={"ml": "abc"}),
    "NaN": _usd(total="NaN"),
    "an infinite amount": _usd(unallocated="Infinity"),
    "an amount too large to show": _usd(by_owner={"ml": "1e999999"}),
    "a null amount": _usd(unallocated=None),
    "currencies as a list": {"lines": 1, "currencies": ["USD"]},
    "an idle cost that is no number": {**_usd(), "idle": [{"resource_id": "i-1", "cost": {"USD": "zz"}}]},
    "an idle entry that is no object": {**_usd(), "idle": ["i-1"]},
    "an over-budget entry without spend": {**_usd(), "over_budget": [{"owner": "ml", "budget": "1"}]},
    "an over-budget currency that is no code": {**_usd(), "over_budget": [
        {"owner": "ml", "spend": "2", "budget": "1", "currency": 7, "over_percent": 100, "approved": False}]},
    "an approval that is the string 'false'": {**_usd(), "over_budget": [
        {"owner": "ml", "spend": "2", "budget": "1", "currency": "USD", "over_percent": 100, "approved": "false"}]},
}


@pytest.mark.parametrize("summary", MALFORMED_SUMMARIES.values(), ids=MALFORMED_SUMMARIES.keys())
def test_a_malformed_month_summary_is_an_error_and_the_other_months_still_show(tmp_path, summary):
    for month, document in (("2024-08", GOOD), ("2024-09", summary)):
        (tmp_path / f"month={month}").mkdir()
        (tmp_path / f"month={month}" / "summary.json").write_text(json.dumps(document))
    sources = Sources((Root("cost", "chargeback output", str(tmp_path), "test"),))
    page = pages.cost_page(sources, ui.cost_sections(sources)[0])
    assert "<p class='err'>error: " in page and "month=2024-09/summary.json: not shown" in page
    assert "hint: publish the month again" in page
    assert "data-owner='ml' data-month='2024-08'>12.34 USD</span>" in page  # the good month is still shown


def _quarantined(root: Path, reason: str) -> Sources:
    folder = root / "_seedance" / "quarantine" / "run-1"
    folder.mkdir(parents=True)
    (folder / "part-0.parquet").write_bytes(b"x")
    (folder / "part-0.parquet.reason.json").write_text(reason)
    return Sources((Root("compaction", "lake", str(root), "test"),))


@pytest.mark.parametrize(("reason", "shown"), [
    ("[1, 2]", "unreadable reason file: not a JSON object"),
    (json.dumps({"file": "part-0.parquet", "reason": "bad", "run_id": "run-1", "at": "yesterday"}), "yesterday"),
    (json.dumps({"file": "part-0.parquet", "reason": "bad", "run_id": "run-1", "at": 5}), "<td>5</td>"),
    (json.dumps({"file": "part-0.parquet", "reason": "bad", "run_id": "run-1", "at": "2024-01-02T03:04:00+05:00"}),
     "2024-01-01 22:04 UTC"),  # an aware time is converted, not labelled UTC as it is
], ids=["a list", "a time that is no time", "a number as the time", "a time in another zone"])
def test_a_malformed_quarantine_reason_is_shown_not_a_failed_page(tmp_path, reason, shown):
    sources = _quarantined(tmp_path, reason)
    page = pages.safety_page(sources, [], None, ui.safety_statuses(sources))
    assert "<h3>Quarantine</h3><table>" in page and shown in page


def test_an_oversized_quarantine_reason_is_not_read_whole(tmp_path):
    sources = _quarantined(tmp_path, json.dumps({"file": "part-0.parquet", "reason": "bad"}))
    reason = tmp_path / "_seedance" / "quarantine" / "run-1" / "part-0.parquet.reason.json"
    with reason.open("a") as handle:
        handle.truncate(2 * 1024**2)  # sparse: 2 MiB of NULs after the JSON
    page = pages.safety_page(sources, [], None, ui.safety_statuses(sources))
    assert "unreadable reason file: " in page and "is larger than 1 MiB" in page


def _finding(**fields) -> dict:
    return {"id": "idle:i-1", "signal": "idle", "key": "i-1", "severity": "warning", "summary": "idle", "evidence": {},
            "at_stake": "3.00", "currency": "USD", "first_seen": "2024-09-01", "last_seen": "2024-09-02",
            "change": "new", **fields}


@pytest.mark.parametrize("bad", [{"fix": "seedance_compaction"}, {"fix": ["x"]}, {"fix": {"dag_id": 7}},
                                 {"fix": {"dag_id": "x", "conf": "<script>"}}, {"currency": 7},
                                 {"at_stake": "1e30"}],
                         ids=["fix as text", "fix as a list", "a dag id that is no text", "conf that is no object",
                              "a currency that is no code", "an amount too large"])
def test_a_malformed_finding_is_left_out_and_the_others_still_show(tmp_path, bad):
    night = tmp_path / "nights" / "2024-09-02"
    night.mkdir(parents=True)
    findings = [_finding(), _finding(id="idle:i-2", key="i-2", **bad)]
    (night / "findings.json").write_text(json.dumps({"date": "2024-09-02",
                                                     "signals": [{"id": "idle", "findings": findings}]}))
    sources = Sources((Root("signals", FINDINGS, str(tmp_path), "test"),))
    page = pages.findings_page(sources, ui.findings_sections(sources))
    assert "1 open finding(s)" in page and "data-finding='idle:i-1'>3.00 USD</span>" in page
    assert "idle:i-2" not in page


SPOOF = "\u202egnp.exe"  # shows as "exe.png" where the override is obeyed


def test_bidi_controls_in_names_are_shown_not_obeyed(tmp_path):
    """An owner (or any name from data) with a bidi override reads as it is, in the pages, the charts,
    the month's report and the signals night report."""
    from seedance_tasks.cost.report import render_report
    from seedance_tasks.signals.audit import render_html

    (tmp_path / "month=2024-08").mkdir()
    spoofed = {**GOOD, "currencies": {"USD": {"by_owner": {SPOOF: "12.34"}, "total": "12.34", "unallocated": "0"}}}
    (tmp_path / "month=2024-08" / "summary.json").write_text(json.dumps(spoofed))
    sources = Sources((Root("cost", "chargeback output", str(tmp_path), "test"),))
    page = pages.cost_page(sources, ui.cost_sections(sources)[0])
    report = render_report({**spoofed, "basis": "EffectiveCost", "tag_conflicts": {"count": 0},
                            "currencies": {"USD": {**spoofed["currencies"]["USD"], "invoice_total": "12.34"}}}, [])
    night = render_html({"date": "2024-09-02", "signals": [{"id": "idle", "fired": True, "findings": [_finding(summary=SPOOF)]}],
                         "warnings": [SPOOF]})
    for html in (page, report, night):
        assert "\u202e" not in html and "&lt;U+202E&gt;gnp.exe" in html
    assert "<text" in page and "<text" in report  # in the charts too


@pytest.mark.skipif(chromium() is None, reason="no chromium: apt-get install -y chromium (make test does)")
def test_a_very_long_name_wraps_instead_of_widening_the_page(tmp_path):
    folder = tmp_path / ("lake-" + "y" * 200)
    sources = _quarantined(folder, json.dumps({"file": "part-0.parquet", "reason": "z" * 300, "run_id": "run-1"}))
    (tmp_path / "safety.html").write_text(pages.safety_page(sources, [], None, ui.safety_statuses(sources)))
    browser = Browser()
    try:
        page = browser.open((tmp_path / "safety.html").as_uri())
    finally:
        browser.close()
    assert "y" * 50 in page.facts["text"] and not page.facts["wider"]


def test_a_folder_named_like_no_real_month_does_not_move_the_window(tmp_path):
    """month=2024-13 (or -00) is no month: it is not read, so it neither shifts the 12 months shown
    past the latest real one nor pushes the oldest real months out of the window."""
    for month in ("2023-09", "2024-08", "2024-13", "2024-00"):
        (tmp_path / f"month={month}").mkdir()
        (tmp_path / f"month={month}" / "summary.json").write_text(json.dumps({**GOOD, "month": month}))
    sources = Sources((Root("cost", "chargeback output", str(tmp_path), "test"),))
    page = pages.cost_page(sources, ui.cost_sections(sources)[0])
    assert "Months: 2023-09 – 2024-08" in page and "2024-13" not in page and "2025-01" not in page
