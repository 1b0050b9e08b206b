"""Energy and utilisation of one rank, from the best counter this machine has.

- `nvml`: NVML's total-energy counter of the rank's GPU (mJ since the driver loaded, Volta and
  later) and its utilisation rate.
- `rapl`: the CPU packages' RAPL counters under `/sys/class/powercap` (µJ, wrapping at
  `max_energy_range_uj`), shared out over the ranks on the machine; utilisation from CPU time.
- `estimated`: TDP (or watts per core) x utilisation x seconds, where no counter is readable.
  Every reading carries its `source`, so an estimate is never mistaken for a measurement.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

ESTIMATED = "estimated"


class Meter:
    """Base: `read()` -> (cumulative joules of this rank, utilisation 0..1 since the last read)."""

    source = ESTIMATED
    utilisation_source = "cpu_time"

    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.process_time()
        self.joules = 0.0

    def _cpu_utilisation(self, cores: float) -> tuple[float, float]:
        """(utilisation of `cores` from this process's CPU time since the last call, wall seconds)."""
        wall, cpu = time.perf_counter(), time.process_time()
        elapsed = wall - self._wall
        used = cpu - self._cpu
        self._wall, self._cpu = wall, cpu
        if elapsed <= 0:
            return 0.0, 0.0
        return min(1.0, max(0.0, used / (elapsed * cores))), elapsed

    def read(self, busy: float | None = None) -> tuple[float, float]:
        """(cumulative joules, utilisation since the last read); `busy` is the step's compute
        fraction, used only by a GPU meter that has no utilisation counter."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"source": self.source, "utilisation_source": self.utilisation_source}

    def close(self) -> None:
        pass


class EstimatedMeter(Meter):
    """watts (TDP, or watts per core x cores) x utilisation x seconds; `source = estimated`."""

    def __init__(self, watts: float, cores: float = 1.0, utilisation=None, gpu: bool = False) -> None:
        super().__init__()
        self.watts, self.cores, self.gpu = float(watts), float(cores), gpu
        self._gpu_utilisation = utilisation  # a callable for a GPU without an energy counter
        if utilisation is not None:
            self.utilisation_source = "nvml"
        elif gpu:
            self.utilisation_source = "compute_fraction"

    def read(self, busy: float | None = None) -> tuple[float, float]:
        utilisation, elapsed = self._cpu_utilisation(self.cores)
        if self._gpu_utilisation is not None:
            utilisation = self._gpu_utilisation()
        elif self.gpu:
            utilisation = busy or 0.0
        self.joules += self.watts * utilisation * elapsed
        return self.joules, utilisation

    def describe(self) -> dict:
        return {**super().describe(), "watts": self.watts, "cores": self.cores}


class RaplMeter(Meter):
    """CPU package energy from RAPL, this rank's share (1 / ranks on the machine)."""

    source = "rapl"

    def __init__(self, zones: list[Path], cores: float, share: float) -> None:
        super().__init__()
        self.zones, self.cores, self.share = zones, float(cores), float(share)
        self._ranges = [int((zone / "max_energy_range_uj").read_text()) for zone in zones]
        self._last = [self._counter(zone) for zone in zones]

    @staticmethod
    def _counter(zone: Path) -> int:
        return int((zone / "energy_uj").read_text())

    def read(self, busy: float | None = None) -> tuple[float, float]:
        utilisation, _elapsed = self._cpu_utilisation(self.cores)
        delta = 0
        for index, zone in enumerate(self.zones):
            now = self._counter(zone)
            step = now - self._last[index]
            if step < 0:  # the counter wrapped
                step += self._ranges[index] + 1
            delta += step
            self._last[index] = now
        self.joules += delta / 1e6 * self.share
        return self.joules, utilisation

    def describe(self) -> dict:
        return {**super().describe(), "zones": [zone.name for zone in self.zones], "share": self.share}


def rapl_zones(root: str | Path) -> list[Path]:
    """The readable top-level RAPL package zones (`intel-rapl:N`, not their subzones) under `root`."""
    root = Path(root)
    zones = []
    try:
        candidates = sorted(root.iterdir())
    except OSError:
        return []
    for zone in candidates:
        name = zone.name
        if not name.startswith(("intel-rapl:", "amd-rapl:")) or name.count(":") != 1:
            continue
        try:
            int((zone / "energy_uj").read_text())
            int((zone / "max_energy_range_uj").read_text())
        except (OSError, ValueError):  # root-only since Linux 5.10 on many distributions
            continue
        zones.append(zone)
    return zones


class NvmlMeter(Meter):
    """The GPU's total-energy counter and utilisation rate through NVML (`nvidia-ml-py`)."""

    source = "nvml"
    utilisation_source = "nvml"

    def __init__(self, handle, pynvml) -> None:
        super().__init__()
        self._handle, self._nvml = handle, pynvml
        self._start = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # mJ; raises if unsupported
        self.name = pynvml.nvmlDeviceGetName(handle)
        self.name = self.name.decode() if isinstance(self.name, bytes) else self.name

    def utilisation(self) -> float:
        return self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu / 100.0

    def read(self, busy: float | None = None) -> tuple[float, float]:
        self.joules = (self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) - self._start) / 1000.0
        return self.joules, self.utilisation()

    def describe(self) -> dict:
        return {**super().describe(), "gpu": self.name}

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a library that is going away anyway
            pass


def nvml_handle(cuda_index: int):
    """(pynvml, the NVML handle of CUDA device `cuda_index`) or None where NVML is unusable.

    Matched by UUID, so CUDA_VISIBLE_DEVICES reordering cannot pick another GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver, no GPU: all mean "no NVML here"
        return None
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
        uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:  # noqa: BLE001 - an older driver or torch: fall back to the index
        try:
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(cuda_index)
        except Exception:  # noqa: BLE001
            return None


def open_meter(settings, *, cuda_index: int | None, cores: float, ranks_on_machine: int = 1) -> Meter:
    """The best meter for this rank under `telemetry.energy` (an EnergySettings); see the module doc."""
    wanted = settings.source
    if cuda_index is not None and wanted in ("auto", "nvml"):
        found = nvml_handle(cuda_index)
        if found is not None:
            pynvml, handle = found
            try:
                return NvmlMeter(handle, pynvml)
            except Exception:  # noqa: BLE001 - no energy counter (pre-Volta): estimate from its power limit
                try:
                    watts = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
                except Exception:  # noqa: BLE001
                    watts = settings.gpu_tdp_watts
                return EstimatedMeter(watts, utilisation=lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100,
                                      gpu=True)
    if cuda_index is not None:
        return EstimatedMeter(settings.gpu_tdp_watts, gpu=True)
    if wanted in ("auto", "rapl"):
        zones = rapl_zones(settings.powercap_root)
        if zones:
            return RaplMeter(zones, cores, 1.0 / max(1, ranks_on_machine))
    return EstimatedMeter(settings.cpu_watts_per_core * cores, cores=cores)


def cores_of_this_process() -> int:
    """CPU cores this rank computes on: its torch threads, at most the CPUs it may run on."""
    import torch

    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), allowed))
