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


# ----------------------------------------------------------------------------- training telemetry

RUN_NAMES = (HOSTILE[0], "resnet-rapl")  # run labels: one hostile, one measured by RAPL
HOSTILE_FOLDER = HOSTILE[1]  # a run folder named like HTML (no "/" in it, so a legal folder name)


def _telemetry_settings(powercap: Path):
    from seedance_tasks.telemetry.settings import TelemetrySettings

    return TelemetrySettings.model_validate({
        "port": None, "flush_every": 2,  # no exporter; a Parquet file every 2 steps
        "pricing": {"basis": "instance_hours", "instance_type": "test.big",
                    "instance_hour_prices": {"test.big": "36000.00"}},  # 10 USD a second: cents that show
        "energy": {"source": "auto", "powercap_root": str(powercap), "cpu_watts_per_core": 50000},
    })


def _zone(root: Path, joules: int) -> None:
    zone = root / "intel-rapl:0"
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "energy_uj").write_text(f"{joules * 1_000_000}\n")
    (zone / "max_energy_range_uj").write_text(f"{2**40}\n")


def _record(settings, folder: Path, run: str, ranks: int, attempt: int, steps: range, rapl: Path | None = None):
    """The ranks of one attempt through real StepRecorders, step by step in lockstep as torchrun runs
    them; returns the exact cost as the samples hold it (each rank's float total, summed)."""
    import time
    from decimal import Decimal

    from seedance_tasks.telemetry.recorder import StepRecorder

    recorders = [StepRecorder(settings, folder=folder / "telemetry", rank=rank, world=ranks, run=run, attempt=attempt)
                 for rank in range(ranks)]
    for step in steps:
        for recorder in recorders:
            with recorder.step(step):
                with recorder.phase("data"):
                    time.sleep(0.002)
                with recorder.phase("compute"):
                    sum(range(30_000))
        if rapl is not None:
            _zone(rapl, 1000 * step)  # the package counter moves 1 kJ a step
    exact = sum((Decimal(repr(float(recorder.totals["cost_usd"]))) for recorder in recorders), Decimal(0))
    for recorder in recorders:
        recorder.close()
    return exact


def build_training(folder: Path) -> dict:
    """A training log root as `seedance_training` lays it out (`<log_dir>/<run>/telemetry/`), written by
    real recorder sessions: a hostile run (2 ranks, attempt 0 to step 5, attempt 1 resumed at step 4 to 8,
    energy estimated) and a run whose energy comes from (fake sysfs) RAPL counters."""
    from decimal import Decimal

    logs = folder / "training-logs"
    hostile, measured = logs / HOSTILE_FOLDER, logs / "resnet-rapl"
    no_rapl, rapl = folder / "no-rapl", folder / "powercap"
    _zone(rapl, 0)
    expected = {RUN_NAMES[0]: Decimal(0), RUN_NAMES[1]: Decimal(0)}
    estimated = _telemetry_settings(no_rapl)
    for attempt, steps in ((0, range(1, 6)), (1, range(4, 9))):
        expected[RUN_NAMES[0]] += _record(estimated, hostile, RUN_NAMES[0], 2, attempt, steps)
    expected[RUN_NAMES[1]] += _record(_telemetry_settings(rapl), measured, RUN_NAMES[1], 1, 0, range(1, 5),
                                      rapl=rapl)
    return {"root": str(logs), "folders": {RUN_NAMES[0]: hostile, RUN_NAMES[1]: measured}, "cost": expected,
            "steps": {RUN_NAMES[0]: 8, RUN_NAMES[1]: 4}}


@pytest.fixture(scope="session")
def training_logs(tmp_path_factory) -> dict:
    return build_training(tmp_path_factory.mktemp("dashboard-training"))


# ----------------------------------------------------------------------------- signals findings

NIGHTS = ("2024-10-29", "2024-10-30")
SURGE = "150.25"  # the hostile owner's spend on both nights, against a median of 100.00


def build_findings(folder: Path) -> dict:
    """Two nights of the real audit (`signals.audit.run_audit`) over FOCUS lines of the sample: a
    hostile owner's compute surges on both nights (cost-surge, first seen the first night) and an
    untagged share of the month (unallocated-share, with its fix DAG). Returns the root and nights."""
    import json
    from datetime import date, timedelta

    from seedance_tasks.config import load_settings
    from seedance_tasks.signals.audit import run_audit
    from seedance_tasks.signals.sample import focus_file, template
    from seedance_tasks.signals.sources import Inputs

    compute = {**template("Instance Hour"), "Tags": json.dumps({"owner": HOSTILE[0]})}
    untagged = {**template("Instance Hour"), "Tags": "NULL", "ResourceId": "i-0untagged"}
    first, last = (date.fromisoformat(night) for night in NIGHTS)
    lines = []
    for back in range(30, -1, -1):
        day = last - timedelta(days=back)
        lines.append((compute, day, SURGE if day >= first else ("98" if back % 2 else "102"), 24))
        lines.append((untagged, day, "40", 24))
    billing = focus_file(folder / "billing" / "focus.csv", lines)
    out = str(folder / "signals")
    nights = {}
    for night in (first, last):
        nights[night.isoformat()] = run_audit(night, Inputs(load_settings().signals, billing_uri=billing), out=out)
    return {"root": out, "nights": nights}


@pytest.fixture(scope="session")
def findings_root(tmp_path_factory) -> dict:
    return build_findings(tmp_path_factory.mktemp("dashboard-signals"))
