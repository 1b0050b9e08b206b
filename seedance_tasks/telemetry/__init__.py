"""Training telemetry: what each step costs (USD), the energy it used, how busy the device was, and
where its time went; exported to Prometheus per rank and kept as Parquet samples in the run's folder.

    from seedance_tasks.telemetry import StepRecorder
    recorder = StepRecorder(load_settings().telemetry, folder=run_dir / "telemetry", rank=rank, run=run)

Light to import: torch, pyarrow and prometheus_client load on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["StepRecorder", "summarise", "read_samples"]


def __getattr__(name: str) -> Any:
    if name == "StepRecorder":
        from seedance_tasks.telemetry.recorder import StepRecorder

        return StepRecorder
    if name in ("summarise", "read_samples"):
        from seedance_tasks.telemetry import samples

        return getattr(samples, name)
    raise AttributeError(name)
