import os

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from seedance_tasks.compaction.sample import make_sample_lake
from seedance_tasks.config import load_settings, settings_with


def read_lake(path) -> pa.Table:
    """Every visible row of the lake (hidden files and _seedance/ skipped, as readers do), sorted."""
    dataset = ds.dataset(str(path), format="parquet", partitioning="hive")
    table = dataset.to_table()
    return table.sort_by("event_id")


def visible_data_files(path) -> list[str]:
    found = []
    for directory, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        found += [os.path.relpath(os.path.join(directory, f), path) for f in files if not f.startswith(("_", "."))]
    return sorted(found)


@pytest.fixture
def small_settings():
    """Compaction settings scaled down to test-sized data: 512 KiB target, 64 KiB row groups."""
    return settings_with(
        load_settings(), "compaction", target_file_size="512KiB", row_group_size="64KiB", min_age="0", workers=1
    )


@pytest.fixture
def lake(tmp_path):
    path = tmp_path / "lake"
    make_sample_lake(str(path), partitions=3, files_per_partition=6, rows_per_file=1_500)
    return path
