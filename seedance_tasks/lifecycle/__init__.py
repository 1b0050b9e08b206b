"""Checkpoint lifecycle: retention GC and hot/warm/cold tiering over the checkpoint store."""
