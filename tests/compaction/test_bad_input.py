"""Odd but legal input never crashes compaction: exact rows, or the partition skipped with a reason.

Zero-row files, categoricals, out-of-range timestamp promotions, nested types, decimals, time
zones, a full disk, paths near PATH_MAX, a missing dataset and a zero target size; then random
Arrow schemas and values (hypothesis).
"""

from __future__ import annotations

import datetime
import decimal
import errno
import json
import os
import shutil
import subprocess
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from seedance_tasks import journal, storage
from seedance_tasks.cli import app
from seedance_tasks.compaction.run import compact_dataset
from seedance_tasks.compaction.sample import make_sample_lake
from seedance_tasks.errors import ConfigError, InputError, ResourceError

from .conftest import lake_digest, table_rows, visible_data_files

runner = CliRunner()


def _write(path, table: pa.Table, **kwargs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **kwargs)
    old = os.path.getmtime(path) - 7200
    os.utime(path, (old, old))


def _partition_rows(directory) -> list[str]:
    """Every row of the visible Parquet files of one directory, canonical, with missing columns null."""
    tables = [pq.read_table(directory / name) for name in sorted(os.listdir(directory))
              if not name.startswith((".", "_")) and name.endswith(".parquet")]
    columns = sorted({name for table in tables for name in table.column_names})
    return sorted(row for table in tables for row in table_rows(table, columns))


def _assert_compacted_exactly_or_skipped(lake, report, before: dict[str, list[str]], files_before):
    """Each partition: compacted with exactly its rows, or skipped with a reason and untouched."""
    skipped = {item["partition"]: item["reason"] for item in report["skipped"]}
    compacted = {item["partition"] for item in report["partitions"]}
    for partition, rows in before.items():
        assert _partition_rows(lake / partition) == rows, f"{partition}: rows changed"
        if partition in compacted:
            assert len([f for f in visible_data_files(lake) if f.startswith(partition + "/")]) == 1
        else:
            assert skipped.get(partition), f"{partition}: neither compacted nor skipped with a reason"
            assert [f for f in visible_data_files(lake) if f.startswith(partition + "/")] == files_before[partition]
    assert journal.pending(storage.resolve(lake)) == []


def _snapshot(lake) -> tuple[dict, dict]:
    partitions = sorted({os.path.dirname(f) for f in visible_data_files(lake)})
    rows = {p: _partition_rows(lake / p) for p in partitions}
    files = {p: [f for f in visible_data_files(lake) if f.startswith(p + "/")] for p in partitions}
    return rows, files


# --------------------------------------------------------------------------- zero rows


@pytest.mark.parametrize("target", ["16KiB", "64KiB", "512KiB"])
def test_zero_row_files_among_others_at_any_target_size(tmp_path, small_settings, target):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=4, rows_per_file=60)
    empty = pq.read_table(lake / "date=2026-11-01" / "part-00000.parquet").slice(0, 0)
    for name in ("part-00002a.parquet", "part-99999.parquet"):  # between the others, and last
        _write(lake / "date=2026-11-01" / name, empty)
    digest = lake_digest(lake)
    size = storage_size(target)
    report = compact_dataset(str(lake), small_settings.model_copy(
        update={"target_file_size": size, "small_file_size": size, "row_group_size": min(size, 64 * 1024)}))
    assert report["partitions_compacted"] == 1 and report["files_before"] == 6
    assert report["rows"] == 240 and lake_digest(lake) == digest


def storage_size(text: str) -> int:
    from seedance_tasks.units import parse_size

    return parse_size(text)


def test_a_partition_of_only_zero_row_files(tmp_path, small_settings):
    lake = tmp_path / "lake"
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    for name in ("a", "b", "c"):
        _write(lake / "p=empty" / f"{name}.parquet", schema.empty_table())
    _write(lake / "p=full" / "a.parquet", pa.table({"id": [1, 2], "name": ["x", "y"]}, schema=schema))
    _write(lake / "p=full" / "b.parquet", pa.table({"id": [3], "name": ["z"]}, schema=schema))
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 2 and report["rows"] == 3
    [left] = [f for f in visible_data_files(lake) if f.startswith("p=empty/")]
    kept = pq.read_table(lake / left)
    assert kept.num_rows == 0 and kept.schema.equals(schema)  # the schema stays visible


