"""Every signal fires on data built to cross its threshold and stays silent just under it."""

from __future__ import annotations

from decimal import Decimal

import pytest

from seedance_tasks.signals.audit import evaluate_rule
from tests.signals.builders import (
    DATA,
    NIGHT,
    counter,
    days,
    focus_file,
    inputs,
    night_points,
    samples_file,
    settings,
    template,
)

EGRESS = "data transfer out beyond the global free tier"
REQUESTS = "Amazon SQS standard requests"
PIOPS = "provisioned IOPS-month of gp3"
COMPUTE = "On Demand Linux g5.4xlarge Instance Hour"


def fired(rule_id, night_inputs):
    result = evaluate_rule(rule_id, NIGHT, night_inputs)
    assert "skipped" not in result, result
    return result["findings"]


@pytest.mark.parametrize(("now", "fires"), [(141, True), (139, False)])
def test_egress_jump(tmp_path, now, fires):
    egress, requests = template(EGRESS), template(REQUESTS)
    lines = [(egress, day, 100 if i < 28 else now, 1000) for i, day in enumerate(days(56))]
    lines += [(requests, day, 1, 5000) for day in days(56)]
    findings = fired("egress-jump", inputs(billing_uri=focus_file(tmp_path / "m.csv", lines)))
    assert bool(findings) is fires
    if fires:
        assert findings[0]["key"] == egress["ServiceName"]
        assert findings[0]["evidence"]["jump_percent"] == 41.0
        assert findings[0]["at_stake"] == str(Decimal(41 * 28 * 30 / 28).quantize(Decimal("0.01")))
        assert findings[0]["currency"] == "USD"


def test_egress_jump_silent_when_requests_moved_too(tmp_path):
    egress, requests = template(EGRESS), template(REQUESTS)
    lines = [(egress, day, 100 if i < 28 else 200, 1000) for i, day in enumerate(days(56))]
    lines += [(requests, day, 1, 5000 if i < 28 else 6000) for i, day in enumerate(days(56))]
    assert fired("egress-jump", inputs(billing_uri=focus_file(tmp_path / "m.csv", lines))) == []


@pytest.mark.parametrize(("today", "fires"), [(121, True), (119, False)])
def test_cost_surge(tmp_path, today, fires):
    row = template(COMPUTE)
    lines = [(row, day, 98 if i % 2 else 102, 24) for i, day in enumerate(days(28, NIGHT - __import__("datetime").timedelta(days=1)))]
    lines.append((row, NIGHT, today, 24))
    findings = fired("cost-surge", inputs(billing_uri=focus_file(tmp_path / "m.csv", lines)))
    assert bool([f for f in findings if f["key"].startswith("service=")]) is fires


@pytest.mark.parametrize(("unowned", "fires"), [("5.1", True), ("4.9", False)])
def test_unallocated_share(tmp_path, unowned, fires):
    owned = {**template(COMPUTE), "Tags": '{"owner": "PlatformTeam"}'}
    untagged = {**template(COMPUTE), "Tags": "NULL"}
    lines = [(owned, NIGHT, str(100 - Decimal(unowned)), 1), (untagged, NIGHT, unowned, 1)]
    findings = fired("unallocated-share", inputs(billing_uri=focus_file(tmp_path / "m.csv", lines)))
    assert bool(findings) is fires
    if fires:
        assert findings[0]["fix"]["dag_id"] == "seedance_cost_recovery"


@pytest.mark.parametrize(("measured", "fires"), [(0.099, True), (0.101, False)])
def test_idle_provisioned_iops(tmp_path, measured, fires):
    row = {**template(PIOPS), "ResourceId": "vol-0abc"}
    lines = [(row, day, 0.5, 3000 / 30) for day in days(28)]  # 3000 IOPS provisioned
    metrics = samples_file(tmp_path / "m.parquet", [
        ("node_disk_reads_completed_total", {"volume_id": "vol-0abc", "device": "nvme1n1"}, counter(3000 * measured / 2)),
        ("node_disk_writes_completed_total", {"volume_id": "vol-0abc", "device": "nvme1n1"}, counter(3000 * measured / 2)),
    ])
    findings = fired("idle-provisioned-iops", inputs(billing_uri=focus_file(tmp_path / "m.csv", lines),
                                                     metrics_uri=metrics))
    assert bool(findings) is fires


