import json
import os
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.compaction.run import compact_dataset
from seedance_tasks.compaction.sample import event_table, make_sample_lake
from seedance_tasks.errors import RefusedError

from .conftest import read_lake, visible_data_files

runner = CliRunner()


def test_compaction_keeps_every_row_and_hits_the_target_size(lake, small_settings):
    before = read_lake(lake)
    report = compact_dataset(str(lake), small_settings)
    after = read_lake(lake)
    assert after.equals(before)
    assert report["partitions_compacted"] == 3 and report["files_before"] == 18
    assert report["rows"] == before.num_rows
    files = visible_data_files(lake)
    assert len(files) == report["files_after"] < 18
    sizes = [os.path.getsize(lake / f) for f in files]
    target = small_settings.target_file_size
    assert max(sizes) <= target * 1.10, sizes
    full = [s for s in sizes if s >= 0.5 * target]
    assert full and all(s >= 0.8 * target for s in full), sizes
    trash = lake / "_seedance" / "trash" / report["run_id"]
    assert sorted(p.name for p in trash.rglob("*.parquet")) == sorted(f"part-{i:05d}.parquet" for i in range(6) for _ in range(3))


def test_second_run_changes_nothing(lake, small_settings):
    compact_dataset(str(lake), small_settings)
    files = {f: os.path.getmtime(lake / f) for f in visible_data_files(lake)}
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 0 and report["files_before"] == 0
    assert {f: os.path.getmtime(lake / f) for f in visible_data_files(lake)} == files


def test_sources_larger_than_a_row_group_still_fill_files_and_the_next_run_converges(lake, small_settings):
    """Whole source files arriving as one table (row groups as big as the default) are cut to fit:
    every file but the last of a partition is full, so the next run finds nothing to compact."""
    settings = small_settings.model_copy(update={"row_group_size": 128 * 1024 * 1024})
    before = read_lake(lake)
    compact_dataset(str(lake), settings)
    target = settings.target_file_size
    for partition in ("date=2026-11-01", "date=2026-11-02", "date=2026-11-03"):
        sizes = sorted(os.path.getsize(lake / f) for f in visible_data_files(lake) if f.startswith(partition))
        assert len(sizes) >= 2 and all(0.9 * target <= s <= 1.05 * target for s in sizes[1:]), sizes
    files = {f: os.path.getmtime(lake / f) for f in visible_data_files(lake)}
    assert compact_dataset(str(lake), settings)["partitions_compacted"] == 0
    assert {f: os.path.getmtime(lake / f) for f in visible_data_files(lake)} == files
    assert read_lake(lake).equals(before)


def test_small_files_that_would_stay_as_many_files_are_left_alone(tmp_path, small_settings):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=2, rows_per_file=1_500)
    sizes = [os.path.getsize(lake / f) for f in visible_data_files(lake)]
    target = int(max(sizes) * 1.8)  # each file smaller than the target, the two together larger
    settings = small_settings.model_copy(update={"target_file_size": target, "small_file_size": target})
    files = {f: os.path.getmtime(lake / f) for f in visible_data_files(lake)}
    report = compact_dataset(str(lake), settings)
    assert report["partitions_compacted"] == 0
    assert report["skipped"] == [{"partition": "date=2026-11-01", "reason": "2 small files would stay 2 files at the target size"}]
    assert {f: os.path.getmtime(lake / f) for f in visible_data_files(lake)} == files
    three = tmp_path / "three"  # three such files do become fewer: compacted
    make_sample_lake(str(three), partitions=1, files_per_partition=3, rows_per_file=1_500)
    assert compact_dataset(str(three), settings)["partitions_compacted"] == 1


def test_output_uses_zstd_and_dictionary_only_on_low_cardinality(lake, small_settings):
    compact_dataset(str(lake), small_settings)
    meta = pq.read_metadata(lake / visible_data_files(lake)[0])
    columns = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i) for i in range(meta.num_columns)}
    assert columns["event_type"].compression == "ZSTD"
    assert columns["event_type"].has_dictionary_page
    assert not columns["query"].has_dictionary_page


def test_hidden_files_young_files_and_other_formats_stay(tmp_path, small_settings):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=4, rows_per_file=500)
    part = lake / "date=2026-11-01"
    (part / "_SUCCESS").write_text("")
    (part / ".part-00000.parquet.crc").write_text("crc")
    (part / "notes.json").write_text("{}")
    young = part / "part-young.parquet"
    pq.write_table(event_table(10, __import__("numpy").random.default_rng(1), start_id=10**9), young)
    settings = small_settings.model_copy(update={"min_age": 3600})
    report = compact_dataset(str(lake), settings)
    assert report["files_before"] == 4
    for name in ("_SUCCESS", ".part-00000.parquet.crc", "notes.json", "part-young.parquet"):
        assert (part / name).exists(), name


