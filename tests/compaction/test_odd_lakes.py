"""Odd but legal lakes: column names differing only in case across files, encrypted Parquet,
partition values with spaces, unicode and `=`. Compaction keeps every row readable by every
reader that could read it before, or leaves the files as they are with the reason."""

from __future__ import annotations

import base64
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe
import pytest

from seedance_tasks.compaction.run import compact_dataset

from .conftest import table_rows, visible_data_files


def _write(lake, relative: str, table: pa.Table, **options) -> None:
    path = lake / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **options)


def _rows(lake) -> list[str]:
    return sorted(f"{os.path.dirname(f)}|{row}" for f in visible_data_files(lake)
                  for row in table_rows(pq.read_table(lake / f)))


@pytest.mark.parametrize("first, second", [
    (pa.table({"userId": [1]}), pa.table({"userid": [2]})),
    (pa.table({"s": [{"Ab": 1}]}), pa.table({"s": [{"ab": 2}]})),
])
def test_columns_differing_only_in_case_across_files_skip_the_partition(tmp_path, small_settings, first, second):
    """One file holding both `userId` and `userid` is refused by case-insensitive readers (Spark,
    Hive, Athena) as a duplicate column: compaction must not make one out of two readable files."""
    lake = tmp_path / "lake"
    _write(lake, "p=1/a.parquet", first)
    _write(lake, "p=1/b.parquet", second)
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 0
    [skipped] = report["skipped"]
    assert skipped["partition"] == "p=1" and "differ only in case" in skipped["reason"]
    assert "p=1/a.parquet" in skipped["reason"] and "p=1/b.parquet" in skipped["reason"]
    assert visible_data_files(lake) == ["p=1/a.parquet", "p=1/b.parquet"]


def test_columns_a_file_already_holds_in_both_cases_are_kept(tmp_path, small_settings):
    lake = tmp_path / "lake"
    for index in range(3):
        _write(lake, f"p=1/{index}.parquet", pa.table({"A": [index], "a": [index * 2]}))
    before = _rows(lake)
    assert compact_dataset(str(lake), small_settings)["partitions_compacted"] == 1
    assert _rows(lake) == before and pq.read_schema(lake / visible_data_files(lake)[0]).names == ["A", "a"]


class _Kms(pe.KmsClient):
    """A toy KMS (keys wrapped in base64): enough to write and read Parquet modular encryption."""

    def __init__(self, config):
        super().__init__()

    def wrap_key(self, key_bytes, master_key_identifier):
        return base64.b64encode(key_bytes)

    def unwrap_key(self, wrapped_key, master_key_identifier):
        return base64.b64decode(wrapped_key)


@pytest.mark.parametrize("plaintext_footer", [False, True])
def test_an_encrypted_file_is_left_in_place_not_quarantined(tmp_path, small_settings, plaintext_footer):
    """An encrypted Parquet file is sound: readers with its key still read it. Quarantining it would
    take its rows out of the lake for them; it stays where it is, the rest is compacted."""
    lake = tmp_path / "lake"
    for index in range(3):
        _write(lake, f"p=1/plain{index}.parquet", pa.table({"id": [index]}))
    factory = pe.CryptoFactory(_Kms)
    config = pe.EncryptionConfiguration(footer_key="footer", column_keys={"col": ["id"]},
                                        plaintext_footer=plaintext_footer, double_wrapping=False)
    properties = factory.file_encryption_properties(pe.KmsConnectionConfig(), config)
    with pq.ParquetWriter(lake / "p=1/secret.parquet", pa.schema([("id", pa.int64())]),
                          encryption_properties=properties) as writer:
        writer.write_table(pa.table({"id": [99]}))
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1 and report["rows"] == 3 and report["quarantined"] == []
    assert report["skipped"][0]["partition"] == "p=1/secret.parquet"
    assert "encrypted" in report["skipped"][0]["reason"]
    assert not (lake / "_seedance" / "quarantine").exists()
    decryption = factory.file_decryption_properties(pe.KmsConnectionConfig(), pe.DecryptionConfiguration())
    assert pq.read_table(lake / "p=1/secret.parquet", decryption_properties=decryption).column("id").to_pylist() == [99]
    assert len(visible_data_files(lake)) == 2  # the compacted file and the encrypted one
    again = compact_dataset(str(lake), small_settings)  # converges: nothing rewritten, nothing moved
    assert again["partitions_compacted"] == 0 and again["quarantined"] == [] and len(visible_data_files(lake)) == 2