@pytest.mark.parametrize(("busy", "fires"), [(0.29, True), (0.31, False)])
def test_idle_vcpu_spend(tmp_path, busy, fires):
    row = {**template(COMPUTE), "ResourceId": "i-0123"}
    lines = [(row, day, 30 if i < 7 else 40, 24) for i, day in enumerate(days(14))]
    labels = {"resource_group": "i-0123", "instance_type": "g5.4xlarge"}
    series = []
    for cpu in range(4):
        series.append(("node_cpu_seconds_total", {**labels, "cpu": str(cpu), "mode": "idle"}, counter(1 - busy)))
        series.append(("node_cpu_seconds_total", {**labels, "cpu": str(cpu), "mode": "user"}, counter(busy)))
    table = {"g5.4xlarge": {"vcpus": 16, "hourly": "1.624"}, "g5.xlarge": {"vcpus": 4, "hourly": "1.006"},
             "g5.2xlarge": {"vcpus": 8, "hourly": "1.212"}}
    findings = fired("idle-vcpu-spend", inputs(settings=settings(price_table=table),
                                               billing_uri=focus_file(tmp_path / "m.csv", lines),
                                               metrics_uri=samples_file(tmp_path / "m.parquet", series)))
    assert bool(findings) is fires
    if fires:
        assert findings[0]["evidence"]["cheaper_fit"] == "g5.xlarge"
        assert findings[0]["at_stake"] == str(Decimal("0.618") * 730)[:6]


@pytest.mark.parametrize(("delta", "fires"), [(-1, True), (1, False)])
def test_small_files(tmp_path, delta, fires):
    lake = tmp_path / "lake" / "date=2024-10-30"
    lake.mkdir(parents=True)
    for index in range(8):
        (lake / f"part-{index}.parquet").write_bytes(b"x" * (1024 + delta))
    findings = fired("small-files", inputs(settings=settings(small_file_size=1024), lakes=[str(tmp_path / "lake")]))
    assert bool(findings) is fires
    if fires:
        assert findings[0]["evidence"]["files"] == 8
        assert findings[0]["fix"] == {"dag_id": "seedance_compaction",
                                      "conf": {"uri": str(tmp_path / "lake"), "dry_run": True}}


def _telemetry(tmp_path, data_share=0.05, collective_share=0.05, loader_rate=2.5e9, skipped_rate=0.0,
               fb_share=0.5, retries=0.0, extra=()):
    job = {"job": "llama-7b"}
    series = [
        ("seedance_step_seconds_total", job, counter(1.0)),
        ("seedance_phase_seconds_total", {**job, "phase": "data"}, counter(data_share)),
        ("seedance_phase_seconds_total", {**job, "phase": "collective"}, counter(collective_share)),
        ("seedance_loader_bytes_total", job, counter(loader_rate)),
        ("seedance_steps_total", job, counter(1.0)),
        ("seedance_skipped_steps_total", job, counter(skipped_rate)),
        ("seedance_alloc_retries_total", job, counter(retries)),
        ("DCGM_FI_DEV_FB_USED", {**job, "gpu": "0"}, night_points(81920 * fb_share)),
        ("DCGM_FI_DEV_FB_FREE", {**job, "gpu": "0"}, night_points(81920 * (1 - fb_share))),
        ("DCGM_FI_DEV_GPU_UTIL", {**job, "gpu": "0", "UUID": "GPU-1"}, night_points(80, start_days=7)),
        ("DCGM_FI_PROF_DRAM_ACTIVE", {**job, "gpu": "0"}, night_points(0.4)),
        *extra,
    ]
    return samples_file(tmp_path / "metrics.parquet", series)


@pytest.mark.parametrize(("share", "fires"), [(0.105, True), (0.095, False)])
def test_loader_throughput_data_wait(tmp_path, share, fires):
    findings = fired("loader-throughput", inputs(metrics_uri=_telemetry(tmp_path, data_share=share)))
    assert bool(findings) is fires