def test_min_age_skips_partition_with_reason(tmp_path, small_settings):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=3, rows_per_file=200, age_s=0)
    report = compact_dataset(str(lake), small_settings.model_copy(update={"min_age": 3600}))
    assert report["partitions_compacted"] == 0
    assert "younger than the minimum age" in report["skipped"][0]["reason"]


def test_schemas_are_unified_with_safe_promotions(tmp_path, small_settings):
    lake = tmp_path / "lake"
    (lake / "p=1").mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"]}), lake / "p=1/a.parquet")
    pq.write_table(pa.table({"id": pa.array([3], pa.int64()), "extra": [1.5]}), lake / "p=1/b.parquet")
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1
    table = pq.read_table(lake / "p=1" / visible_data_files(lake)[0].split("/")[1]).sort_by("id")
    assert table.schema.field("id").type == pa.int64()
    assert table.column("name").to_pylist() == ["a", "b", None]
    assert table.column("extra").to_pylist() == [None, None, 1.5]


def test_schema_conflict_skips_partition_untouched(tmp_path, small_settings):
    lake = tmp_path / "lake"
    (lake / "p=1").mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64())}), lake / "p=1/a.parquet")
    pq.write_table(pa.table({"id": ["three"]}), lake / "p=1/b.parquet")
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 0
    assert report["skipped"][0]["partition"] == "p=1" and "id" in report["skipped"][0]["reason"]
    assert visible_data_files(lake) == ["p=1/a.parquet", "p=1/b.parquet"]


@pytest.mark.parametrize("damage", ["truncated", "not_parquet"])
def test_unreadable_file_is_quarantined_and_the_rest_compacted(lake, small_settings, damage):
    victim = lake / "date=2026-11-02" / "part-00003.parquet"
    if damage == "truncated":
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    else:
        victim.write_text("id,name\n1,a\n")
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 3
    assert [q["file"] for q in report["quarantined"]] == ["date=2026-11-02/part-00003.parquet"]
    moved = lake / "_seedance" / "quarantine" / report["run_id"] / "date=2026-11-02" / "part-00003.parquet"
    assert moved.exists()
    reason = json.loads(moved.with_name(moved.name + ".reason.json").read_text())
    assert "Parquet" in reason["reason"]
    assert report["rows"] == 17 * 1_500


