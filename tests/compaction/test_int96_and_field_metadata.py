"""Legacy INT96 timestamps (Spark/Hive/Impala) and field-level metadata: compacted exactly, or the
partition skipped with a reason naming the file and the column; never a wrapped value."""

from __future__ import annotations

import datetime
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seedance_tasks.compaction.run import compact_dataset

from .conftest import visible_data_files

FAR = [datetime.datetime(9999, 12, 31), datetime.datetime(1, 1, 1), datetime.datetime(2026, 1, 1), None]
SUB_MICRO = [1_700_000_000_123_456_789, -5, None]  # nanoseconds since 1970, in range, not whole microseconds


def _write(path, table: pa.Table, *, int96: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, use_deprecated_int96_timestamps=int96, coerce_timestamps=None)
    old = os.path.getmtime(path) - 7200
    os.utime(path, (old, old))


def _read_back(lake, column: str) -> tuple[pa.DataType, list]:
    """The type and sorted integer values (in the column's unit) of `column` in the one output file."""
    [output] = visible_data_files(lake)
    table = pq.read_table(lake / output, coerce_int96_timestamp_unit="us")
    values = table.column(column).cast(pa.int64()).to_pylist()
    return table.schema.field(column).type, sorted(values, key=lambda v: (v is None, v or 0))


def _physical_types(path) -> set[str]:
    schema = pq.ParquetFile(path).metadata.schema
    return {schema.column(i).physical_type for i in range(len(schema))}


def test_int96_sentinels_beyond_the_nanosecond_range_are_compacted_exactly(tmp_path, small_settings):
    lake = tmp_path / "lake"
    table = pa.table({"t": pa.array(FAR, pa.timestamp("us")), "id": [1, 2, 3, 4]})
    _write(lake / "k=1" / "a.parquet", table, int96=True)
    _write(lake / "k=1" / "b.parquet", table.slice(2), int96=True)
    expected = sorted(
        pq.read_table(lake / "k=1" / "a.parquet", coerce_int96_timestamp_unit="us").column("t").to_pylist()
        + pq.read_table(lake / "k=1" / "b.parquet", coerce_int96_timestamp_unit="us").column("t").to_pylist(),
        key=lambda v: (v is None, v or datetime.datetime.min))
    assert expected[0] == datetime.datetime(1, 1, 1) and datetime.datetime(9999, 12, 31) in expected
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1, report["skipped"]
    [output] = visible_data_files(lake)
    back = pq.read_table(lake / output, coerce_int96_timestamp_unit="us")
    assert back.schema.field("t").type == pa.timestamp("us")  # modern INT64 microseconds, not INT96
    assert "INT96" not in _physical_types(lake / output)
    assert sorted(back.column("t").to_pylist(), key=lambda v: (v is None, v or datetime.datetime.min)) == expected


def test_int96_nanosecond_digits_are_kept(tmp_path, small_settings):
    """Impala writes INT96 with nanoseconds: in range, they stay nanoseconds, exactly."""
    lake = tmp_path / "lake"
    table = pa.table({"t": pa.array(SUB_MICRO, pa.timestamp("ns"))})
    _write(lake / "k=1" / "a.parquet", table, int96=True)
    _write(lake / "k=1" / "b.parquet", table, int96=True)
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1, report["skipped"]
    kind, values = _read_back(lake, "t")
    assert kind == pa.timestamp("ns")
    assert values == sorted(SUB_MICRO[:2] * 2) + [None, None]


def test_int96_in_structs_lists_and_maps_is_compacted_exactly(tmp_path, small_settings):
    lake = tmp_path / "lake"
    far, old = datetime.datetime(9999, 12, 31, 23, 59, 59, 999999), datetime.datetime(1, 1, 1)
    table = pa.table({
        "s": pa.array([{"a": far, "b": 5}], pa.struct([("a", pa.timestamp("us")), ("b", pa.int64())])),
        "l": pa.array([[old, None]], pa.list_(pa.timestamp("us"))),
        "m": pa.array([[("k", far)]], pa.map_(pa.string(), pa.timestamp("us"))),
    })
    for name in ("a", "b"):
        _write(lake / "k=1" / f"{name}.parquet", table, int96=True)
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1, report["skipped"]
    [output] = visible_data_files(lake)
    assert pq.read_table(lake / output).to_pylist() == table.to_pylist() * 2


