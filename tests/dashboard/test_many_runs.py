"""The training page with years of runs: it reads the newest runs only (saying how many older ones it
leaves out), reads each run's sample files once per change, not on every page view."""

from __future__ import annotations

import os
from decimal import Decimal

from seedance_tasks.dashboard import pages, training
from seedance_tasks.dashboard.sources import RUN_LOGS, Root, Sources
from seedance_tasks.telemetry.samples import write_samples


def _run(root, name: str, cost: float, changed: int, file: int = 1, step: int = 5) -> None:
    labels = {"run": name, "rank": "0", "attempt": "0", "step": str(step)}
    telemetry = root / name / "telemetry"
    write_samples(telemetry, f"samples-r0000-a000-{file:05d}.parquet",
                  ([1.7e9, 1.7e9], ["seedance_cost_usd_total", "seedance_step"], [labels, labels], [cost, step]))
    os.utime(telemetry, ns=(changed, changed))


def test_only_the_newest_runs_are_read_and_the_page_says_how_many_are_left_out(tmp_path, monkeypatch):
    from seedance_tasks import ui

    for index in range(7):
        _run(tmp_path, f"run-{index}", 0.25, changed=10**18 + index * 10**9)
    read = []
    real = training.read_run
    monkeypatch.setattr(training, "read_run", lambda folder: read.append(folder.name) or real(folder))
    monkeypatch.setattr(training, "MAX_RUNS", 3)
    found, lines = training.training_runs(str(tmp_path))
    assert sorted(read) == ["run-4", "run-5", "run-6"] and len(found) == 3  # the newest three, nothing else read
    assert lines == ["note: the 3 runs whose telemetry changed last are shown; 4 older runs are left out"]
    monkeypatch.setenv("SEEDANCE__TRAINING__LOG_DIR", str(tmp_path))
    sources = Sources((Root("training", RUN_LOGS, str(tmp_path), "test"),))
    html = pages.training_page(sources, ui.training_roots(sources))
    assert "<p class='muted'>the 3 runs whose telemetry changed last are shown; 4 older runs are left out</p>" in html
    assert "(USD, 3 newest runs)" in ui.overview()


def test_a_runs_samples_are_read_again_only_when_they_change(tmp_path, monkeypatch):
    _run(tmp_path, "long", 1.25, changed=10**18)
    _run(tmp_path, "done", 0.5, changed=10**18)
    import pyarrow.parquet as pq

    reads = []  # the sample files pyarrow opens

    opened = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda path, **kw: reads.append(os.path.basename(path)) or opened(path, **kw))
    first, _ = training.training_runs(str(tmp_path))
    assert sorted(reads) == ["samples-r0000-a000-00001.parquet"] * 2  # each file once (the summary shares the table)
    reads.clear()
    again, _ = training.training_runs(str(tmp_path))
    assert reads == [] and [run.cost for run in again] == [run.cost for run in first]  # nothing changed: not read
    _run(tmp_path, "long", 2.0, changed=10**18 + 1, file=2, step=9)  # the running job flushed a file
    latest, _ = training.training_runs(str(tmp_path))
    assert sorted(reads) == ["samples-r0000-a000-00001.parquet", "samples-r0000-a000-00002.parquet"]
    by_name = {run.name: run for run in latest}
    assert by_name["long"].steps == 9 and by_name["long"].cost == Decimal("2.0")
    assert by_name["done"].cost == Decimal("0.5")
