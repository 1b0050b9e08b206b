"""preprocess pipeline."""
