"""Assets through which signals trigger their fixes (cheap to import: DAG files use them).

An event's extra is `{"signal", "date", "apply", "targets": [{"key", "conf"}...]}`: the conf of the
fixing DAG for each new or escalated finding."""

from __future__ import annotations

from airflow.sdk import Asset

SMALL_FILES = Asset(name="seedance_signal_small_files", uri="seedance://signals/small-files")
CHECKPOINT_BLOAT = Asset(name="seedance_signal_checkpoint_bloat", uri="seedance://signals/checkpoint-bloat")
FIX_ASSETS = {"small-files": SMALL_FILES, "checkpoint-bloat": CHECKPOINT_BLOAT}
