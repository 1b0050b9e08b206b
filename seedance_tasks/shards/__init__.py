"""shards pipeline."""
