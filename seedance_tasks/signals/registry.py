"""The one table of signals: adding a signal is adding its class to a family module and one line here."""

from __future__ import annotations

from seedance_tasks.signals import billing, coverage, data, training

RULES = {rule.id: rule for rule in (
    billing.EgressJump(),
    billing.IdleProvisionedIops(),
    billing.IdleVcpuSpend(),
    billing.CostSurge(),
    billing.UnallocatedShare(),
    data.SmallFiles(),
    training.LoaderThroughput(),
    training.GpuUtilDrop(),
    training.AllreduceWait(),
    training.Fp16Overflow(),
    training.GpuMemoryResidency(),
    data.CheckpointBloat(),
    coverage.MetricsBlindSpot(),
)}
