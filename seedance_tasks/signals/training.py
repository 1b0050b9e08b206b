"""Training signals, from DCGM exporter metrics, Seedance's training telemetry
(`seedance_tasks.telemetry`: loader bytes, step phases, skipped steps, allocation retries) and the
PyTorch NCCL watchdog's log lines: loader-throughput, gpu-util-drop, allreduce-wait, fp16-overflow,
gpu-memory-residency."""

from __future__ import annotations

import re
from datetime import date
from decimal import Decimal

import numpy as np

from seedance_tasks.signals.model import Finding, Skipped, dollars, require_metrics, severity_for
from seedance_tasks.signals.sources import Series, increase

HOURS_A_MONTH = 730
STEP_SECONDS = "seedance_step_seconds_total"
PHASES = "seedance_phase_seconds_total"


def by_job(series: list[Series], label: str) -> dict[str, list[Series]]:
    out: dict[str, list[Series]] = {}
    for item in series:
        if item.labels.get(label):
            out.setdefault(item.labels[label], []).append(item)
    return out


def _increase(series: list[Series]) -> float:
    return sum(increase(item) for item in series)


def _phase_share(inputs, day: date, phase: str) -> dict[str, tuple[float, float]]:
    """job -> (seconds in `phase`, step seconds) over `day`."""
    label = inputs.settings.job_label
    steps = {job: _increase(items) for job, items in by_job(inputs.metric_series(STEP_SECONDS, day), label).items()}
    phases = by_job([s for s in inputs.metric_series(PHASES, day) if s.labels.get("phase") == phase], label)
    return {job: (_increase(phases.get(job, [])), total) for job, total in steps.items() if total > 0}


def gpu_count(series: list[Series]) -> int:
    """How many GPUs `series` (DCGM exporter series of one job) measure: one per GPU UUID (`uuid` in
    older exporters), so a GPU whose series split (a pod restarted, an exporter upgrade added a
    label) counts once; a series without a UUID counts as one GPU."""
    uuids = {item.labels.get("UUID") or item.labels.get("uuid") for item in series}
    return len(uuids - {None, ""}) + sum(1 for item in series if not (item.labels.get("UUID") or item.labels.get("uuid")))


def _gpus(inputs, day: date) -> dict[str, int]:
    if "DCGM_FI_DEV_GPU_UTIL" not in inputs.metric_names(day):
        return {}
    jobs = by_job(inputs.metric_series("DCGM_FI_DEV_GPU_UTIL", day), inputs.settings.job_label)
    return {job: gpu_count(items) for job, items in jobs.items()}


def _gpu_cost(share: float, gpus: int, settings) -> Decimal:
    return dollars(Decimal(str(share)) * gpus * HOURS_A_MONTH * settings.gpu_hour_price)


class LoaderThroughput:
    id = "loader-throughput"
    family = "training"
    needs = ("metrics",)
    metrics = ("seedance_loader_bytes_total", PHASES, STEP_SECONDS)
    description = "the data loader below 1.8 GB/s, or GPUs waiting on data for more than 10% of step time"

    def evaluate(self, day: date, inputs) -> list[Finding]:
        settings = inputs.settings
        require_metrics(inputs, self.metrics, day)
        loaded = by_job(inputs.metric_series("seedance_loader_bytes_total", day), settings.job_label)
        waits = _phase_share(inputs, day, "data")
        gpus = _gpus(inputs, day)
        findings = []
        for job in sorted(set(loaded) | set(waits)):
            wait, steps = waits.get(job, (0.0, 0.0))
            share = wait / steps if steps else 0.0
            spans = [item.ts[-1] - item.ts[0] for item in loaded.get(job, []) if len(item.ts) > 1]
            rate = _increase(loaded.get(job, [])) / max(spans) / 1e9 if spans and max(spans) > 0 else None
            slow = rate is not None and rate < float(settings.loader_gbps)
            waiting = share * 100 > float(settings.data_wait_percent)
            if not slow and not waiting:
                continue
            at_stake = _gpu_cost(share, gpus.get(job, 1), settings)
            findings.append(Finding(
                self.id, job, severity_for(at_stake, settings),
                f"job {job}: loader {rate or 0:.2f} GB/s, GPUs wait on data {share:.0%} of step time",
                {"loader_gbps": None if rate is None else round(rate, 3), "data_wait_share": round(share, 4),
                 "gpus": gpus.get(job, 1)},
                at_stake, fix={"dag_id": "seedance_preprocess", "conf": {}},
            ))
        return findings


