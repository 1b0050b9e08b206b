"""Checkpoints: raw checkpoints dropped into an inbox are delta-compressed into the checkpoint store.

Wiring only; the work is in `seedance_tasks.checkpoint`. Trainers drop
`INBOX/<run>/step-<N>.pt|.pth|.ckpt|.safetensors` (and may emit an event on the
`seedance_checkpoint_inbox` asset: docs/checkpoints.md shows the REST call); this DAG runs on
that event or hourly, and is skipped, with the reason, while no inbox and store are configured. Each ready file is a
mapped task: compress (delta against the run's previous checkpoint where it pays, byte-grouped
zstd otherwise, a full keyframe every K checkpoints), verify the stored checkpoint by decoding
every tensor against its sha256, and only then retire the raw file to the inbox trash; each under
the run's lease and a journal of its own, so a retried task finishes what a killed one left. Unsafe
or unreadable files (a pickle that would run code) are quarantined, never loaded. The report
emits `seedance_checkpoint_store` (store URI, runs and steps stored, bytes), on which the lifecycle
DAG runs. Every empty field is taken from config/seedance.yaml.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable, dag, task

from seedance_tasks.checkpoint.assets import CHECKPOINT_INBOX, CHECKPOINT_STORE
from seedance_tasks.dag_support import (
    DEFAULT_ARGS,
    duration_param,
    from_config,
    mapped_results,
    optional_param,
    tags,
)


@dag(
    dag_id="seedance_checkpoints",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 * * * *", timezone="UTC"), assets=[CHECKPOINT_INBOX]
    ),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=tags("checkpoint", "storage"),
    doc_md=__doc__,
    params={
        "inbox": optional_param(
            "Inbox", "Folder trainers drop raw checkpoints into (`INBOX/<run>/step-<N>.pt`).",
            empty=from_config("checkpoint.inbox") + " (none set: the run is skipped)", section="Locations",
        ),
        "store": optional_param(
            "Checkpoint store", "Local path, `file:///…` or `s3://bucket/prefix`.",
            empty=from_config("checkpoint.store") + " (none set: the run is skipped)", section="Locations",
        ),
        "codec": optional_param(
            "Codec", "auto picks per tensor: delta against the previous checkpoint or byte-grouped zstd.",
            empty=from_config("checkpoint.codec"), section="Compression",
            enum=["auto", "delta", "bgzstd", "zstd", "lz4"],
            values_display={"auto": "auto (per tensor)", "delta": "delta where it pays",
                            "bgzstd": "byte-grouped zstd", "zstd": "zstd", "lz4": "lz4"},
        ),
        "keyframe_every": optional_param(
            "Keyframe every", "Store every K-th checkpoint full (restore reads at most K).",
            empty=from_config("checkpoint.keyframe_every"), section="Compression", type="integer", minimum=1,
        ),
        "lossy": optional_param(
            "Lossy downcast", "bf16 stores float32/64 tensors at bf16 precision (about 3x smaller, not bit-exact); "
            "none stores them exactly.", empty=from_config("checkpoint.lossy"), section="Compression",
            enum=["none", "bf16"],
        ),
        "min_age": duration_param("Minimum file age", "Leave inbox files younger than this (still being written).",
                                  empty=from_config("checkpoint.inbox_min_age"), section="Run"),
        "purge_older_than": duration_param(
            "Purge trash older than", "Retired raw checkpoints in the inbox trash older than this are purged.",
            empty=from_config("storage.trash_retention"), section="Run",
        ),
    },
)
def seedance_checkpoints():
    @task(multiple_outputs=False)
    def scan(params: dict | None = None) -> dict:
        """List the inbox files ready to compress (old enough, named with a step)."""
        from seedance_tasks.checkpoint import airflow_tasks

        return airflow_tasks.scan_task(params)

    @task
    def ready(scanned: dict) -> list[dict]:
        """The files to map over, in (run, step) order."""
        return scanned["items"]

    @task(multiple_outputs=False, max_active_tis_per_dagrun=1)
    def ingest(item: dict, params: dict | None = None) -> dict:
        """Compress one raw checkpoint into the store, verify it, then retire the raw file."""
        from seedance_tasks import storage
        from seedance_tasks.checkpoint import airflow_tasks

        return airflow_tasks.ingest_task(item, params, storage.new_run_id())

    @task(multiple_outputs=False, outlets=[CHECKPOINT_STORE], trigger_rule="none_failed_min_one_success")
    def report(scanned: dict, results: list[dict]) -> dict:
        """One summary: files by status, bytes in and stored, ratio, problems."""
        from seedance_tasks.checkpoint import airflow_tasks

        return airflow_tasks.report_task(scanned, mapped_results(results), CHECKPOINT_STORE)

    @task(multiple_outputs=False, trigger_rule="none_failed_min_one_success")
    def purge_trash(summary: dict, params: dict | None = None) -> dict:
        """Free the inbox trash (retired raw checkpoints) older than `purge_older_than`."""
        from seedance_tasks.checkpoint import airflow_tasks

        return airflow_tasks.purge_task(params)

    scanned = scan()
    results = ingest.expand(item=ready(scanned))
    summary = report(scanned, results)
    purge_trash(summary=summary)


seedance_checkpoints()