# --------------------------------------------------------------------------- types


def test_dictionary_column_is_compacted_exactly_and_stays_categorical(tmp_path, small_settings):
    lake = tmp_path / "lake"
    for index, words in enumerate((["a", "b", "a", None], ["c", "a"], ["b"])):
        table = pa.table({"id": list(range(index * 10, index * 10 + len(words))),
                          "kind": pa.array(words).dictionary_encode()})
        _write(lake / "p=1" / f"f{index}.parquet", table)
    before, files = _snapshot(lake)
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1, report["skipped"]
    _assert_compacted_exactly_or_skipped(lake, report, before, files)
    [output] = visible_data_files(lake)
    assert pa.types.is_dictionary(pq.read_schema(lake / output).field("kind").type)


def test_few_valued_dates_prices_and_floats_get_a_dictionary_and_stay_bit_exact(tmp_path, small_settings):
    import numpy as np

    lake = tmp_path / "lake"
    rng = np.random.default_rng(5)
    special = np.array([0.0, -0.0, np.nan, 1.5, -np.inf], dtype=np.float64)
    special[2] = np.frombuffer(np.uint64(0x7FF8000000000001).tobytes(), np.float64)[0]  # a NaN with a payload
    for index in range(3):
        rows = 3_000
        table = pa.table({
            "shipped": pa.array(np.datetime64("2026-01-01") + rng.integers(0, 30, rows).astype("timedelta64[D]")),
            "price": pa.array([decimal.Decimal(f"{v}.25") for v in rng.integers(0, 20, rows)], pa.decimal128(9, 2)),
            "weight": pa.array(special[rng.integers(0, len(special), rows)]),
            "at": pa.array(np.arange(index * rows, (index + 1) * rows, dtype="int64") * 10**9, pa.timestamp("ns")),
            "ok": pa.array(rng.integers(0, 2, rows).astype(bool)),
        })
        _write(lake / "p=1" / f"f{index}.parquet", table)
    before, files = _snapshot(lake)
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1, report["skipped"]
    _assert_compacted_exactly_or_skipped(lake, report, before, files)
    [output] = visible_data_files(lake)
    meta = pq.read_metadata(lake / output).row_group(0)
    dictionary = {meta.column(i).path_in_schema: meta.column(i).has_dictionary_page for i in range(meta.num_columns)}
    assert dictionary == {"shipped": True, "price": True, "weight": True, "at": False, "ok": False}
    weights = pq.read_table(lake / output).column("weight").to_numpy()
    sources = np.concatenate([pq.read_table(f).column("weight").to_numpy() for f in sorted((lake / "_seedance").rglob("f*.parquet"))])
    assert weights.view(np.uint64).tolist() == sources.view(np.uint64).tolist()  # signed zeros and NaN payloads kept


def test_millisecond_timestamps_beyond_the_nanosecond_range_skip_the_partition(tmp_path, small_settings):
    lake = tmp_path / "lake"
    far = datetime.datetime(3000, 1, 1)
    _write(lake / "p=1" / "ms.parquet", pa.table({"ts": pa.array([far], pa.timestamp("ms"))}))
    _write(lake / "p=1" / "ns.parquet", pa.table({"ts": pa.array([datetime.datetime(2026, 1, 1)], pa.timestamp("ns"))}),
           coerce_timestamps=None)
    make_sample_lake(str(lake), partitions=1, files_per_partition=2, rows_per_file=100)
    before, files = _snapshot(lake)
    report = compact_dataset(str(lake), small_settings)
    [skip] = [item for item in report["skipped"] if item["partition"] == "p=1"]
    assert "ms.parquet" in skip["reason"] and "out of bounds" in skip["reason"]
    assert report["partitions_compacted"] == 1  # the rest of the lake goes on
    _assert_compacted_exactly_or_skipped(lake, report, before, files)
    assert not list((lake / "_seedance" / "quarantine").glob("**/*.parquet"))  # the file is fine: not quarantined


