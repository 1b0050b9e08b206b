"""Data compaction: a lake's small Parquet files rewritten into files of about a target size."""