@pytest.mark.parametrize(("rate", "fires"), [(1.79e9, True), (1.81e9, False)])
def test_loader_throughput_gbps(tmp_path, rate, fires):
    assert bool(fired("loader-throughput", inputs(metrics_uri=_telemetry(tmp_path, loader_rate=rate)))) is fires


@pytest.mark.parametrize(("low", "minutes", "fires"), [(39, 35, True), (41, 35, False), (39, 25, False)])
def test_gpu_util_drop(tmp_path, low, minutes, fires):
    def util(i):  # 80% for 7 days, then tonight a dip from 02:00 of `minutes`
        return low if 7 * 288 + 24 <= i < 7 * 288 + 24 + minutes // 5 else 80

    dcgm = ("DCGM_FI_DEV_GPU_UTIL", {"job": "llama-7b", "gpu": "1", "UUID": "GPU-2"}, night_points(util, start_days=7))
    findings = fired("gpu-util-drop", inputs(metrics_uri=samples_file(tmp_path / "m.parquet", [dcgm])))
    assert bool(findings) is fires
    if fires:
        assert findings[0]["evidence"]["baseline_percent"] == 80.0


@pytest.mark.parametrize(("log", "fires"), [("torch_watchdog_timeout_default_10min_basicsr737.log", True),
                                            ("torch_watchdog_desync_report_stas00.log", False)])
def test_allreduce_wait_from_real_watchdog_logs(log, fires):
    findings = fired("allreduce-wait", inputs(logs=[str(DATA / log)]))
    assert bool(findings) is fires
    if fires:
        assert findings[0]["evidence"]["consecutive"] >= 3
        assert findings[0]["evidence"]["timeout_ms"] == 600000


@pytest.mark.parametrize(("share", "fires"), [(0.26, True), (0.24, False)])
def test_allreduce_wait_collective_share(tmp_path, share, fires):
    assert bool(fired("allreduce-wait", inputs(metrics_uri=_telemetry(tmp_path, collective_share=share)))) is fires


@pytest.mark.parametrize(("per_epoch", "fires"), [(33, True), (31, False)])
def test_fp16_overflow(tmp_path, per_epoch, fires):
    metrics = _telemetry(tmp_path, skipped_rate=per_epoch / 1000)
    assert bool(fired("fp16-overflow", inputs(metrics_uri=metrics))) is fires


@pytest.mark.parametrize(("share", "retries", "fires"), [(0.88, 0.01, True), (0.86, 0.01, False), (0.88, 0.0, False)])
def test_gpu_memory_residency(tmp_path, share, retries, fires):
    metrics = _telemetry(tmp_path, fb_share=share, retries=retries)
    assert bool(fired("gpu-memory-residency", inputs(metrics_uri=metrics))) is fires


def test_metrics_blind_spot_names_what_the_source_lacks(tmp_path):
    dcgm_defaults_only = samples_file(tmp_path / "m.parquet", [
        ("DCGM_FI_DEV_GPU_UTIL", {"job": "a", "gpu": "0"}, night_points(80)),
        ("DCGM_FI_DEV_FB_USED", {"job": "a", "gpu": "0"}, night_points(100))])
    findings = {f["key"]: f for f in fired("metrics-blind-spot", inputs(metrics_uri=dcgm_defaults_only))}
    assert findings["gpu-util-drop"]["evidence"]["missing_optional"] == ["DCGM_FI_PROF_DRAM_ACTIVE"]
    assert "seedance_loader_bytes_total" in findings["loader-throughput"]["evidence"]["missing"]
    assert "node_cpu_seconds_total" in findings["idle-vcpu-spend"]["evidence"]["missing"]
    skipped = evaluate_rule("loader-throughput", NIGHT, inputs(metrics_uri=dcgm_defaults_only))
    assert skipped["skipped"].startswith("metrics missing: ")


def test_metrics_blind_spot_silent_when_everything_is_there(tmp_path):
    extra = [("node_cpu_seconds_total", {"cpu": "0", "mode": "idle"}, night_points(1)),
             ("node_disk_reads_completed_total", {"device": "a"}, night_points(1)),
             ("node_disk_writes_completed_total", {"device": "a"}, night_points(1))]
    assert fired("metrics-blind-spot", inputs(metrics_uri=_telemetry(tmp_path, extra=extra))) == []


