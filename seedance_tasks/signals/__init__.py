"""signals pipeline."""