class GpuUtilDrop:
    id = "gpu-util-drop"
    family = "training"
    needs = ("metrics",)
    metrics = ("DCGM_FI_DEV_GPU_UTIL",)
    optional_metrics = ("DCGM_FI_PROF_DRAM_ACTIVE",)
    description = "GPU utilisation of a job below half its own 7-day baseline for longer than a window"

    def evaluate(self, day: date, inputs) -> list[Finding]:
        settings = inputs.settings
        require_metrics(inputs, self.metrics, day)
        findings = []
        jobs = by_job(inputs.metric_series("DCGM_FI_DEV_GPU_UTIL", day, days_before=7), settings.job_label)
        start = _day_seconds(day)
        for job, items in sorted(jobs.items()):
            ts, mean = _mean_over(items)
            history, tonight = mean[ts < start], ts >= start
            if len(history) < 2 or not tonight.any():
                continue
            baseline = float(np.median(history))
            low = mean[tonight] < baseline * float(settings.util_drop_percent) / 100
            longest, step = _longest_run(ts[tonight], low)
            if longest < settings.util_drop_window:
                continue
            lost = (baseline - float(mean[tonight][low].mean())) / 100 * longest / 86400
            gpus = gpu_count(items)
            at_stake = _gpu_cost(lost, gpus, settings)
            share = _phase_share(inputs, day, "collective").get(job) if {PHASES, STEP_SECONDS} <= inputs.metric_names(day) else None
            findings.append(Finding(
                self.id, job, severity_for(at_stake, settings),
                f"job {job}: GPU utilisation {mean[tonight][low].mean():.0f}% against a baseline of {baseline:.0f}% "
                f"for {longest / 60:.0f} min",
                {"baseline_percent": round(baseline, 1), "low_percent": round(float(mean[tonight][low].mean()), 1),
                 "longest_low_seconds": int(longest), "gpus": gpus,
                 "collective_share": None if not share else round(share[0] / share[1], 4)},
                at_stake,
            ))
        return findings


def _day_seconds(day: date) -> float:
    from seedance_tasks.signals.sources import day_start

    return day_start(day).timestamp()


def _mean_over(items: list[Series]) -> tuple[np.ndarray, np.ndarray]:
    """Timestamps and the mean value across series at each (samples aligned on their timestamps)."""
    ts = np.concatenate([item.ts for item in items])
    values = np.concatenate([item.values for item in items])
    keys, inverse = np.unique(ts, return_inverse=True)
    return keys, np.bincount(inverse, values) / np.bincount(inverse)


def _longest_run(ts: np.ndarray, flags: np.ndarray) -> tuple[float, float]:
    """Seconds of the longest run of consecutive True flags (each sample covers one step)."""
    step = float(np.median(np.diff(ts))) if len(ts) > 1 else 0.0
    best = run = 0
    for flag in flags:
        run = run + 1 if flag else 0
        best = max(best, run)
    return best * step, step


WATCHDOG = re.compile(r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+).*?Timeout\(ms\)=(\d+)\) ran for (\d+) milliseconds")


