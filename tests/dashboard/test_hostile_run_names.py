"""Run names from telemetry are untrusted: HTML and script, bidi controls, a name of thousands of
characters with no place to break. The training page, rendered and opened in headless Chromium,
shows each as text: nothing runs, nothing reorders, the layout keeps to the window and a long name
is cut (whole in its tooltip), not a page of its own."""

from __future__ import annotations

import pytest

from seedance_tasks.dashboard import pages
from seedance_tasks.dashboard.sources import RUN_LOGS, Root, Sources
from seedance_tasks.telemetry.samples import write_samples
from tests.browser_support import Browser, chromium

pytestmark = pytest.mark.skipif(chromium() is None, reason="no chromium: apt-get install -y chromium (make test does)")

NAMES = {
    "script": "<script>document.title='ran'</script>",
    "handler": "\"'><img src=x onerror=\"document.title='ran'\"><svg onload=\"document.title='ran'\">",
    "bidi": "invoice\u202egnp.exe\u2066x\u2069",
    "long": "L" * 5000,
}


def test_hostile_run_names_are_text_on_the_training_page_in_a_real_browser(tmp_path):
    from seedance_tasks import ui

    for folder, name in NAMES.items():
        labels = {"run": name, "rank": "0", "attempt": "0", "step": "3"}
        write_samples(tmp_path / "logs" / folder / "telemetry", "samples-r0000-a000-00001.parquet",
                      ([1.7e9, 1.7e9], ["seedance_cost_usd_total", "seedance_step"], [labels, labels], [0.5, 3]))
    sources = Sources((Root("training", RUN_LOGS, str(tmp_path / "logs"), "test"),))
    page_file = tmp_path / "training.html"
    page_file.write_text(pages.training_page(sources, ui.training_roots(sources)))
    browser = Browser()
    try:
        page = browser.open(page_file.as_uri())
    finally:
        browser.close()
    page.save("training-hostile-run-names")
    facts = page.facts
    assert facts["scripts"] == 0 and facts["images"] == 0 and facts["handlers"] == 0
    assert facts["title"] != "ran" and not facts["wider"]  # nothing ran; the long name wraps
    text = facts["text"]
    assert NAMES["script"] in text and "onerror=" in text
    assert "invoice<U+202E>gnp.exe<U+2066>x<U+2069>" in text and "\u202e" not in text
    shown = text.replace("\n", "")
    assert "L" * 120 + "…" in shown and "L" * 121 not in shown  # cut, not filling the page
    assert 'title="' + "L" * 5000 + '"' in page.html  # the whole name in the tooltip