NESTED_AND_EXACT = {
    "list": (pa.list_(pa.int32()), [[1, 2], None, [], [3]]),
    "large_list": (pa.large_list(pa.string()), [["a"], None, ["b", None]]),
    "struct": (pa.struct([("x", pa.int64()), ("y", pa.string())]), [{"x": 1, "y": "a"}, None, {"x": None, "y": "b"}]),
    "map": (pa.map_(pa.string(), pa.int64()), [[("k", 1), ("l", 2)], None, []]),
    "decimal": (pa.decimal128(20, 4), [decimal.Decimal("1.2345"), None, decimal.Decimal("-99999.0001")]),
    "decimal256": (pa.decimal256(50, 10), [decimal.Decimal("1.0000000001"), None]),
    "timestamp_tz": (pa.timestamp("us", tz="Asia/Tokyo"),
                     [datetime.datetime(2026, 1, 1, 9, tzinfo=datetime.UTC), None]),
    "nested": (pa.list_(pa.struct([("a", pa.list_(pa.int8())), ("m", pa.map_(pa.string(), pa.float64()))])),
               [[{"a": [1, None], "m": [("x", 1.5)]}], None, [None]]),
}


@pytest.mark.parametrize("kind", sorted(NESTED_AND_EXACT))
def test_nested_decimal_and_time_zone_columns_are_compacted_exactly(tmp_path, small_settings, kind):
    lake = tmp_path / "lake"
    type_, values = NESTED_AND_EXACT[kind]
    for index in range(3):
        _write(lake / "p=1" / f"f{index}.parquet", pa.table({"id": list(range(len(values))),
                                                            "v": pa.array(values, type_)}))
    before, files = _snapshot(lake)
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1, report["skipped"]
    _assert_compacted_exactly_or_skipped(lake, report, before, files)
    assert pq.read_schema(lake / visible_data_files(lake)[0]).field("v").type == type_


@pytest.mark.parametrize(("first", "second"), [
    (pa.struct([("x", pa.int64())]), pa.struct([("x", pa.int64()), ("y", pa.string())])),
    (pa.timestamp("us", tz="UTC"), pa.timestamp("us", tz="Asia/Tokyo")),
    (pa.decimal128(5, 2), pa.decimal128(7, 3)),
    (pa.list_(pa.int32()), pa.list_(pa.int64())),
])
def test_differing_types_across_files_compact_exactly_or_skip_with_a_reason(tmp_path, small_settings, first, second):
    lake = tmp_path / "lake"
    sample = {pa.types.is_struct: [{"x": 1}], pa.types.is_timestamp: [datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)],
              pa.types.is_decimal: [decimal.Decimal("1.25")], pa.types.is_list: [[1, 2]]}
    values = next(v for test, v in sample.items() if test(first))
    _write(lake / "p=1" / "a.parquet", pa.table({"v": pa.array(values, first)}))
    _write(lake / "p=1" / "b.parquet", pa.table({"v": pa.array(values, second)}))
    before, files = _snapshot(lake)
    report = compact_dataset(str(lake), small_settings)
    _assert_compacted_exactly_or_skipped(lake, report, before, files)


# --------------------------------------------------------------------------- disk full


