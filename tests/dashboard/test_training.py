"""The training view reads what real recorder sessions wrote: cost so far over every rank and attempt,
$ per 1,000 steps, energy with its source (an estimate labelled), utilisation; bad folders say so."""

from __future__ import annotations

from decimal import Decimal
from html import escape

import pytest

from seedance_tasks.dashboard import pages, svg
from seedance_tasks.dashboard.sources import RUN_LOGS, Root, Sources
from seedance_tasks.dashboard.training import run_folders, training_runs
from seedance_tasks.errors import InputError
from seedance_tasks.telemetry.pricing import cents
from tests.dashboard.conftest import HOSTILE, HOSTILE_FOLDER, RUN_NAMES, Cells


@pytest.fixture(scope="module")
def runs(training_logs):
    found, errors = training_runs(training_logs["root"])
    assert errors == []
    return {run.name: run for run in found}


def test_every_run_folder_is_found_and_its_cost_is_the_recorders_own_sum(runs, training_logs):
    assert set(runs) == set(RUN_NAMES)
    hostile, measured = runs[RUN_NAMES[0]], runs[RUN_NAMES[1]]
    for name, run in runs.items():
        assert run.cost == training_logs["cost"][name] and run.cost > Decimal("0.01")  # exact, all attempts
        assert run.steps == training_logs["steps"][name] and run.currency == "USD"
        assert run.per_1000_steps == cents(run.cost * 1000 / run.steps)
    assert (hostile.ranks, hostile.attempts) == (2, 2) and (measured.ranks, measured.attempts) == (1, 1)
    assert hostile.folder.endswith(HOSTILE_FOLDER)


def test_energy_keeps_its_source_and_an_estimate_is_labelled(runs):
    hostile, measured = runs[RUN_NAMES[0]], runs[RUN_NAMES[1]]
    assert hostile.energy_sources == ["estimated"] and hostile.estimated
    assert measured.energy_sources == ["rapl"] and not measured.estimated
    # the fake package counter moved 1 kJ per step and the meter read it after steps 1..4: 3 kJ
    assert measured.energy_kwh == Decimal(str(round(3000 / 3.6e6, 6)))
    for run in runs.values():
        assert run.devices == ["CPU"] and 0 <= run.utilisation <= 1


def test_cost_over_steps_rises_to_the_cost_so_far_through_the_resumed_attempt(runs):
    points = runs[RUN_NAMES[0]].cost_by_step
    steps = [step for step, _ in points]
    assert steps == sorted(steps) and steps[0] == 1 and steps[-1] == 8
    costs = [cost for _, cost in points]
    assert costs == sorted(costs) and costs[-1] == runs[RUN_NAMES[0]].cost


def test_the_page_prints_each_figure_to_the_cent_and_escapes_the_run(runs, training_logs):
    root = Root("training", RUN_LOGS, training_logs["root"], "config: training.log_dir")
    html = pages.training_page(Sources((root,)), [(root, list(runs.values()), [])])
    cells = Cells(html)
    for name, run in runs.items():
        assert cells.get(run=name, figure="cost") == svg.money(training_logs["cost"][name], "USD")
        assert cells.get(run=name, figure="per-1000-steps") == svg.money(run.per_1000_steps, "USD")
        assert cells.get(run=name, figure="energy") == pages.kwh(run.energy_kwh)
        assert cells.get(run=name, figure="utilisation") == f"{run.utilisation * 100:.1f}% CPU"
    assert "not measured" in cells.get(run=RUN_NAMES[0], figure="energy-source")
    assert cells.get(run=RUN_NAMES[1], figure="energy-source") == "rapl (measured)"
    for hostile in HOSTILE:
        assert hostile not in html and escape(hostile) in html
    assert html.count("<polyline") == 2 and "<script" not in html


def test_no_root_a_missing_root_and_a_corrupt_sample_file_each_say_what_to_do(tmp_path, training_logs):
    assert "training.log_dir" in pages.training_page(Sources(()), [])
    with pytest.raises(InputError, match="does not exist") as missing:
        run_folders(str(tmp_path / "absent"))
    assert "training.log_dir" in missing.value.hint
    with pytest.raises(InputError, match="not on local disk"):
        run_folders("s3://bucket/logs")
    import shutil

    logs = tmp_path / "logs"
    shutil.copytree(training_logs["folders"][RUN_NAMES[1]], logs / "good")
    shutil.copytree(training_logs["folders"][RUN_NAMES[1]], logs / "bad")
    bad = logs / "bad" / "telemetry" / "samples-r0000-a000-00099.parquet"
    bad.write_bytes(b"not parquet")
    found, errors = training_runs(str(logs))
    assert [run.folder for run in found] == [str(logs / "good")]  # the other run is still shown
    assert len(errors) == 1 and errors[0].startswith("error: ") and str(logs / "bad" / "telemetry") in errors[0]
    assert "hint: move the bad samples" in errors[0]
    assert bad.read_bytes() == b"not parquet"  # read-only: the bad file is left for a person
    assert run_folders(str(logs / "good")) == [logs / "good"]  # a log folder that is itself one run