def test_corrupt_data_page_quarantined_after_partial_write(tmp_path, small_settings):
    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=1, files_per_partition=4, rows_per_file=1_500)
    victim = lake / "date=2026-11-01" / "part-00002.parquet"
    data = bytearray(victim.read_bytes())
    for offset in range(8, len(data) // 2, 97):  # footer intact, pages garbage
        data[offset] ^= 0xFF
    victim.write_bytes(bytes(data))
    report = compact_dataset(str(lake), small_settings)
    assert [q["file"] for q in report["quarantined"]] == ["date=2026-11-01/part-00002.parquet"]
    assert report["rows"] == 4_500
    ids = read_lake(lake).column("event_id").to_pylist()
    assert len(ids) == len(set(ids)) == 4_500
    assert not [p for p in lake.rglob(".seedance-*") if "_seedance" not in p.parts]


@pytest.mark.parametrize(
    ("marker", "name"),
    [("_delta_log/00000000000000000000.json", "Delta Lake"), ("metadata/v1.metadata.json", "Iceberg"),
     (".hoodie/hoodie.properties", "Hudi")],
)
def test_table_formats_are_refused_and_left_untouched(lake, small_settings, marker, name):
    (lake / marker).parent.mkdir(parents=True, exist_ok=True)
    (lake / marker).write_text("{}")
    before = visible_data_files(lake)
    with pytest.raises(RefusedError) as info:
        compact_dataset(str(lake), small_settings)
    assert name in info.value.message and info.value.hint
    assert visible_data_files(lake) == before
    result = runner.invoke(app, ["compact", str(lake), "--min-age", "0"])
    assert result.exit_code != 0 and name in result.output


def test_dry_run_changes_nothing(lake, small_settings):
    before = {f: os.path.getmtime(lake / f) for f in visible_data_files(lake)}
    report = compact_dataset(str(lake), small_settings, dry_run=True)
    assert report["dry_run"] and report["partitions_compacted"] == 3 and report["files_before"] == 18
    assert {f: os.path.getmtime(lake / f) for f in visible_data_files(lake)} == before
    assert not (lake / "_seedance").exists()


def test_cli_json_report_has_every_field(lake):
    result = runner.invoke(
        app, ["compact", str(lake), "--target-file-size", "512KiB", "--min-age", "0", "--workers", "1", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for key in ("run_id", "partitions_compacted", "skipped", "files_before", "files_after", "bytes_before",
                "bytes_after", "rows", "quarantined", "estimated_monthly_saving"):
        assert key in report, key
    assert report["estimated_monthly_saving"]["s3_requests"] == (18 - report["files_after"]) * 60
    assert report["rows"] == 18 * 1_500


def test_cli_bad_size_says_what_to_do(lake):
    result = runner.invoke(app, ["compact", str(lake), "--target-file-size", "huge"])
    assert result.exit_code == 2
    assert "not a size" in result.output


def test_trash_purge_cli(lake, small_settings):
    report = compact_dataset(str(lake), small_settings)
    keep = runner.invoke(app, ["trash", "purge", str(lake), "--older-than", "7d", "--json"])
    assert json.loads(keep.stdout)["purged"] == []
    purge = runner.invoke(app, ["trash", "purge", str(lake), "--older-than", "0", "--json"])
    purged = json.loads(purge.stdout)
    assert purged["purged"] == [report["run_id"]] and purged["files"] == 18
    assert not (lake / "_seedance" / "trash" / report["run_id"]).exists()
    assert read_lake(lake).num_rows == 18 * 1_500


def test_parallel_workers_give_the_same_rows(lake, small_settings):
    before = read_lake(lake)
    compact_dataset(str(lake), small_settings.model_copy(update={"workers": 2}))
    assert read_lake(lake).equals(before)


def test_compaction_on_s3(s3_bucket, small_settings):
    uri = f"s3://{s3_bucket}/lake"
    make_sample_lake(uri, partitions=2, files_per_partition=4, rows_per_file=1_000)
    report = compact_dataset(uri, small_settings)
    assert report["partitions_compacted"] == 2 and report["rows"] == 8_000
    import pyarrow.dataset as ds

    from seedance_tasks import storage

    root = storage.resolve(uri)
    table = ds.dataset(root.path, filesystem=root.fs, format="parquet", partitioning="hive").to_table()
    assert sorted(table.column("event_id").to_pylist()) == list(range(8_000))
    trash = storage.list_files(root.child("_seedance/trash", report["run_id"]), include_hidden=True)
    assert len(trash) == 8
    assert compact_dataset(uri, small_settings)["partitions_compacted"] == 0


def test_old_trash_purged_not_new(lake, small_settings):
    from seedance_tasks import storage

    report = compact_dataset(str(lake), small_settings)
    later = datetime.now(UTC) + timedelta(days=8)
    assert storage.purge_trash(storage.resolve(lake), 7 * 86400, now=later)["purged"] == [report["run_id"]]


def test_compaction_runs_on_a_pool_that_keeps_freed_memory_and_restores_the_default():
    """Inside `reusing_memory` pyarrow allocates from jemalloc (where the build has it); nested and
    concurrent uses share the switch; the process's default pool is back afterwards."""
    from seedance_tasks.arrow_memory import reusing_memory

    before = pa.default_memory_pool().backend_name
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow build has no jemalloc")  # pragma: no cover - manylinux wheels have it
    with reusing_memory():
        assert pa.default_memory_pool().backend_name == "jemalloc"
        table = pa.table({"x": list(range(1000))})
        with reusing_memory():
            assert pa.default_memory_pool().backend_name == "jemalloc"
        assert pa.default_memory_pool().backend_name == "jemalloc"  # the inner exit kept it
    assert pa.default_memory_pool().backend_name == before
    assert table.column("x")[999].as_py() == 999  # a buffer from the other pool is still valid


def test_staged_files_have_their_write_back_started_while_they_are_written(lake, small_settings, monkeypatch):
    """So that the fsync before the journal commits waits only for a file's last row groups."""
    from seedance_tasks import storage

    calls = []
    monkeypatch.setattr(storage.os, "posix_fadvise", lambda fd, offset, length, _: calls.append(
        (os.readlink(f"/proc/self/fd/{fd}"), offset, length)))
    monkeypatch.setattr(storage.WriteBack, "STEP", 16 * 1024)
    before = read_lake(lake)
    report = compact_dataset(str(lake), small_settings)
    assert read_lake(lake).equals(before)
    hinted: dict[str, int] = {}
    for path, offset, length in calls:
        assert offset == hinted.get(path, 0), "hints must cover the file from its start, without gaps"
        hinted[path] = offset + length
    assert hinted and all(os.path.basename(path).startswith(".") for path in hinted), "only staged files"
    assert len(hinted) == report["files_after"]


def _two_files(lake, first: pa.Table, second: pa.Table) -> None:
    (lake / "p=1").mkdir(parents=True)
    pq.write_table(first, lake / "p=1/a.parquet")
    pq.write_table(second, lake / "p=1/b.parquet")


def _compacted(lake) -> pa.Table:
    (name,) = visible_data_files(lake)
    return pq.read_table(lake / name)


@pytest.mark.parametrize(("first", "second", "expected", "plain"), [
    (pa.array([1], pa.time32("ms")), pa.array([2], pa.time64("us")), pa.time64("us"), pa.time64("us")),
    (pa.array(["x"]).dictionary_encode().cast(pa.dictionary(pa.int8(), pa.string())),
     pa.array(["y"]).dictionary_encode(), pa.dictionary(pa.int32(), pa.string()), pa.string()),
    (pa.array(["x"]).dictionary_encode(), pa.array(["y"]), pa.large_string(), pa.string()),
    (pa.array(["x"]), pa.array(["y"], pa.string_view()), pa.large_string(), pa.string()),
    (pa.array([b"x"], pa.binary_view()), pa.array([b"y"], pa.large_binary()), pa.large_binary(), pa.binary()),
], ids=["time32-time64", "dictionary-indices", "dictionary-string", "string-view", "binary-view"])
def test_lossless_type_mixes_are_unified_with_every_value_kept(tmp_path, small_settings, first, second, expected, plain):
    lake = tmp_path / "lake"
    _two_files(lake, pa.table({"k": [1], "c": first}), pa.table({"k": [2], "c": second}))
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1, report["skipped"]
    table = _compacted(lake).sort_by("k")
    assert table.schema.field("c").type == expected
    assert table.column("c").cast(plain).to_pylist() == first.cast(plain).to_pylist() + second.cast(plain).to_pylist()


def test_a_type_conflict_names_the_file_and_the_column(tmp_path, small_settings):
    lake = tmp_path / "lake"
    _two_files(lake, pa.table({"t": pa.array([1], pa.timestamp("us", tz="UTC"))}),
               pa.table({"t": pa.array([1], pa.timestamp("us"))}))
    report = compact_dataset(str(lake), small_settings)
    (skipped,) = report["skipped"]
    assert "column 't'" in skipped["reason"] and "b.parquet" in skipped["reason"] and "a.parquet" in skipped["reason"]
    assert visible_data_files(lake) == ["p=1/a.parquet", "p=1/b.parquet"]


def test_file_metadata_the_files_agree_on_is_kept_and_a_disagreement_skips_the_partition(tmp_path, small_settings):
    geo = b'{"version": "1.1.0", "primary_column": "g", "columns": {"g": {"encoding": "WKB"}}}'
    lake = tmp_path / "lake"
    _two_files(lake, pa.table({"g": [b"\x01"], "a": [1]}).replace_schema_metadata({"geo": geo, "pandas": b"{1}"}),
               pa.table({"g": [b"\x02"], "b": [2.0]}).replace_schema_metadata({"geo": geo, "pandas": b"{2}"}))
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1
    metadata = _compacted(lake).schema.metadata
    assert metadata[b"geo"] == geo and b"pandas" not in metadata  # pandas' describes one file's columns

    other = tmp_path / "other"
    _two_files(other, pa.table({"g": [b"\x01"]}).replace_schema_metadata({"geo": geo}),
               pa.table({"g": [b"\x02"]}).replace_schema_metadata({"geo": geo.replace(b"1.1.0", b"1.0.0")}))
    report = compact_dataset(str(other), small_settings)
    (skipped,) = report["skipped"]
    assert "file metadata 'geo' differs between" in skipped["reason"] and "b.parquet" in skipped["reason"]
    assert visible_data_files(other) == ["p=1/a.parquet", "p=1/b.parquet"]


def test_a_quarantine_reason_names_the_damaged_row_group_not_the_whole_read(tmp_path, small_settings):
    lake = tmp_path / "lake"
    (lake / "p=1").mkdir(parents=True)
    pq.write_table(pa.table({"k": list(range(300))}), lake / "p=1/good.parquet")
    victim = lake / "p=1/bad.parquet"
    pq.write_table(pa.table({"k": list(range(300, 600))}), victim, row_group_size=100, write_page_checksum=True,
                   compression="none", use_dictionary=False)
    data = bytearray(victim.read_bytes())
    data[pq.ParquetFile(victim).metadata.row_group(1).column(0).data_page_offset + 400] ^= 0xFF
    victim.write_bytes(bytes(data))
    report = compact_dataset(str(lake), small_settings)
    (quarantined,) = report["quarantined"]
    assert quarantined["file"] == "p=1/bad.parquet"
    assert quarantined["reason"].startswith("row group 1 of 3 unreadable"), quarantined["reason"]
    assert visible_data_files(lake) == ["p=1/good.parquet"]


def test_options_that_contradict_each_other_are_named_with_a_hint_about_options(lake):
    result = runner.invoke(app, ["compact", str(lake), "--small-file-size", "1GiB", "--target-file-size", "1MiB"])
    assert result.exit_code != 0 and "small_file_size must not exceed target_file_size" in result.output
    assert "''" not in result.output and "--help lists every option" in result.output
