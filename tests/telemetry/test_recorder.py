"""The step recorder: prices, energy sources, the step-time split, the exporter and the Parquet samples."""

from __future__ import annotations

import json
import time
import urllib.request
from decimal import Decimal
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from seedance_tasks.config import load_settings
from seedance_tasks.errors import ConfigError
from seedance_tasks.telemetry import energy
from seedance_tasks.telemetry.pricing import cents, resolve_price
from seedance_tasks.telemetry.recorder import StepRecorder
from seedance_tasks.telemetry.samples import read_samples, summarise
from seedance_tasks.telemetry.settings import EnergySettings, PricingSettings


def _telemetry(**changes):
    settings = load_settings().telemetry
    for key, value in changes.items():
        setattr(settings, key, value)
    return settings


def test_device_hour_and_instance_hour_prices_are_exact():
    pricing = PricingSettings(pue="1.5", device_hour_prices={"default": "2.00", "H100": "3.00", "H100 80GB": "4.00",
                                                              "cpu": "0.04"})
    h100 = resolve_price(pricing, device_name="NVIDIA H100 80GB HBM3")
    assert h100.key == "H100 80GB"  # the longest key the NVML name contains
    assert h100.cost(3600) == Decimal("6.00")  # 1 GPU-hour x 4.00 x PUE 1.5
    other = resolve_price(pricing, device_name="NVIDIA L4")
    assert other.key == "default" and other.cost(1800) == Decimal("1.5")
    cpu = resolve_price(pricing, device_name="cpu", devices=2)
    assert cpu.key == "cpu" and cpu.cost(3600) == Decimal("0.12")  # 2 cores x 0.04 x 1.5
    instance = PricingSettings(basis="instance_hours", instance_type="p5.48xlarge",
                               instance_hour_prices={"p5.48xlarge": "55.04"})
    share = resolve_price(instance, device_name="NVIDIA H100", ranks_per_instance=8)
    assert share.cost(3600) == Decimal("6.88")  # one of 8 ranks, one hour, no PUE on an instance price
    assert cents(Decimal("0.125")) == Decimal("0.12") and cents(Decimal("0.135")) == Decimal("0.14")


def test_a_missing_price_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match="instance_type 'g5.xlarge'") as caught:
        resolve_price(PricingSettings(basis="instance_hours", instance_type="g5.xlarge"), device_name="cpu")
    assert "instance_hour_prices" in caught.value.hint
    with pytest.raises(ConfigError, match="no price for device 'NVIDIA A10G'"):
        resolve_price(PricingSettings(device_hour_prices={"H100": "3"}), device_name="NVIDIA A10G")
    with pytest.raises(Exception, match="negative"):
        PricingSettings(device_hour_prices={"cpu": "-1"})


def _zone(root: Path, name: str, value: int, top: int = 2**32 - 1) -> Path:
    zone = root / name
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "energy_uj").write_text(f"{value}\n")
    (zone / "max_energy_range_uj").write_text(f"{top}\n")
    return zone


def test_rapl_counters_are_read_with_wraparound_and_shared_over_ranks(tmp_path):
    _zone(tmp_path, "intel-rapl:0", 1_000_000)
    _zone(tmp_path, "intel-rapl:1", 2**32 - 1_000_000)  # about to wrap
    _zone(tmp_path, "intel-rapl:0:0", 5)  # a subzone (core): counted in its package already
    (tmp_path / "intel-rapl:2").mkdir()  # unreadable/incomplete zone: skipped
    meter = energy.open_meter(EnergySettings(powercap_root=str(tmp_path)), cuda_index=None, cores=1, ranks_on_machine=2)
    assert meter.source == "rapl" and [zone.name for zone in meter.zones] == ["intel-rapl:0", "intel-rapl:1"]
    _zone(tmp_path, "intel-rapl:0", 4_000_000)  # +3 J
    _zone(tmp_path, "intel-rapl:1", 1_000_000)  # wrapped: +1_000_000 + 1_000_000 µJ = +2 J
    joules, utilisation = meter.read()
    assert joules == pytest.approx((3.0 + 2.0) / 2)  # this rank's half of the machine's 5 J
    assert 0.0 <= utilisation <= 1.0


def test_without_a_counter_the_energy_is_an_estimate_and_says_so(tmp_path):
    meter = energy.open_meter(EnergySettings(powercap_root=str(tmp_path / "absent"), cpu_watts_per_core=10),
                              cuda_index=None, cores=2)
    assert meter.source == "estimated" and meter.describe()["watts"] == 20
    started = time.process_time()
    while time.process_time() - started < 0.05:  # burn some CPU: utilisation > 0, so energy > 0
        pass
    joules, utilisation = meter.read()
    assert utilisation > 0 and joules > 0


