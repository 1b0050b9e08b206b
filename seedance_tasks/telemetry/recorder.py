"""The step recorder: per-step and cumulative cost, energy, utilisation and the step-time split.

    recorder = StepRecorder(settings.telemetry, folder=run_dir / "telemetry", rank=0, run="r1")
    recorder.start()                      # the Prometheus exporter of this rank
    for step in ...:
        with recorder.step(step + 1):
            with recorder.phase("data"):
                batch = next(loader)
            recorder.loader(samples=len(batch), nbytes=batch.nbytes)
            with recorder.phase("compute"):
                ...
            with recorder.phase("collective"):
                dist.all_reduce(...)
    recorder.close()                      # last Parquet samples, final scrape, exporter down

Phases are `data` (waiting for the loader), `compute`, `collective` (waiting in collectives),
`checkpoint` (the training loop's stall for a save); step time outside them is `other`. Phases
are sequential, not nested. A step costs a few microseconds of Python (see bench/telemetry.py):
the exporter reads the recorder's totals when it is scraped, no metric object is touched per step,
and a step keeps one record; every `telemetry.flush_every` steps a writer thread turns the records
into sample rows and writes them as one Parquet file, so the loop never waits on the disk.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

PHASES = ("data", "compute", "collective", "checkpoint")
_PERF = time.perf_counter
log = logging.getLogger("seedance.telemetry")


def free_attempt(folder: str | Path, rank: int, attempt: int) -> int:
    """`attempt`, or one past the highest attempt of `rank` that already has sample or totals files
    in `folder` when `attempt` has some: a recorder never overwrites (nor merges into the series of)
    an earlier recorder's files. Read once, when a recorder is made."""
    pattern = re.compile(rf"^(?:samples|totals)-r{int(rank):04d}-a(\d+)[-.]")
    try:
        used = {int(match.group(1)) for entry in os.scandir(folder) if (match := pattern.match(entry.name))}
    except OSError:  # no folder yet: nothing to overwrite
        return attempt
    return attempt if attempt not in used else max(used) + 1


class _Phase:
    """A reusable timer of one phase (no allocation per use)."""

    __slots__ = ("_recorder", "_name", "_began", "_sync")

    def __init__(self, recorder: StepRecorder, name: str, sync) -> None:
        self._recorder, self._name, self._sync = recorder, name, sync

    def __enter__(self) -> _Phase:
        self._began = _PERF()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sync is not None:
            self._sync()  # a GPU's queued kernels belong to this phase, not the next
        self._recorder._phase_seconds[self._name] += _PERF() - self._began


class _Step:
    __slots__ = ("_recorder", "_began", "_step")

    def __init__(self, recorder: StepRecorder) -> None:
        self._recorder = recorder

    def __enter__(self) -> _Step:
        self._recorder._begin_step()
        self._began = _PERF()
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        if exc_type is None:
            self._recorder._end_step(self._step, _PERF() - self._began)