def test_int96_sentinels_beside_nanosecond_files_skip_the_partition(tmp_path, small_settings):
    """The unified type is the finer one (ns), which cannot hold 9999-12-31: skipped, named, untouched."""
    lake = tmp_path / "lake"
    _write(lake / "k=1" / "legacy.parquet", pa.table({"t": pa.array(FAR, pa.timestamp("us"))}), int96=True)
    _write(lake / "k=1" / "new.parquet", pa.table({"t": pa.array(SUB_MICRO, pa.timestamp("ns"))}), int96=False)
    files = visible_data_files(lake)
    report = compact_dataset(str(lake), small_settings)
    [skip] = report["skipped"]
    assert report["partitions_compacted"] == 0 and "legacy.parquet" in skip["reason"]
    assert "out of bounds" in skip["reason"]
    assert visible_data_files(lake) == files
    assert not (lake / "_seedance" / "trash").exists() and not (lake / "_seedance" / "quarantine").exists()


def test_int96_needing_both_nanoseconds_and_a_wider_range_skips_the_partition(tmp_path, small_settings):
    lake = tmp_path / "lake"
    table = pa.table({"fine": pa.array(SUB_MICRO + [None], pa.timestamp("ns")),
                      "wide": pa.array(FAR, pa.timestamp("us"))})
    _write(lake / "k=1" / "a.parquet", table, int96=True)
    _write(lake / "k=1" / "b.parquet", table, int96=True)
    files = visible_data_files(lake)
    report = compact_dataset(str(lake), small_settings)
    [skip] = report["skipped"]
    assert report["partitions_compacted"] == 0
    assert "a.parquet" in skip["reason"] and "'fine'" in skip["reason"] and "'wide'" in skip["reason"]
    assert visible_data_files(lake) == files


# --------------------------------------------------------------------------- field-level metadata


def _with_field_metadata(metadata: dict | None, value: int) -> pa.Table:
    schema = pa.schema([pa.field("x", pa.int64(), metadata=metadata),
                        pa.field("s", pa.struct([pa.field("c", pa.int32(), metadata={"unit": "m"})]))])
    return pa.table({"x": [value], "s": [{"c": value}]}, schema=schema)


def test_field_metadata_the_files_agree_on_is_kept(tmp_path, small_settings):
    lake = tmp_path / "lake"
    for index in range(2):
        _write(lake / "k=1" / f"f{index}.parquet", _with_field_metadata({"unit": "ms"}, index), int96=False)
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1, report["skipped"]
    [output] = visible_data_files(lake)
    schema = pq.read_schema(lake / output)
    assert schema.field("x").metadata == {b"unit": b"ms"}
    assert schema.field("s").type.field("c").metadata == {b"unit": b"m"}


@pytest.mark.parametrize("second, nested, expected", [
    ({"unit": "s"}, {"unit": "m"}, "column 'x': field metadata 'unit' differs"),
    (None, {"unit": "m"}, "(k=1/f1.parquet has none)"),
    ({"unit": "ms"}, {"unit": "km"}, "column 's.c': field metadata 'unit' differs"),
])
def test_field_metadata_the_files_disagree_on_skips_the_partition(tmp_path, small_settings, second, nested, expected):
    lake = tmp_path / "lake"
    _write(lake / "k=1" / "f0.parquet", _with_field_metadata({"unit": "ms"}, 0), int96=False)
    other = pa.schema([pa.field("x", pa.int64(), metadata=second),
                       pa.field("s", pa.struct([pa.field("c", pa.int32(), metadata=nested)]))])
    _write(lake / "k=1" / "f1.parquet", pa.table({"x": [1], "s": [{"c": 1}]}, schema=other), int96=False)
    files = visible_data_files(lake)
    report = compact_dataset(str(lake), small_settings)
    [skip] = report["skipped"]
    assert report["partitions_compacted"] == 0 and expected in skip["reason"], skip
    assert "k=1/f0.parquet" in skip["reason"] and "k=1/f1.parquet" in skip["reason"]
    assert visible_data_files(lake) == files
