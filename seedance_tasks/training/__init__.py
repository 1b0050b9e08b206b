"""training pipeline."""