class AllreduceWait:
    id = "allreduce-wait"
    family = "training"
    needs = ("metrics", "logs")  # either is enough
    metrics = (PHASES, STEP_SECONDS)
    description = ("three consecutive collectives waiting >= 95% of the collective timeout (NCCL watchdog "
                   "log), or collectives taking more than 25% of step time")

    def evaluate(self, day: date, inputs) -> list[Finding]:
        settings = inputs.settings
        findings, reasons = [], []
        try:
            findings += self._from_logs(inputs)
        except Skipped as why:
            reasons.append(str(why))
        try:
            require_metrics(inputs, self.metrics, day)
            for job, (seconds, steps) in sorted(_phase_share(inputs, day, "collective").items()):
                share = seconds / steps
                if share * 100 <= float(settings.collective_share_percent):
                    continue
                at_stake = _gpu_cost(share, _gpus(inputs, day).get(job, 1), settings)
                findings.append(Finding(
                    self.id, job, severity_for(at_stake, settings),
                    f"job {job}: collectives take {share:.0%} of step time: check the NCCL settings",
                    {"collective_share": round(share, 4)}, at_stake,
                    fix={"dag_id": "seedance_training", "conf": {}},
                ))
        except Skipped as why:
            reasons.append(str(why))
        if len(reasons) == 2:
            raise Skipped("; ".join(reasons))
        return findings

    def _from_logs(self, inputs) -> list[Finding]:
        settings = inputs.settings
        findings = []
        for uri, text in inputs.log_texts():
            run, worst = [], []
            for match in WATCHDOG.finditer(text):
                timeout_ms = int(match[3]) or settings.collective_timeout * 1000
                if int(match[4]) >= timeout_ms * float(settings.collective_wait_percent) / 100:
                    run.append((int(match[1]), match[2], int(match[4]), timeout_ms))
                    worst = run if len(run) > len(worst) else worst
                else:
                    run = []
            if len(worst) >= 3:
                findings.append(Finding(
                    self.id, uri, "critical",
                    f"{uri}: {len(worst)} consecutive collectives ran >= {settings.collective_wait_percent}% of "
                    f"their timeout ({worst[0][1]}, seq {worst[0][0]})",
                    {"consecutive": len(worst), "timeout_ms": worst[0][3],
                     "ran_for_ms": [item[2] for item in worst]},
                    fix={"dag_id": "seedance_training", "conf": {}},
                ))
        return findings


class Fp16Overflow:
    id = "fp16-overflow"
    family = "training"
    needs = ("metrics",)
    metrics = ("seedance_skipped_steps_total", "seedance_steps_total")
    description = "more than 32 skipped optimizer steps (loss-scale overflows) per epoch"

    def evaluate(self, day: date, inputs) -> list[Finding]:
        settings = inputs.settings
        require_metrics(inputs, self.metrics, day)
        skipped = by_job(inputs.metric_series("seedance_skipped_steps_total", day), settings.job_label)
        steps = by_job(inputs.metric_series("seedance_steps_total", day), settings.job_label)
        findings = []
        for job in sorted(skipped):
            total = _increase(steps.get(job, []))
            if total <= 0:
                continue
            per_epoch = _increase(skipped[job]) * settings.steps_per_epoch / total
            if per_epoch <= settings.overflow_per_epoch:
                continue
            findings.append(Finding(
                self.id, job, "warning",
                f"job {job}: {per_epoch:.0f} skipped steps per epoch (loss-scale overflows): use bf16 or a lower LR",
                {"skipped_per_epoch": round(per_epoch, 1), "steps": total, "skipped": _increase(skipped[job])},
                _gpu_cost(per_epoch / settings.steps_per_epoch, 1, settings),
            ))
        return findings


class GpuMemoryResidency:
    id = "gpu-memory-residency"
    family = "training"
    needs = ("metrics",)
    metrics = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "seedance_alloc_retries_total")
    description = "reserved GPU memory above 87% with allocation retries rising"

    def evaluate(self, day: date, inputs) -> list[Finding]:
        settings = inputs.settings
        require_metrics(inputs, self.metrics, day)
        label = settings.job_label
        used = by_job(inputs.metric_series("DCGM_FI_DEV_FB_USED", day), label)
        free = by_job(inputs.metric_series("DCGM_FI_DEV_FB_FREE", day), label)
        retries = by_job(inputs.metric_series("seedance_alloc_retries_total", day), label)
        findings = []
        for job in sorted(used):
            used_mib = sum(float(item.values.mean()) for item in used[job])
            total_mib = used_mib + sum(float(item.values.mean()) for item in free.get(job, []))
            added = _increase(retries.get(job, []))
            if total_mib <= 0 or used_mib / total_mib * 100 <= float(settings.memory_reserved_percent) or added <= 0:
                continue
            findings.append(Finding(
                self.id, job, "warning",
                f"job {job}: {used_mib / total_mib:.0%} of GPU memory reserved, {added:.0f} allocation retries today",
                {"reserved_share": round(used_mib / total_mib, 4), "alloc_retries": added, "gpus": gpu_count(used[job])},
            ))
        return findings