def _samples(folder, rows) -> None:
    """A run folder whose telemetry holds one good sample file of the recorder's own layout."""
    from seedance_tasks.telemetry.samples import write_samples

    stamps, names, labels, values = zip(*rows, strict=True)
    write_samples(folder / "telemetry", "samples-r0000-a000-00000.parquet", (stamps, names, labels, values))


def _foreign_column_type(telemetry) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"timestamp": pa.array([1], pa.int64()), "name": ["seedance_step"],
                             "labels": [[("rank", "1")]], "value": ["abc"]}), telemetry / "samples-r0001-a000-00000.parquet")


def _far_timestamp(telemetry) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({
        "timestamp": pa.array([2**62], pa.int64()).cast(pa.timestamp("us", tz="UTC")), "name": ["seedance_step"],
        "labels": pa.array([[("rank", "1"), ("attempt", "0")]], pa.map_(pa.string(), pa.string())),
        "value": [7.0]}), telemetry / "samples-r0001-a000-00000.parquet")


def _step_label(telemetry) -> None:
    from seedance_tasks.telemetry.samples import write_samples

    write_samples(telemetry, "samples-r0001-a000-00000.parquet",
                  ([1.7e9], ["seedance_cost_usd_total"], [{"rank": "1", "attempt": "0", "step": "abc"}], [2.0]))


def _linked(telemetry) -> None:
    (telemetry / "samples-r0001-a000-00000.parquet").symlink_to(telemetry / "samples-r0000-a000-00000.parquet")


DAMAGE = {"a column of another type": _foreign_column_type, "a timestamp past year 9999": _far_timestamp,
          "a step label that is no number": _step_label, "a symlinked sample file": _linked}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_run_with_damaged_samples_is_its_own_error_and_the_other_runs_still_show(tmp_path, damage):
    from seedance_tasks import ui

    good = [(1.7e9, "seedance_cost_usd_total", {"run": "good", "rank": "0", "attempt": "0", "step": "5"}, 1.25),
            (1.7e9, "seedance_step", {"run": "good", "rank": "0", "attempt": "0", "step": "5"}, 5.0)]
    for name in ("good", "bad"):
        _samples(tmp_path / name, [(stamp, metric, {**labels, "run": name}, value)
                                   for stamp, metric, labels, value in good])
    damage(tmp_path / "bad" / "telemetry")
    found, errors = training_runs(str(tmp_path))
    assert [run.name for run in found] == ["good"] and found[0].cost == Decimal("1.25")
    assert len(errors) == 1 and str(tmp_path / "bad" / "telemetry") in errors[0] and "hint: move the bad" in errors[0]
    sources = Sources((Root("training", RUN_LOGS, str(tmp_path), "test"),))
    html = pages.training_page(sources, ui.training_roots(sources))  # the page is served, not a 500
    assert "telemetry samples unreadable" in html and "data-run='good' data-figure='cost'" in html


@pytest.mark.parametrize("linked", ["run", "telemetry"])
def test_a_symlinked_run_folder_is_named_not_followed(tmp_path, linked):
    elsewhere = tmp_path / "elsewhere"
    good = [(1.7e9, "seedance_cost_usd_total", {"run": "r", "rank": "0", "attempt": "0", "step": "5"}, 0.5)]
    for name in ("good", "outside"):
        _samples(elsewhere / name if name == "outside" else tmp_path / "logs" / name,
                 [(stamp, metric, {**labels, "run": name}, value) for stamp, metric, labels, value in good])
    if linked == "run":
        (tmp_path / "logs" / "planted").symlink_to(elsewhere / "outside")
    else:
        (tmp_path / "logs" / "planted").mkdir()
        (tmp_path / "logs" / "planted" / "telemetry").symlink_to(elsewhere / "outside" / "telemetry")
    found, errors = training_runs(str(tmp_path / "logs"))
    assert [run.name for run in found] == ["good"]
    assert len(errors) == 1 and str(tmp_path / "logs" / "planted") in errors[0] and "not followed" in errors[0]
