"""Data signals, from listings: small-files (dataset roots) and checkpoint-bloat (the store's
catalog). Both carry a fix that another pipeline runs when their Asset event arrives."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from seedance_tasks.signals.model import Finding, dollars, severity_for
from seedance_tasks.units import format_size


class SmallFiles:
    id = "small-files"
    family = "data"
    needs = ("lakes",)
    metrics: tuple[str, ...] = ()
    description = "a dataset root's mean Parquet file size < 16 MB (healthy > 128 MB)"

    def evaluate(self, day: date, inputs) -> list[Finding]:
        from seedance_tasks.config import load_settings

        settings = inputs.settings
        compaction = load_settings().compaction
        per_file = compaction.s3_requests_per_file_per_month
        price = Decimal(compaction.s3_get_price_per_1000)
        findings = []
        for uri, files in inputs.lake_files().items():
            parquet = [info for info in files if info.path.endswith(".parquet")]
            total = sum(info.size for info in parquet)
            if len(parquet) < settings.min_small_files or total / len(parquet) >= settings.small_file_size:
                continue
            mean = total / len(parquet)
            after = max(1, math.ceil(total / compaction.target_file_size))
            requests = len(parquet) * per_file
            at_stake = dollars(Decimal(len(parquet) - after) * per_file * price / 1000)
            findings.append(Finding(
                self.id, uri, severity_for(at_stake, settings),
                f"{uri}: {len(parquet):,} Parquet files, mean {format_size(int(mean))}: compact it",
                {"files": len(parquet), "bytes": total, "mean_file_bytes": int(mean), "files_after": after,
                 "requests_per_month": requests},
                at_stake, fix={"dag_id": "seedance_compaction", "conf": {"uri": uri, "dry_run": not settings.apply}},
            ))
        return findings


class CheckpointBloat:
    id = "checkpoint-bloat"
    family = "data"
    needs = ("checkpoints",)
    metrics: tuple[str, ...] = ()
    description = "a checkpoint store growing without GC, or hot-tier bytes older than the policy allows"

    def evaluate(self, day: date, inputs) -> list[Finding]:
        settings = inputs.settings
        now = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1)
        by_run: dict[str, list[dict]] = {}
        for row in inputs.checkpoints:
            if datetime.fromisoformat(row["created_at"]) < now:
                by_run.setdefault(row["run"], []).append(row)
        findings = []
        for run, rows in sorted(by_run.items()):
            stale = [row for row in rows if "hot" in row["tier"].split(",")
                     and (now - datetime.fromisoformat(row["created_at"])).total_seconds() > settings.checkpoint_hot_max_age]
            stale_bytes = sum(row["stored_bytes"] for row in stale)
            too_many = len(rows) > settings.checkpoint_max_per_run
            if not stale and not too_many:
                continue
            gb = Decimal(stale_bytes) / Decimal(10**9)
            at_stake = dollars(gb * (settings.hot_price_per_gb_month - settings.cold_price_per_gb_month))
            reasons = []
            if stale:
                reasons.append(f"{len(stale)} hot checkpoint(s), {format_size(stale_bytes)}, older than the policy")
            if too_many:
                reasons.append(f"{len(rows)} checkpoints kept (no GC?)")
            findings.append(Finding(
                self.id, f"{inputs.checkpoints_uri}#{run}", severity_for(at_stake, settings),
                f"run {run}: " + "; ".join(reasons),
                {"checkpoints": len(rows), "stale_hot": len(stale), "stale_hot_bytes": stale_bytes,
                 "stored_bytes": sum(row["stored_bytes"] for row in rows)},
                at_stake, fix={"dag_id": "seedance_checkpoint_lifecycle",
                               "conf": {"store": inputs.checkpoints_uri, "run": run, "apply": settings.apply}},
            ))
        return findings