def test_partition_values_with_spaces_unicode_and_equals_signs(tmp_path, small_settings):
    lake = tmp_path / "lake"
    partitions = ["city=New York", "name=café ☕", "k=a=b", "k=%20x", "k=a b#c?d", "a=1/b=2/c=3/d=4/e=5/f=6"]
    for number, partition in enumerate(partitions):
        for index in range(2):
            _write(lake, f"{partition}/f {index}.parquet", pa.table({"id": [number * 10 + index], "v": ["x"]}))
    before = _rows(lake)
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == len(partitions) and report["skipped"] == []
    assert _rows(lake) == before and len(visible_data_files(lake)) == len(partitions)


def _written_tables(monkeypatch) -> list[int]:
    from seedance_tasks.compaction import writer

    sizes: list[int] = []
    real = writer._RollingWriter.write

    def write(self, table):
        sizes.append(table.num_rows)
        return real(self, table)

    monkeypatch.setattr(writer._RollingWriter, "write", write)
    return sizes


def test_a_huge_row_group_in_a_small_file_is_read_in_batches(tmp_path, small_settings, monkeypatch):
    """A file of a few MB can hold one row group of millions of rows that decodes to gigabytes
    (dictionary-encoded strings); read whole, it would take that much memory per read ahead.
    Such a row group is decoded batch by batch (here scaled down: 6,000 rows, batches of 500)."""
    from seedance_tasks.compaction import writer

    monkeypatch.setattr(writer, "_STREAM_ROWS", 1_000)
    monkeypatch.setattr(writer, "_STREAM_BATCH_ROWS", 500)
    sizes = _written_tables(monkeypatch)
    lake = tmp_path / "lake"
    for index in range(2):
        _write(lake, f"p=1/{index}.parquet",
               pa.table({"id": range(index * 6_000, (index + 1) * 6_000), "s": ["x" * 50] * 6_000}),
               row_group_size=6_000)
    _write(lake, "p=1/small.parquet", pa.table({"id": range(12_000, 12_100), "s": ["y"] * 100}), row_group_size=50)
    before = _rows(lake)
    report = compact_dataset(str(lake), small_settings)
    assert report["partitions_compacted"] == 1 and report["rows"] == 12_100
    assert _rows(lake) == before
    assert max(sizes) <= 500 and sum(sizes) == 12_100


def test_a_damaged_page_in_a_streamed_row_group_is_quarantined(tmp_path, small_settings, monkeypatch):
    from seedance_tasks.compaction import writer

    monkeypatch.setattr(writer, "_STREAM_ROWS", 1_000)
    monkeypatch.setattr(writer, "_STREAM_BATCH_ROWS", 500)
    lake = tmp_path / "lake"
    for index in range(2):
        _write(lake, f"p=1/{index}.parquet", pa.table({"id": range(index * 3_000, (index + 1) * 3_000)}),
               row_group_size=3_000)
    victim = lake / "p=1/bad.parquet"
    _write(lake, "p=1/bad.parquet", pa.table({"id": range(9_000, 12_000)}), row_group_size=3_000,
           write_page_checksum=True, compression="none", use_dictionary=False, data_page_size=1_024)
    data = bytearray(victim.read_bytes())
    data[pq.ParquetFile(victim).metadata.row_group(0).column(0).data_page_offset + 20_000] ^= 0xFF
    victim.write_bytes(bytes(data))
    report = compact_dataset(str(lake), small_settings)
    assert [item["file"] for item in report["quarantined"]] == ["p=1/bad.parquet"]
    assert report["partitions_compacted"] == 1 and report["rows"] == 6_000
    assert not [p for p in lake.rglob(".seedance-*") if "_seedance" not in p.parts]