def _checkpoint_store(tmp_path, steps=(0, 10, 20)):
    """A real store of `steps` of run `r`, saved by `seedance_tasks.checkpoint.save` (tiny tensors)."""
    import torch

    from seedance_tasks import checkpoint
    from seedance_tasks.checkpoint.store import list_checkpoints

    store = str(tmp_path / "store")
    for step in steps:
        state = {"model": {"w": torch.full((8, 4), float(step)), "b": torch.arange(4.0) + step}, "step": step}
        checkpoint.save(state, store, "r", step, cache_base=False)
    rows = list_checkpoints(store)
    assert [row["step"] for row in rows] == list(steps)
    return store, rows


def _bloat(store, rows, **changes):
    from datetime import datetime

    day = max(datetime.fromisoformat(row["created_at"]) for row in rows).date()
    return evaluate_rule("checkpoint-bloat", day, inputs(settings=settings(**changes), checkpoints_uri=store))


def _ages(rows) -> list[float]:
    """Ages in seconds of the checkpoints at the end of the audited night (the rule's clock), oldest first."""
    from datetime import UTC, datetime, timedelta

    created = [datetime.fromisoformat(row["created_at"]) for row in rows]
    night_end = datetime.combine(max(created).date(), datetime.min.time(), UTC) + timedelta(days=1)
    return sorted(((night_end - when).total_seconds() for when in created), reverse=True)


@pytest.mark.parametrize(("side", "fires"), [(-1, True), (1, False)])
def test_checkpoint_bloat_hot_older_than_policy(tmp_path, side, fires):
    store, rows = _checkpoint_store(tmp_path)
    oldest, second, _ = _ages(rows)
    assert oldest > second  # saved one after the other
    # the policy's age limit just under (fires: only the oldest is stale) or just over the oldest's age
    limit = oldest + side * (oldest - second) / 2
    result = _bloat(store, rows, checkpoint_hot_max_age=limit, checkpoint_max_per_run=50)
    assert "skipped" not in result, result
    assert result["fired"] is fires
    if fires:
        [finding] = result["findings"]
        first_saved = min(rows, key=lambda row: row["created_at"])
        assert finding["key"] == f"{store}#r"
        assert finding["evidence"]["stale_hot"] == 1
        assert finding["evidence"]["stale_hot_bytes"] == first_saved["stored_bytes"]
        assert finding["evidence"]["stored_bytes"] == sum(row["stored_bytes"] for row in rows)
        assert finding["fix"] == {"dag_id": "seedance_checkpoint_lifecycle",
                                  "conf": {"store": store, "run": "r", "apply": False}}


@pytest.mark.parametrize(("most", "fires"), [(2, True), (3, False)])
def test_checkpoint_bloat_more_checkpoints_than_gc_keeps(tmp_path, most, fires):
    store, rows = _checkpoint_store(tmp_path)
    result = _bloat(store, rows, checkpoint_hot_max_age=_ages(rows)[0] + 3600, checkpoint_max_per_run=most)
    assert "skipped" not in result, result
    assert result["fired"] is fires
    if fires:
        [finding] = result["findings"]
        assert (finding["evidence"]["checkpoints"], finding["evidence"]["stale_hot"]) == (3, 0)
        assert "3 checkpoints kept" in finding["summary"]
        assert finding["fix"]["dag_id"] == "seedance_checkpoint_lifecycle"


def test_egress_jump_silent_when_requests_appeared_from_none(tmp_path):
    """Requests from nothing to 5,000 a day moved without bound, not 0%: the traffic explains the egress."""
    egress, requests = template(EGRESS), template(REQUESTS)
    lines = [(egress, day, 100 if i < 28 else 200, 1000) for i, day in enumerate(days(56))]
    lines += [(requests, day, 1, 5000) for i, day in enumerate(days(56)) if i >= 28]
    assert fired("egress-jump", inputs(billing_uri=focus_file(tmp_path / "m.csv", lines))) == []
