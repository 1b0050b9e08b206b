"""cost pipeline."""