@pytest.fixture
def tiny_disk(tmp_path):
    """A 3 MiB tmpfs (needs root: mount), removed afterwards."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}); ENOSPC needs a full disk")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_disk_full_is_a_clear_error_and_the_next_run_recovers(tiny_disk, small_settings):
    lake = tiny_disk / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=4, rows_per_file=1_000)
    digest = lake_digest(lake)
    filler = tiny_disk / "filler"
    free = shutil.disk_usage(tiny_disk).free
    with open(filler, "wb") as handle:  # leave room for the journal, not for the new file
        try:
            handle.write(b"\0" * max(free - 96 * 1024, 0))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    with pytest.raises(ResourceError) as full:
        compact_dataset(str(lake), small_settings)
    assert "no space left" in full.value.message and "date=2026-11-01" in full.value.message and full.value.hint
    staged = [p for p in lake.rglob(".seedance-*")]
    assert staged == []  # removed, not moved to the trash where it would keep the disk full
    assert lake_digest(lake) == digest
    result = runner.invoke(app, ["compact", str(lake), "--target-file-size", "512KiB", "--min-age", "0"])
    assert result.exit_code == 6 and "no space left" in result.output and "Traceback" not in result.output
    filler.unlink()
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1 and lake_digest(lake) == digest
    assert journal.pending(storage.resolve(lake)) == []


# --------------------------------------------------------------------------- long paths


def _deep_directory(base, total: int) -> str:
    """A relative directory path of about `total` bytes below `base`, in components of 200."""
    parts, length = [], len(str(base)) + 1
    while length + 201 < total:
        parts.append("d" * 199 + "=x"[:1])
        length += 201
    parts.append("k=" + "v" * max(total - length - 2, 1))
    return "/".join(parts)


def test_paths_near_path_max_skip_the_partition_and_never_jam_the_lake(tmp_path, small_settings):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=3, rows_per_file=200)
    path_max = os.pathconf(str(tmp_path), "PC_PATH_MAX") - 1
    deep = _deep_directory(lake, path_max - 40)  # room for "a.parquet", not for trash or output names
    table = pa.table({"id": [1, 2, 3]})
    for name in ("a.parquet", "b.parquet"):
        _write(lake / deep / name, table)
    before, files = _snapshot(lake)
    for _ in range(2):  # the next run is not jammed either
        report = compact_dataset(str(lake), small_settings)
        [skip] = [item for item in report["skipped"] if item["partition"] == deep]
        assert "too long" in skip["reason"]
        assert journal.pending(storage.resolve(lake)) == []
    assert _partition_rows(lake / deep) == before[deep]
    assert [f for f in visible_data_files(lake) if f.startswith(deep)] == files[deep]


def test_long_partition_names_that_fit_are_compacted(tmp_path, small_settings):
    lake = tmp_path / "lake"
    path_max = os.pathconf(str(tmp_path), "PC_PATH_MAX") - 1
    deep = _deep_directory(lake, path_max - 140)  # output, staging and trash names all fit
    for name in ("a.parquet", "b.parquet"):
        _write(lake / deep / name, pa.table({"id": [1, 2, 3]}))
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1, report["skipped"]
    assert report["rows"] == 6


# --------------------------------------------------------------------------- refused arguments


def test_a_missing_dataset_is_refused(tmp_path, small_settings):
    with pytest.raises(InputError) as missing:
        compact_dataset(str(tmp_path / "no-such-lake"), small_settings)
    assert "no-such-lake" in missing.value.message and missing.value.hint
    result = runner.invoke(app, ["compact", str(tmp_path / "no-such-lake")])
    assert result.exit_code != 0 and "no such dataset" in result.output and "hint:" in result.output
    assert not (tmp_path / "no-such-lake").exists()


def test_a_missing_bucket_is_refused(s3_server, small_settings):
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    with pytest.raises(InputError) as missing:
        compact_dataset(f"s3://{bucket}/lake", small_settings)
    assert bucket in missing.value.message and "bucket" in missing.value.message


def test_an_empty_prefix_is_refused(s3_bucket, small_settings):
    with pytest.raises(InputError) as missing:
        compact_dataset(f"s3://{s3_bucket}/typo", small_settings)
    assert "typo" in missing.value.message


@pytest.mark.parametrize("option", ["--target-file-size", "--small-file-size"])
def test_a_zero_size_is_refused(lake, option):
    result = runner.invoke(app, ["compact", str(lake), option, "0", "--json"])
    assert result.exit_code == 2 and "positive size" in result.output and "hint:" in result.output
    assert not (lake / "_seedance").exists()
    from seedance_tasks.config import load_settings, settings_with

    with pytest.raises(ConfigError):
        settings_with(load_settings(), "compaction", target_file_size=0)


# --------------------------------------------------------------------------- random schemas


_TZ = st.sampled_from([None, "UTC", "Asia/Tokyo", "+05:30"])
_SCALARS = {
    "int8": (pa.int8(), st.integers(-128, 127)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "uint32": (pa.uint32(), st.integers(0, 2**32 - 1)),
    "float32": (pa.float32(), st.floats(width=32, allow_nan=False)),
    "float64": (pa.float64(), st.floats(allow_nan=True)),
    "bool": (pa.bool_(), st.booleans()),
    "string": (pa.string(), st.text(max_size=8)),
    "large_string": (pa.large_string(), st.text(max_size=8)),
    "binary": (pa.binary(), st.binary(max_size=8)),
    "date32": (pa.date32(), st.dates()),
    "decimal": (pa.decimal128(12, 3), st.decimals(min_value=-10**8, max_value=10**8, places=3, allow_nan=False)),
}


@st.composite
def _column_type(draw, depth: int = 0):
    choice = draw(st.sampled_from(
        ["scalar", "timestamp", "dictionary"] + (["list", "struct", "map"] if depth < 2 else [])))
    if choice == "scalar":
        return _SCALARS[draw(st.sampled_from(sorted(_SCALARS)))]
    if choice == "timestamp":
        type_ = pa.timestamp(draw(st.sampled_from(["s", "ms", "us", "ns"])), tz=draw(_TZ))
        moments = st.datetimes(min_value=datetime.datetime(1970, 1, 1), max_value=datetime.datetime(2200, 1, 1))
        if type_.tz is not None:
            moments = moments.map(lambda moment: moment.replace(tzinfo=datetime.UTC))
        if type_.unit == "s":
            moments = moments.map(lambda moment: moment.replace(microsecond=0))
        elif type_.unit == "ms":
            moments = moments.map(lambda moment: moment.replace(microsecond=moment.microsecond // 1000 * 1000))
        return type_, moments
    if choice == "dictionary":
        return pa.dictionary(pa.int32(), pa.string()), st.sampled_from(["red", "green", "blue", ""])
    if choice == "list":
        inner, values = draw(_column_type(depth + 1))
        return pa.list_(inner), st.lists(st.none() | values, max_size=3)
    if choice == "struct":
        fields = draw(st.lists(_column_type(depth + 1), min_size=1, max_size=3))
        type_ = pa.struct([(f"f{i}", inner) for i, (inner, _) in enumerate(fields)])
        return type_, st.fixed_dictionaries({f"f{i}": st.none() | values for i, (_, values) in enumerate(fields)})
    _, key_values = _SCALARS["string"]
    inner, values = draw(_column_type(depth + 1))
    return pa.map_(pa.string(), inner), st.lists(st.tuples(key_values, st.none() | values), max_size=3)


@st.composite
def _partition_files(draw):
    """2-3 files of one partition: one random schema (each file may lack some columns), random
    rows (zero rows allowed, nulls)."""
    columns = draw(st.lists(_column_type(), min_size=1, max_size=4))
    schema = pa.schema([(f"c{i}", type_) for i, (type_, _) in enumerate(columns)])
    files = []
    for _ in range(draw(st.integers(2, 3))):
        rows = draw(st.integers(0, 6))
        data = {}
        for i, (type_, values) in enumerate(columns):
            cells = draw(st.lists(st.none() | values, min_size=rows, max_size=rows))
            data[f"c{i}"] = pa.array(cells, type=type_)
        table = pa.table(data, schema=schema)
        dropped = draw(st.sets(st.sampled_from(schema.names), max_size=len(schema.names) - 1))
        files.append(table.drop_columns(sorted(dropped)))  # a column some files lack becomes nullable
    return files


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(files=_partition_files())
def test_random_arrow_schemas_compact_exactly_or_skip_with_a_reason(tmp_path, small_settings, files):
    lake = tmp_path / f"lake-{uuid.uuid4().hex[:8]}"
    for index, table in enumerate(files):
        _write(lake / "p=1" / f"f{index}.parquet", table)
    before, listed = _snapshot(lake)
    report = compact_dataset(str(lake), small_settings)
    _assert_compacted_exactly_or_skipped(lake, report, before, listed)
    assert json.dumps(report, default=str)
    shutil.rmtree(lake)


def test_the_human_report_shows_names_and_types_as_they_are_not_as_console_markup(tmp_path):
    """'[bold]' in a partition or file name, or 'timestamp[us]' in a reason, is text to show."""
    lake = tmp_path / "lake"
    part = lake / "p=[bold]x"
    part.mkdir(parents=True)
    pq.write_table(pa.table({"a": [1]}), part / "a.parquet")
    pq.write_table(pa.table({"a": [2]}), part / "b.parquet")
    (part / "[red]bad.parquet").write_bytes(b"nope")
    drift = lake / "p=t"
    drift.mkdir()
    pq.write_table(pa.table({"t": pa.array([1], pa.time32("ms"))}), drift / "a.parquet")
    pq.write_table(pa.table({"t": pa.array(["x"])}), drift / "b.parquet")
    result = CliRunner().invoke(app, ["compact", str(lake), "--min-age", "0"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "quarantined p=[bold]x/[red]bad.parquet" in result.output
    assert "skipped p=t:" in result.output and "time32[ms]" in result.output
