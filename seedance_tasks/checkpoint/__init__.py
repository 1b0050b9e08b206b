"""checkpoint pipeline."""