def _scrape(port: int) -> dict[tuple, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, *sorted(sample.labels.items()))] = sample.value
    return found


def test_recorder_splits_steps_exports_them_and_writes_samples(tmp_path):
    settings = _telemetry(flush_every=2)
    settings.energy.powercap_root = str(tmp_path / "no-rapl")
    recorder = StepRecorder(settings, folder=tmp_path / "telemetry", rank=1, run="r1", attempt=2)
    port = recorder.start()
    targets = json.loads((tmp_path / "telemetry" / "targets-r0001.json").read_text())
    assert targets == [{"targets": [f"127.0.0.1:{port}"], "labels": {"seedance_run": "r1"}}]
    for step in (1, 2, 3):
        with recorder.step(step):
            with recorder.phase("data"):
                time.sleep(0.01)
            recorder.loader(samples=4, nbytes=4 * 33 * 8)
            with recorder.phase("compute"):
                sum(range(20_000))
            with recorder.phase("collective"):
                pass
            recorder.loss_scale(2.0 ** (16 - step), skipped=step != 2)
    snap = recorder.snapshot()
    totals = snap["totals"]
    assert totals["steps"] == 3 and totals["step"] == 3
    assert sum(totals["phase_seconds"].values()) == pytest.approx(totals["step_seconds"], rel=1e-9)
    assert totals["phase_seconds"]["data"] >= 0.03  # slept 10 ms in each data phase
    assert totals["loader_samples"] == 12 and totals["loader_bytes"] == 12 * 33 * 8
    assert totals["skipped_steps"] == 2 and snap["last"]["loss_scale"] == 2.0 ** 13
    assert totals["cost_usd"] > 0 and snap["price"]["key"] == "cpu" and snap["energy"]["source"] == "estimated"

    scraped = _scrape(port)  # the exporter serves exactly the recorder's sums
    labels = (("rank", "1"), ("run", "r1"))
    assert scraped[("seedance_steps_total", *labels)] == 3
    assert scraped[("seedance_cost_usd_total", *labels)] == totals["cost_usd"]
    assert scraped[("seedance_step_seconds_total", *labels)] == totals["step_seconds"]
    assert scraped[("seedance_energy_joules_total", *labels, ("source", "estimated"))] == totals["energy_joules"]
    assert scraped[("seedance_loader_bytes_total", *labels)] == totals["loader_bytes"]
    assert scraped[("seedance_skipped_steps_total", *labels)] == 2
    assert scraped[("seedance_loss_scale", *labels)] == 2.0 ** 13
    for phase, seconds in totals["phase_seconds"].items():
        assert scraped[("seedance_phase_seconds_total", ("phase", phase), *labels)] == seconds

    final = recorder.close()
    assert not (tmp_path / "telemetry" / "targets-r0001.json").exists()  # nothing left to scrape
    saved = json.loads((tmp_path / "telemetry" / "totals-r0001-a002.json").read_text())
    assert saved["totals"]["cost_usd"] == final["totals"]["cost_usd"] == totals["cost_usd"]
    files = sorted(path.name for path in (tmp_path / "telemetry").glob("*.parquet"))
    assert files == ["samples-r0001-a002-00001.parquet", "samples-r0001-a002-00002.parquet"]  # flush_every=2, close
    table = read_samples(tmp_path / "telemetry")
    assert table.column_names == ["timestamp", "name", "labels", "value"]
    rows = table.to_pylist()
    cost = [row for row in rows if row["name"] == "seedance_cost_usd_total"]
    assert [dict(row["labels"])["step"] for row in cost] == ["1", "2", "3"]
    assert cost[-1]["value"] == totals["cost_usd"]
    assert dict(cost[-1]["labels"]) == {"run": "r1", "rank": "1", "attempt": "2", "step": "3"}
    energy_rows = [row for row in rows if row["name"] == "seedance_energy_joules_total"]
    assert {dict(row["labels"])["source"] for row in energy_rows} == {"estimated"}
    summary = summarise(tmp_path / "telemetry")
    assert summary["steps"] == 3 and summary["cost_usd"] == Decimal(repr(totals["cost_usd"]))
    assert summary["cost"].endswith(" USD") and summary["energy_sources"] == ["estimated"]
    assert 0 <= summary["utilisation"] <= 1


