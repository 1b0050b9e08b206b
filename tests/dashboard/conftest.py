"""Dashboard test data: two closed cost months built by the cost pipeline itself, with hostile owners."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

HOSTILE = ("<script>alert(1)</script>", "\"><img src=x onerror=alert(2)>")
MONTHS = ("2024-08", "2024-09")


def build_chargeback(folder: Path) -> dict:
    """Charge back 2024-08 and 2024-09 (the cost demo's FOCUS sample inputs plus lines of two owners
    whose names are HTML, one of them with a credit) through `recover_month`; returns the inputs,
    `out` and the published summaries."""
    from seedance_tasks import storage
    from seedance_tasks.cost.demo import make_inputs
    from seedance_tasks.cost.recover import recover_month
    from tests.cost.helpers import line, write_focus

    inputs = make_inputs(folder)
    billing = Path(inputs["billing"]).parent
    write_focus(billing / "hostile.csv", [
        line("2024-08-05 00:00:00", "12.345", tags={"owner": HOSTILE[0]}),
        line("2024-08-06 00:00:00", "3.3333", tags={"owner": HOSTILE[1]}),
        line("2024-09-05 00:00:00", "20.004", tags={"owner": HOSTILE[0]}),
        line("2024-09-07 00:00:00", "-4.125", tags={"owner": HOSTILE[1]}),
    ])
    summaries = {}
    for month in MONTHS:
        summaries[month] = recover_month(month=month, billing=str(billing), owners=inputs["owners"],
                                         out=inputs["out"], utilization=inputs["utilization"])["summary"]
    root = storage.resolve(inputs["out"])
    assert storage.is_file(root.fs, root.join("month=2024-09", "report.html"))
    return {**inputs, "summaries": summaries}


@pytest.fixture(scope="session")
def chargeback(tmp_path_factory) -> dict:
    return build_chargeback(tmp_path_factory.mktemp("dashboard-cost"))


class Cells(HTMLParser):
    """Text of every element carrying data-* attributes, keyed by those attributes."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.found: dict[tuple, str] = {}
        self._open: list[tuple | None] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        data = tuple(sorted((k[5:], v) for k, v in attrs if k.startswith("data-")))
        self._open.append(data or None)
        if data:
            self.found[data] = ""

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, text):
        for data in self._open:
            if data:
                self.found[data] += text

    def get(self, **data: str) -> str | None:
        return self.found.get(tuple(sorted(data.items())))


def expected_cost_cells(summaries: dict) -> dict[tuple, str]:
    """What the cost page must print, to the cent, for every owner, unallocated and total of every month."""
    from decimal import Decimal

    from seedance_tasks.dashboard.svg import money

    owners = {owner for s in summaries.values() for owner, v in s["currencies"]["USD"]["by_owner"].items()
              if Decimal(v)}
    expected = {}
    for month, summary in summaries.items():
        usd = summary["currencies"]["USD"]
        for owner in owners:
            expected[(owner, month)] = money(Decimal(usd["by_owner"].get(owner, "0")), "USD")
        expected[("(unallocated)", month)] = money(Decimal(usd["unallocated"]), "USD")
        expected[("(total)", month)] = money(Decimal(usd["total"]), "USD")
    return expected
