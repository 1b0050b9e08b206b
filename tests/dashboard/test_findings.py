"""The open-findings view reads the nights the real audit wrote: id, key, severity, money at stake to
the cent, first/last seen across nights, the fix DAG; hostile keys escaped; bad files say so."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from html import escape
from pathlib import Path

from seedance_tasks import ui
from seedance_tasks.dashboard import pages, svg
from seedance_tasks.dashboard.signals import at_stake_by_currency, open_findings
from seedance_tasks.dashboard.sources import FINDINGS, Root, Sources
from tests.dashboard.conftest import HOSTILE, NIGHTS, Cells

SURGE_ID = f"cost-surge:owner={HOSTILE[0]}"


def _latest(findings_root) -> list[dict]:
    document = json.loads((Path(findings_root["root"]) / "nights" / NIGHTS[-1] / "findings.json").read_text())
    return [f for signal in document["signals"] for f in signal["findings"]]


def test_the_latest_nights_open_findings_with_first_and_last_seen(findings_root):
    found = open_findings(findings_root["root"])
    written = {f["id"]: f for f in _latest(findings_root)}
    assert {f.id for f in found} == set(written) and SURGE_ID in written
    assert [f.at_stake for f in found] == sorted((f.at_stake for f in found), reverse=True)
    surge = next(f for f in found if f.id == SURGE_ID)
    assert (surge.first_seen, surge.last_seen, surge.change) == (NIGHTS[0], NIGHTS[1], "persisting")
    assert surge.key == f"owner={HOSTILE[0]}" and surge.severity == "critical"
    unallocated = next(f for f in found if f.signal == "unallocated-share")
    assert unallocated.fix["dag_id"] == "seedance_cost_recovery"
    assert at_stake_by_currency(found) == {"USD": sum((Decimal(f["at_stake"]) for f in written.values()), Decimal(0))}


def test_the_page_prints_each_amount_to_the_cent_the_fix_dag_and_escapes_keys(findings_root):
    root = Root("signals", FINDINGS, findings_root["root"], "config: signals.root")
    found = open_findings(root.uri)
    html = pages.findings_page(Sources((root,)), [pages.findings_section(root, found)])
    cells = Cells(html)
    written = _latest(findings_root)
    for f in written:
        assert cells.get(finding=f["id"]) == svg.money(Decimal(f["at_stake"]), f["currency"])
    total = sum((Decimal(f["at_stake"]) for f in written), Decimal(0))
    assert cells.get(finding="(total USD)") == svg.money(total, "USD")
    assert "href='../dags/seedance_cost_recovery'" in html and escape('{"month": "2024-10"}') in html
    assert HOSTILE[0] not in html and escape(SURGE_ID) in html and "<script" not in html
    assert NIGHTS[0] in html and NIGHTS[1] in html


def test_no_root_no_night_and_a_malformed_night_each_say_what_to_do(tmp_path, findings_root):
    assert "signals.root" in pages.findings_page(Sources(()), [])
    empty = Root("signals", FINDINGS, str(tmp_path / "none"), "demo workspace")
    assert open_findings(empty.uri) == []
    assert "No open finding" in pages.findings_section(empty, [])
    broken = tmp_path / "broken"
    shutil.copytree(findings_root["root"], broken)
    latest = broken / "nights" / NIGHTS[-1] / "findings.json"
    latest.write_text('{"signals": [{"findings": [{"id": 1}]}]}')
    warnings: list[str] = []
    assert open_findings(str(broken), warnings) == []  # the malformed finding is left out, and said so
    assert len(warnings) == 1 and warnings[0].startswith(f"error: {latest}: 1 malformed finding(s) left out")
    assert f"hint: re-run that night's audit (`seedance signals run --date {NIGHTS[-1]}`)" in warnings[0]
    latest.write_text("{")  # a damaged latest night: the night before it is shown, and said so
    root = Root("signals", FINDINGS, str(broken), "test")
    page = pages.findings_page(Sources((root,)), ui.findings_sections(Sources((root,))))
    assert f"<p class='err'>error: {latest}: unreadable night document" in page and "passed over" in page
    assert escape(SURGE_ID) in page  # the findings of the night before