def test_summary_adds_up_every_rank_and_attempt(tmp_path):
    from seedance_tasks.telemetry.samples import write_samples

    def rows(rank, attempt, step, cost):
        labels = {"run": "r", "rank": str(rank), "attempt": str(attempt), "step": str(step)}
        return ([1.0, 1.0], ["seedance_cost_usd_total", "seedance_step"], [labels, labels], [cost, step])

    write_samples(tmp_path, "samples-r0000-a000-00001.parquet", rows(0, 0, 5, 1.25))
    write_samples(tmp_path, "samples-r0000-a001-00001.parquet", rows(0, 1, 10, 1.25))  # the retry, after step 5
    write_samples(tmp_path, "samples-r0001-a001-00001.parquet", rows(1, 1, 10, 2.5))
    (tmp_path / ".samples-r0002-a000-00001.parquet.tmp-1").write_bytes(b"half a file")  # never read
    summary = summarise(tmp_path)
    assert summary["cost_usd"] == Decimal("5.00") and summary["cost"] == "5.00 USD"
    assert summary["steps"] == 10 and summary["usd_per_1000_steps"] == Decimal("500.00")
    assert summarise(tmp_path / "none")["steps"] == 0


def test_bad_telemetry_settings_name_the_key(tmp_path):
    path = tmp_path / "seedance.yaml"
    path.write_text("telemetry:\n  pricing:\n    pue: 0.5\n    basis: hourly\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    assert "'telemetry.pricing.pue'" in caught.value.message and "'telemetry.pricing.basis'" in caught.value.message
    assert caught.value.hint


def test_launch_refuses_an_unknown_precision_or_interval_before_starting():
    from seedance_tasks.errors import UsageError
    from seedance_tasks.training.launch import launch

    with pytest.raises(UsageError, match="unknown precision 'fp8'"):
        launch(nproc_per_node=1, backend="gloo", steps=1, precision="fp8")
    with pytest.raises(UsageError, match="checkpoint_every must be"):
        launch(nproc_per_node=1, backend="gloo", steps=1, checkpoint_every="sometimes")


def test_a_damaged_sample_file_or_value_is_skipped_named_and_left_in_place(tmp_path):
    from seedance_tasks.telemetry.samples import read_sample_files, write_samples

    def rows(rank, cost):
        labels = {"run": "r", "rank": str(rank), "attempt": "0", "step": "5"}
        return ([1.0, 1.0], ["seedance_cost_usd_total", "seedance_step"], [labels, labels], [cost, 5])

    write_samples(tmp_path, "samples-r0000-a000-00001.parquet", rows(0, 1.25))
    write_samples(tmp_path, "samples-r0001-a000-00001.parquet", rows(1, float("nan")))
    write_samples(tmp_path, "samples-r0002-a000-00001.parquet", rows(2, -3.0))
    (tmp_path / "samples-r0003-a000-00001.parquet").write_bytes(b"")  # a crash left it empty
    (tmp_path / "samples-r0004-a000-00001.parquet").write_bytes(b"PAR1 cut sho")
    summary = summarise(tmp_path, skip_damaged=True)
    assert summary["cost"] == "1.25 USD" and summary["steps"] == 5
    assert summary["damaged_files"] == ["samples-r0003-a000-00001.parquet", "samples-r0004-a000-00001.parquet"]
    assert summary["rejected_values"] == 2
    assert (tmp_path / "samples-r0003-a000-00001.parquet").exists()  # never deleted
    assert read_sample_files(tmp_path)[0].num_rows == 6
    with pytest.raises(ValueError):  # a reader that reports damaged files itself (the dashboard) still sees them
        summarise(tmp_path)


def test_the_launch_summary_names_a_damaged_sample_file_instead_of_failing(tmp_path):
    from seedance_tasks.training.launch import _telemetry_summary

    (tmp_path / "samples-r0000-a000-00001.parquet").write_bytes(b"")
    summary = _telemetry_summary(str(tmp_path))
    assert summary["damaged_files"] == ["samples-r0000-a000-00001.parquet"] and summary["cost"] == "0.00 USD"


class _FlakyMeter(energy.Meter):
    """Readings in turn: 10 J, an unreadable counter, NaN, a reset counter (2 J), 15 J."""

    def __init__(self) -> None:
        super().__init__()
        self.readings = [(10.0, 0.5), OSError("energy_uj: permission denied"), (float("nan"), float("nan")),
                         (2.0, 7.0), (15.0, -1.0)]

    def read(self, busy=None):
        reading = self.readings.pop(0)
        if isinstance(reading, Exception):
            raise reading
        return reading


def test_a_failing_or_insane_energy_meter_never_stops_training_or_lowers_the_total(tmp_path, caplog):
    settings = _telemetry(flush_every=100)
    recorder = StepRecorder(settings, folder=tmp_path / "telemetry", meter=_FlakyMeter())
    seen = []
    for step in range(1, 6):
        with recorder.step(step):
            with recorder.phase("compute"):
                pass
        seen.append(recorder.snapshot()["totals"]["energy_joules"])
    assert seen == [10.0, 10.0, 10.0, 10.0, 15.0]
    totals = recorder.snapshot()["totals"]
    assert totals["steps"] == 5 and totals["meter_errors"] == 3
    assert 0.0 <= totals["busy_seconds"] <= totals["step_seconds"]  # utilisation kept within 0..1
    assert sum("energy meter failed" in record.getMessage() for record in caplog.records) == 1
    recorder.close()
    assert summarise(tmp_path / "telemetry")["energy_joules"] == 15.0


def _steps(recorder, steps):
    for step in steps:
        with recorder.step(step):
            with recorder.phase("compute"):
                pass


def test_the_periodic_flush_is_written_by_the_writer_thread_in_step_order(tmp_path, monkeypatch):
    from seedance_tasks.telemetry import samples

    writers, real = [], samples.write_samples

    def recording(folder, name, rows):
        writers.append((name, __import__("threading").current_thread().name))
        return real(folder, name, rows)

    monkeypatch.setattr(samples, "write_samples", recording)
    recorder = StepRecorder(_telemetry(flush_every=2), folder=tmp_path / "telemetry", run="r1")
    _steps(recorder, range(1, 8))  # 3 periodic flushes, step 7 left for close
    recorder.close()
    assert [name for name, _ in writers] == [f"samples-r0000-a000-{n:05d}.parquet" for n in (1, 2, 3, 4)]
    assert all(thread.startswith("seedance-telemetry") for _, thread in writers[:3])  # not the loop's thread
    rows = read_samples(tmp_path / "telemetry").to_pylist()
    steps = [int(dict(row["labels"])["step"]) for row in rows if row["name"] == "seedance_steps_total"]
    totals = [row["value"] for row in rows if row["name"] == "seedance_steps_total"]
    assert steps == list(range(1, 8)) and totals == [float(n) for n in range(1, 8)]
    phases = {dict(row["labels"])["phase"] for row in rows if row["name"] == "seedance_phase_seconds_total"}
    assert phases == {"data", "compute", "collective", "checkpoint", "other"}


def test_a_sample_file_that_cannot_be_written_never_stops_training(tmp_path, monkeypatch, caplog):
    from seedance_tasks.telemetry import samples

    real, calls = samples.write_samples, []

    def failing_first(folder, name, rows):
        calls.append(name)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(folder, name, rows)

    monkeypatch.setattr(samples, "write_samples", failing_first)
    recorder = StepRecorder(_telemetry(flush_every=2), folder=tmp_path / "telemetry")
    _steps(recorder, range(1, 6))  # the first file fails on the writer thread; the loop goes on
    recorder.close()
    assert recorder.write_errors == 1 and recorder.snapshot()["totals"]["steps"] == 5
    assert sum("not written" in record.getMessage() for record in caplog.records) == 1
    rows = read_samples(tmp_path / "telemetry").to_pylist()
    assert sorted({int(dict(row["labels"])["step"]) for row in rows}) == [3, 4, 5]  # steps 1-2 were in the lost file


@pytest.mark.parametrize("case", ["port taken", "port past 65535", "bind not this machine"])
def test_an_exporter_that_cannot_listen_where_configured_never_stops_training(tmp_path, caplog, case):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port, rank, bind = {"port taken": (taken.getsockname()[1], 0, "127.0.0.1"),
                        "port past 65535": (65535, 3, "127.0.0.1"),
                        "bind not this machine": (9400, 0, "203.0.113.7")}[case]  # TEST-NET-3: no host has it
    recorder = StepRecorder(_telemetry(port=port, bind=bind), folder=tmp_path / "telemetry", rank=rank, run="r1")
    try:
        started = recorder.start()  # was: OSError / OverflowError out of the trainer's start
        with recorder.step(1):
            pass
        if case == "bind not this machine":
            assert started is None and recorder.port is None
        else:
            assert started and started != port + rank
            target = json.loads((tmp_path / "telemetry" / f"targets-r{rank:04d}.json").read_text())
            assert target[0]["targets"] == [f"127.0.0.1:{started}"]
            with urllib.request.urlopen(f"http://127.0.0.1:{started}/metrics", timeout=10) as response:
                assert b"seedance_step" in response.read()
        assert "telemetry: the exporter cannot listen on" in caplog.text
    finally:
        recorder.close()
        taken.close()
    assert summarise(tmp_path / "telemetry")["steps"] == 1