class StepRecorder:
    """Records one rank's steps (see the module doc). Thread-safe towards the exporter's scrapes."""

    def __init__(self, settings, *, folder: str | Path, rank: int = 0, world: int = 1, run: str = "run",
                 attempt: int = 0, device: Any = "cpu", local_world: int = 1, meter=None, price=None) -> None:
        import pyarrow.parquet  # noqa: F401 - loaded now, not by the first sample file (~0.1 s, in the loop)

        from seedance_tasks.telemetry import energy, pricing

        self.settings, self.folder = settings, Path(folder)
        self.rank, self.world, self.run = rank, world, run
        self.attempt = free_attempt(self.folder, rank, attempt)
        if self.attempt != attempt:
            log.warning("telemetry: rank %d attempt %d already has files in %s: recording as attempt %d "
                        "(an earlier launch's samples are kept and counted)", rank, attempt, self.folder, self.attempt)
        self.device = str(device)
        self._cuda_index = int(self.device.split(":")[1]) if self.device.startswith("cuda") else None
        if self._cuda_index is None and self.device.startswith("cuda"):
            self._cuda_index = 0
        cores = energy.cores_of_this_process()
        self.meter = meter or energy.open_meter(settings.energy, cuda_index=self._cuda_index, cores=cores,
                                                ranks_on_machine=local_world)
        device_name = getattr(self.meter, "name", None) or (self._cuda_name() if self._cuda_index is not None else "cpu")
        self.price = price or pricing.resolve_price(
            settings.pricing, device_name=device_name,
            devices=1 if self._cuda_index is not None else cores, ranks_per_instance=local_world)
        self.device_name = device_name
        self._sync = self._cuda_sync() if self._cuda_index is not None else None
        self._phases = {name: _Phase(self, name, self._sync if name == "compute" else None) for name in PHASES}
        self._phase_seconds = dict.fromkeys(PHASES, 0.0)
        self._step_ctx = _Step(self)
        self._lock = threading.Lock()
        self._labels = {"run": run, "rank": str(rank), "attempt": str(self.attempt)}
        self._records: list[tuple] = []  # one per step since the last flush; expanded into rows when written
        self._files = 0
        self._writer = None  # the thread that writes the files the step loop queues (started on first use)
        self.write_errors = 0  # sample files the writer thread could not write (logged once)
        self._pending_loader = [0, 0]
        self._pending_scale: list = [None, 0]
        self.totals: dict[str, Any] = {
            "steps": 0, "step": 0, "step_seconds": 0.0, "busy_seconds": 0.0, "cost_usd": Decimal(0),
            "energy_joules": 0.0, "phase_seconds": dict.fromkeys((*PHASES, "other"), 0.0),
            "loader_samples": 0, "loader_bytes": 0, "skipped_steps": 0, "alloc_retries": 0, "meter_errors": 0,
        }
        self.last: dict[str, Any] = {}  # the last step's per-step values (gauges)
        self.checkpoint_interval: dict[str, Any] | None = None
        self._version = 0  # bumped per step; the exporter notes which version a scrape saw
        self._scraped = threading.Condition(self._lock)
        self._scraped_version = -1
        self._server = None
        self.port: int | None = None

    # -- the loop's API ----------------------------------------------------------------------
    def step(self, step: int) -> _Step:
        """`with recorder.step(n):` times optimizer step `n` (the step number reached after it)."""
        self._step_ctx._step = step
        return self._step_ctx

    def phase(self, name: str) -> _Phase:
        """`with recorder.phase("data"|"compute"|"collective"|"checkpoint"):` inside a step."""
        return self._phases[name]

    def loader(self, samples: int, nbytes: int) -> None:
        """Count what the loader delivered in this step."""
        self._pending_loader[0] += samples
        self._pending_loader[1] += nbytes

    def loss_scale(self, scale: float, skipped: bool) -> None:
        """The GradScaler's scale after this step and whether the step was skipped (inf/NaN grads)."""
        self._pending_scale[0] = float(scale)
        self._pending_scale[1] += int(bool(skipped))

    def note_checkpoint_interval(self, info: dict[str, Any]) -> None:
        """The checkpoint interval in use and its inputs (Young-Daly or fixed), for the exporter."""
        with self._lock:
            self.checkpoint_interval = dict(info)

    # -- internals ---------------------------------------------------------------------------
    def _cuda_name(self) -> str:
        import torch

        return torch.cuda.get_device_name(self._cuda_index)

    def _cuda_sync(self):
        import torch

        index = self._cuda_index
        return lambda: torch.cuda.synchronize(index)

    def _begin_step(self) -> None:
        seconds = self._phase_seconds
        for name in PHASES:
            seconds[name] = 0.0

    def _memory(self) -> tuple[int, int, int] | None:
        if self._cuda_index is None:
            return None
        import torch

        stats = torch.cuda.memory_stats(self._cuda_index)
        return (stats.get("reserved_bytes.all.current", 0), stats.get("allocated_bytes.all.current", 0),
                stats.get("num_alloc_retries", 0))

    def _read_meter(self, busy_fraction: float) -> tuple[float, float]:
        """(cumulative joules, utilisation) from the meter. Telemetry never stops training: a read
        that fails (a counter file gone unreadable, an NVML error) or gives a total that is not a
        finite number at least the last one (a counter reset after a GPU reset) keeps the last
        total; a utilisation outside 0..1 is clamped, the step's compute fraction where it is not
        a number. Each such step is counted in `totals["meter_errors"]`, and logged once."""
        last = self.totals["energy_joules"]
        try:
            joules, utilisation = self.meter.read(busy_fraction)
            joules, utilisation = float(joules), float(utilisation)
        except Exception as error:  # noqa: BLE001 - any meter failure: keep the last reading
            joules, utilisation = math.nan, math.nan
            problem = f"{type(error).__name__}: {error}"
        else:
            problem = f"reading {joules!r} J after {last!r} J"
        if not math.isfinite(utilisation):
            utilisation = busy_fraction
        utilisation = min(1.0, max(0.0, utilisation))
        if math.isfinite(joules) and joules >= last:
            return joules, utilisation
        self.totals["meter_errors"] += 1
        if self.totals["meter_errors"] == 1:
            log.warning("rank %s: the %s energy meter failed (%s): energy kept at its last total", self.rank,
                        self.meter.source, str(problem)[:200])
        return last, utilisation

    def _end_step(self, step: int, wall: float) -> None:
        phases = dict(self._phase_seconds)
        phases["other"] = max(0.0, wall - sum(phases.values()))
        busy_fraction = phases["compute"] / wall if wall > 0 else 0.0
        joules, utilisation = self._read_meter(busy_fraction)
        cost = self.price.cost(wall)
        memory = self._memory()
        samples, nbytes = self._pending_loader
        self._pending_loader = [0, 0]
        scale, skipped = self._pending_scale
        self._pending_scale = [scale, 0]
        now = time.time()
        with self._lock:
            totals = self.totals
            energy_step = joules - totals["energy_joules"]
            totals["steps"] += 1
            totals["step"] = step
            totals["step_seconds"] += wall
            totals["busy_seconds"] += utilisation * wall
            totals["cost_usd"] += cost
            totals["energy_joules"] = joules
            for name, value in phases.items():
                totals["phase_seconds"][name] += value
            totals["loader_samples"] += samples
            totals["loader_bytes"] += nbytes
            totals["skipped_steps"] += skipped
            last = {"step_seconds": wall, "cost_usd": cost, "energy_joules": energy_step, "utilisation": utilisation,
                    "samples_per_second": samples / wall if wall > 0 else 0.0,
                    "bytes_per_second": nbytes / wall if wall > 0 else 0.0, "loss_scale": scale}
            if memory is not None:
                last["memory_reserved_bytes"], last["memory_allocated_bytes"] = memory[0], memory[1]
                totals["alloc_retries"] = memory[2]
            self.last = last
            self._version += 1
            self._records.append((now, step, phases, last, _totals_row(totals)))
        if totals["steps"] % self.settings.flush_every == 0:
            self._flush_in_background()

    def flush(self) -> Path | None:
        """Write the samples recorded since the last flush as one Parquet file, now (None if there
        are none); the files the step loop queued are written first, so files keep step order."""
        if self._writer is not None:
            self._writer.submit(lambda: None).result()  # the queue drained: earlier files are in place
        name, records = self._take_records()
        return None if name is None else self._write(name, records)

    def _take_records(self) -> tuple[str | None, list]:
        with self._lock:
            records, self._records = self._records, []
        if not records:
            return None, records
        self._files += 1
        return f"samples-r{self.rank:04d}-a{self.attempt:03d}-{self._files:05d}.parquet", records

    def _write(self, name: str, records: list) -> Path:
        from seedance_tasks.telemetry.samples import write_samples

        return write_samples(self.folder, name, _sample_rows(records, self._labels, self.meter))

    def _flush_in_background(self) -> None:
        """Queue the samples since the last flush for the writer thread: building and writing a
        file (milliseconds, more when the disk is slow) never stalls the training loop."""
        from concurrent.futures import ThreadPoolExecutor

        name, records = self._take_records()
        if name is None:
            return
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seedance-telemetry")
        self._writer.submit(self._write_logged, name, records)

    def _write_logged(self, name: str, records: list) -> None:
        try:
            self._write(name, records)
        except Exception as error:  # noqa: BLE001 - telemetry never stops training: the file is skipped
            self.write_errors += 1
            if self.write_errors == 1:
                log.warning("rank %s: telemetry samples %s not written (%s: %s); training goes on", self.rank,
                            name, type(error).__name__, str(error)[:200])

    def snapshot(self) -> dict[str, Any]:
        """The cumulative totals as plain numbers (cost as a float of the exact Decimal), the last
        step's values, the price and energy source: the recorder's own sums, for reports and tests."""
        with self._lock:
            totals = {**self.totals, "phase_seconds": dict(self.totals["phase_seconds"])}
            last = dict(self.last)
        totals["cost_usd"] = float(totals["cost_usd"])
        if "cost_usd" in last:
            last["cost_usd"] = float(last["cost_usd"])
        return {"totals": totals, "last": last, "price": self.price.describe(), "energy": self.meter.describe(),
                "checkpoint_interval": self.checkpoint_interval, "rank": self.rank, "attempt": self.attempt,
                "device": self.device, "device_name": self.device_name, "port": self.port}

    # -- exporter ----------------------------------------------------------------------------
    def collect(self):
        """prometheus_client collector protocol: the totals and last-step gauges, read at scrape time."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            totals, last, interval = self.totals, dict(self.last), self.checkpoint_interval
            keys = ["run", "rank"]
            values = [self.run, str(self.rank)]

            def counter(name: str, doc: str, value: float, extra: dict | None = None):
                family = CounterMetricFamily(name, doc, labels=keys + list(extra or {}))
                family.add_metric(values + list((extra or {}).values()), float(value))
                return family

            def gauge(name: str, doc: str, value: float, extra: dict | None = None):
                family = GaugeMetricFamily(name, doc, labels=keys + list(extra or {}))
                family.add_metric(values + list((extra or {}).values()), float(value))
                return family

            families = [
                counter("seedance_steps", "optimizer steps this process recorded", totals["steps"]),
                gauge("seedance_step", "the last optimizer step reached", totals["step"]),
                counter("seedance_step_seconds", "wall seconds of the recorded steps", totals["step_seconds"]),
                counter("seedance_busy_seconds", "step seconds x utilisation", totals["busy_seconds"]),
                counter("seedance_cost_usd", "cost of the recorded steps (USD)", totals["cost_usd"]),
                counter("seedance_energy_joules", "energy of this rank", totals["energy_joules"],
                        {"source": self.meter.source}),
                counter("seedance_loader_samples", "samples the loader delivered", totals["loader_samples"]),
                counter("seedance_loader_bytes", "bytes the loader delivered", totals["loader_bytes"]),
                counter("seedance_skipped_steps", "optimizer steps skipped on inf/NaN gradients (fp16)",
                        totals["skipped_steps"]),
            ]
            phase = CounterMetricFamily("seedance_phase_seconds", "step seconds by phase", labels=[*keys, "phase"])
            for name, value in totals["phase_seconds"].items():
                phase.add_metric([*values, name], value)
            families.append(phase)
            if last:
                families += [
                    gauge("seedance_step_duration_seconds", "the last step's wall seconds", last["step_seconds"]),
                    gauge("seedance_step_cost_usd", "the last step's cost (USD)", last["cost_usd"]),
                    gauge("seedance_step_energy_joules", "the last step's energy", last["energy_joules"],
                          {"source": self.meter.source}),
                    gauge("seedance_utilisation_ratio", "device utilisation in the last step", last["utilisation"],
                          {"source": self.meter.utilisation_source}),
                    gauge("seedance_loader_samples_per_second", "loader samples per step second",
                          last["samples_per_second"]),
                    gauge("seedance_loader_bytes_per_second", "loader bytes per step second", last["bytes_per_second"]),
                ]
                if last["loss_scale"] is not None:
                    families.append(gauge("seedance_loss_scale", "the GradScaler's loss scale", last["loss_scale"]))
                if "memory_reserved_bytes" in last:
                    families += [
                        gauge("seedance_memory_reserved_bytes", "CUDA caching allocator reserved bytes",
                              last["memory_reserved_bytes"]),
                        gauge("seedance_memory_allocated_bytes", "CUDA allocated bytes", last["memory_allocated_bytes"]),
                        counter("seedance_alloc_retries", "CUDA allocation retries (cudaMalloc failed, cache freed)",
                                totals["alloc_retries"]),
                    ]
            if interval:
                families.append(gauge("seedance_checkpoint_interval_steps", "checkpoint interval in use",
                                      interval.get("interval_steps") or 0, {"mode": str(interval.get("mode"))}))
            self._scraped_version = self._version
            self._scraped.notify_all()
        yield from families

    def start(self) -> int | None:
        """Start this rank's exporter (telemetry.port + rank, or an ephemeral port for 0) and write
        `targets-r<rank>.json` (Prometheus file_sd format) to the folder. Returns the port (None: off).

        The exporter never stops training: where that port is taken (another job on the node with
        the same telemetry.port) or past 65535, it listens on an ephemeral port, which the targets
        file names; where it cannot listen at all (telemetry.bind not an address of this machine),
        it stays off. Either is logged as a warning; the samples are written as ever."""
        from prometheus_client import CollectorRegistry, start_http_server

        port = self.settings.port
        if port is None:
            return None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        wanted = port + self.rank if port else 0
        server = None
        for candidate in dict.fromkeys((wanted, 0)):
            try:
                server, _thread = start_http_server(candidate, addr=self.settings.bind, registry=registry)
                break
            except (OSError, OverflowError) as exc:
                log.warning("telemetry: the exporter cannot listen on %s:%s (%s)%s", self.settings.bind, candidate,
                            exc, "; trying an ephemeral port" if candidate else "; it stays off, training goes on")
        if server is None:
            return None
        if server.server_port != wanted and wanted:
            log.warning("telemetry: rank %s's exporter listens on port %s, not %s (named in targets-r%04d.json)",
                        self.rank, server.server_port, wanted, self.rank)
        self._server, self.port = server, server.server_port
        host = self.settings.bind if self.settings.bind not in ("0.0.0.0", "::") else os.uname().nodename
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.folder / f"targets-r{self.rank:04d}.json"
        hidden = self.folder / f".{target.name}.tmp"
        hidden.write_text(json.dumps([{"targets": [f"{host}:{self.port}"],
                                       "labels": {"seedance_run": self.run}}]))
        os.replace(hidden, target)
        return self.port

    def close(self) -> dict[str, Any]:
        """Flush the samples, write `totals-r<rank>-a<attempt>.json` (the recorder's sums), wait up to
        telemetry.final_scrape_wait for a scrape that saw the last step, stop the exporter."""
        self.flush()
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        snapshot = self.snapshot()
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"totals-r{self.rank:04d}-a{self.attempt:03d}.json"
        hidden = self.folder / f".{path.name}.tmp"
        hidden.write_text(json.dumps(snapshot, indent=1, default=str))
        os.replace(hidden, path)
        if self._server is not None:
            deadline = time.monotonic() + float(self.settings.final_scrape_wait)
            with self._lock:
                while self._scraped_version < self._version and time.monotonic() < deadline:
                    self._scraped.wait(timeout=max(0.0, deadline - time.monotonic()))
            self._server.shutdown()
            self._server.server_close()
            self._server = None
            (self.folder / f"targets-r{self.rank:04d}.json").unlink(missing_ok=True)  # nothing left to scrape
        self.meter.close()
        return snapshot


_TOTALS_ROW = ("steps", "step_seconds", "busy_seconds", "cost_usd", "energy_joules", "loader_samples", "loader_bytes",
               "skipped_steps", "alloc_retries")


def _totals_row(totals: dict) -> tuple:
    """The cumulative values a sample file needs of one step, as they were after it."""
    return (*(totals[key] for key in _TOTALS_ROW), dict(totals["phase_seconds"]))


def _sample_rows(records: list[tuple], labels: dict, meter) -> tuple[list, list, list, list]:
    """(timestamps, names, label dicts, values) of the recorded steps: each step's gauges and totals
    under the Prometheus names, labelled with run, rank, attempt and step."""
    stamps: list[float] = []
    names: list[str] = []
    label_dicts: list[dict] = []
    values: list[float] = []
    for now, step, phases, last, row in records:
        totals = dict(zip(_TOTALS_ROW, row[:-1], strict=True))
        phase_totals = row[-1]
        base = {**labels, "step": str(step)}
        source = {**base, "source": meter.source}

        def add(name: str, value: float, label: dict = base, now: float = now) -> None:
            stamps.append(now)
            names.append(name)
            label_dicts.append(label)
            values.append(float(value))

        add("seedance_step", step)
        add("seedance_steps_total", totals["steps"])
        add("seedance_step_duration_seconds", last["step_seconds"])
        for name, value in phases.items():
            add("seedance_step_phase_seconds", value, {**base, "phase": name})
            add("seedance_phase_seconds_total", phase_totals[name], {**base, "phase": name})
        add("seedance_step_seconds_total", totals["step_seconds"])
        add("seedance_busy_seconds_total", totals["busy_seconds"])
        add("seedance_step_cost_usd", last["cost_usd"])
        add("seedance_cost_usd_total", totals["cost_usd"])
        add("seedance_step_energy_joules", last["energy_joules"], source)
        add("seedance_energy_joules_total", totals["energy_joules"], source)
        add("seedance_utilisation_ratio", last["utilisation"], {**base, "source": meter.utilisation_source})
        add("seedance_loader_samples_per_second", last["samples_per_second"])
        add("seedance_loader_bytes_per_second", last["bytes_per_second"])
        add("seedance_loader_samples_total", totals["loader_samples"])
        add("seedance_loader_bytes_total", totals["loader_bytes"])
        add("seedance_skipped_steps_total", totals["skipped_steps"])
        if last["loss_scale"] is not None:
            add("seedance_loss_scale", last["loss_scale"])
        if "memory_reserved_bytes" in last:
            add("seedance_memory_reserved_bytes", last["memory_reserved_bytes"])
            add("seedance_memory_allocated_bytes", last["memory_allocated_bytes"])
            add("seedance_alloc_retries_total", totals["alloc_retries"])
    return stamps, names, label_dicts, values
