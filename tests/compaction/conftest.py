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


def canonical(value):
    """A value in a form that compares equal exactly when the stored values are equal."""
    import datetime
    import decimal

    if isinstance(value, dict):  # a struct: a field added by schema unification reads as null
        return {str(key): canonical(item) for key, item in sorted(value.items()) if item is not None}
    if isinstance(value, list | tuple):
        return [canonical(item) for item in value]
    if isinstance(value, decimal.Decimal):
        return f"decimal:{value.normalize()}" if value.is_finite() else f"decimal:{value}"
    if isinstance(value, float):
        return f"float:{value!r}"
    if isinstance(value, bytes):
        return f"bytes:{value.hex()}"
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return f"{type(value).__name__}:{value.isoformat()}"
    if isinstance(value, datetime.timedelta):
        return f"timedelta:{value.total_seconds()!r}"
    if value is None or isinstance(value, bool | int | str):
        return value
    return f"{type(value).__name__}:{value!r}"


def table_rows(table: pa.Table, columns=None) -> list[str]:
    """The rows of `table` as canonical JSON strings (missing `columns` as nulls), sorted."""
    import json

    columns = sorted(columns or table.column_names)
    rows = table.to_pylist()
    return sorted(json.dumps([canonical(row.get(name)) for name in columns]) for row in rows)


def row_digest(path, filesystem=None) -> tuple[int, str]:
    """(row count, sha256 of the sorted rows) of every visible Parquet file under `path`: equal
    digests mean the same multiset of rows (nothing lost, nothing duplicated)."""
    import hashlib

    dataset = ds.dataset(str(path), format="parquet", partitioning="hive", filesystem=filesystem)
    rows = table_rows(dataset.to_table())
    return len(rows), hashlib.sha256("\n".join(rows).encode()).hexdigest()


def lake_digest(path, filesystem=None, *, distinct: bool = False) -> tuple[int, str]:
    """(rows, sha256) of a sample lake (rows keyed by `event_id`), fast: sorted by the key, the
    table's bytes hashed, so a lost or duplicated row changes it. With `distinct`, duplicates are
    dropped first (right after a crash a row may be visible twice for a moment, never zero times)."""
    import hashlib

    import pyarrow.compute as pc

    dataset = ds.dataset(str(path), format="parquet", partitioning="hive", filesystem=filesystem)
    table = dataset.to_table()
    table = table.select(sorted(table.column_names)).sort_by("event_id")
    if distinct and table.num_rows:
        ids = table.column("event_id").combine_chunks()
        keep = pc.not_equal(ids[1:], ids[:-1])
        table = table.filter(pa.concat_arrays([pa.array([True]), keep]))
    digest = hashlib.sha256()
    for batch in table.combine_chunks().to_batches():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        digest.update(sink.getvalue())
    return table.num_rows, digest.hexdigest()
