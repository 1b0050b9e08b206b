"""The checkpoint pipeline's Assets, defined once (cheap to import: DAG files use them).

A trainer announces a raw checkpoint on `CHECKPOINT_INBOX` (docs/checkpoints.md); the checkpoint
DAG (and a training run) emit `CHECKPOINT_STORE` when steps are stored, which the lifecycle DAG
consumes.
"""

from __future__ import annotations

from airflow.sdk import Asset

CHECKPOINT_INBOX = Asset(name="seedance_checkpoint_inbox", uri="seedance://checkpoints/inbox")
CHECKPOINT_STORE = Asset(name="seedance_checkpoint_store", uri="seedance://checkpoints/store")
