"""Parquet sources: how cells become members (nanosecond temporals, nested bytes, decimals, NaN and
infinities), cells that cannot be encoded, and bad keys, each rejected with its file, row and reason
while the build goes on."""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.shards.build import build
from seedance_tasks.shards.tario import iter_members, iter_samples


def members_by_key(directory: Path) -> dict[str, dict[str, bytes]]:
    samples = {}
    for tar in sorted(directory.glob("*.tar")):
        with open(tar, "rb") as stream:
            samples.update({s.key: s.members for s in iter_samples(iter_members(stream, str(tar)), str(tar))})
    return samples


def write_parquet(path: Path, columns: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def test_nanosecond_temporal_columns_are_encoded_losslessly(tmp_path):
    write_parquet(tmp_path / "src" / "a.parquet", {
        "__key__": ["a", "b"],
        "cls": [1, 2],
        "ts": pa.array([1500, 2000], pa.timestamp("ns")),
        "tz": pa.array([1500, -1500], pa.timestamp("ns", "UTC")),
        "t": pa.array([1500, 10**9], pa.time64("ns")),
        "du": pa.array([1500, -1500], pa.duration("ns")),
        "nested": pa.array([{"x": [1500]}, None], pa.struct([("x", pa.list_(pa.timestamp("ns")))])),
    })
    result = CliRunner().invoke(app, ["shards", "build", str(tmp_path / "src"), "--out", str(tmp_path / "o"),
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rejected"] == []
    samples = members_by_key(tmp_path / "o")
    assert json.loads(samples["a"]["ts"]) == "1970-01-01 00:00:00.000001500"
    assert json.loads(samples["b"]["ts"]) == "1970-01-01 00:00:00.000002000"
    assert json.loads(samples["a"]["tz"]) == "1970-01-01 00:00:00.000001500+00:00"
    assert json.loads(samples["b"]["tz"]) == "1969-12-31 23:59:59.999998500+00:00"
    assert json.loads(samples["a"]["t"]) == "00:00:00.000001500"
    assert json.loads(samples["b"]["t"]) == "00:00:01"
    assert json.loads(samples["a"]["du"]) == "0:00:00.000001500"
    assert json.loads(samples["b"]["du"]) == "-1 day, 23:59:59.999998500"  # as Python writes timedelta
    assert json.loads(samples["a"]["nested"]) == {"x": ["1970-01-01 00:00:00.000001500"]}


def test_a_cell_that_cannot_be_encoded_rejects_its_row_and_the_build_goes_on(tmp_path):
    write_parquet(tmp_path / "src" / "a.parquet", {
        "__key__": ["a", "b", "c"],
        "cls": [1, 2, 3],
        "when": pa.array([1, 2**50, 3], pa.timestamp("ms")),  # b: beyond year 9999, no Python datetime
    })
    result = build(str(tmp_path / "src"), str(tmp_path / "o"))
    assert sorted(members_by_key(tmp_path / "o")) == ["a", "c"]
    [rejected] = result["rejected"]
    assert rejected["key"] == "b" and rejected["source"] == "a.parquet#row1"
    assert "column 'when'" in rejected["reason"]


def test_rows_are_named_by_their_row_in_the_file_not_in_the_row_group(tmp_path):
    (tmp_path / "src").mkdir()
    pq.write_table(pa.table({"__key__": ["a", "b", "c", "d"], "cls": [1, 2, 3, 4],
                             "when": pa.array([1, 2, 3, 2**50], pa.timestamp("ms"))}),
                   tmp_path / "src" / "a.parquet", row_group_size=2)
    result = build(str(tmp_path / "src"), str(tmp_path / "o"))
    assert [item["source"] for item in result["rejected"]] == ["a.parquet#row3"]


def test_bytes_nested_in_structs_and_lists_are_base64(tmp_path):
    write_parquet(tmp_path / "src" / "a.parquet", {
        "__key__": ["a"],
        "cls": [1],
        "meta": pa.array([{"b": b"\xff\x00", "l": [b"hi"]}],
                         pa.struct([("b", pa.binary()), ("l", pa.list_(pa.binary()))])),
    })
    build(str(tmp_path / "src"), str(tmp_path / "o"))
    meta = json.loads(members_by_key(tmp_path / "o")["a"]["meta"])
    assert base64.b64decode(meta["b"]) == b"\xff\x00" and base64.b64decode(meta["l"][0]) == b"hi"


def test_empty_and_null_keys_are_rejected_like_other_bad_keys(tmp_path):
    write_parquet(tmp_path / "src" / "a.parquet", {
        "__key__": ["", None, "a-0000-00000002", "a.b", "good"],
        "cls": [1, 2, 3, 4, 5],
    })
    result = build(str(tmp_path / "src"), str(tmp_path / "o"))
    assert sorted(members_by_key(tmp_path / "o")) == ["a-0000-00000002", "good"]
    reasons = {item["source"]: item["reason"] for item in result["rejected"]}
    assert set(reasons) == {"a.parquet#row0", "a.parquet#row1", "a.parquet#row3"}
    assert "empty key" in reasons["a.parquet#row0"] and "null key" in reasons["a.parquet#row1"]
    assert not any("duplicate" in reason for reason in reasons.values())


def strict_loads(data: bytes):
    """json.loads that refuses NaN and Infinity, as strict JSON parsers do, and keeps decimals exact."""
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")
    return json.loads(data, parse_float=Decimal, parse_constant=refuse)


def test_decimals_are_json_numbers_with_their_own_digits_at_any_depth(tmp_path):
    big = Decimal("12345678901234567890123456789012345678.12345678901234567890123456789012345678")
    write_parquet(tmp_path / "src" / "a.parquet", {
        "__key__": ["a"],
        "cls": [1],
        "price": pa.array([Decimal("12.30")], pa.decimal128(5, 2)),
        "big": pa.array([big], pa.decimal256(76, 38)),
        "meta": pa.array([{"d": Decimal("-0.05"), "l": [big, None], "s": "x"}],
                         pa.struct([("d", pa.decimal128(5, 2)), ("l", pa.list_(pa.decimal256(76, 38))),
                                    ("s", pa.string())])),
    })
    build(str(tmp_path / "src"), str(tmp_path / "o"))
    sample = members_by_key(tmp_path / "o")["a"]
    assert sample["price"] == b"12.30" and sample["big"] == str(big).encode()
    assert sample["meta"] == f'{{"d": -0.05, "l": [{big}, null], "s": "x"}}'.encode()
    price, meta = strict_loads(sample["price"]), strict_loads(sample["meta"])
    assert str(price) == "12.30" and strict_loads(sample["big"]) == big
    assert meta == {"d": Decimal("-0.05"), "l": [big, None], "s": "x"} and str(meta["d"]) == "-0.05"


def test_nan_and_infinities_are_written_as_their_text_and_json_stays_strict(tmp_path):
    nan, inf = float("nan"), float("inf")
    write_parquet(tmp_path / "src" / "a.parquet", {
        "__key__": ["a"],
        "cls": [1],
        "score": pa.array([nan], pa.float64()),
        "scores": pa.array([[nan, inf, -inf, 1.5, None]], pa.list_(pa.float64())),
        "meta": pa.array([{"f": -inf, "d": Decimal("1.5")}], pa.struct([("f", pa.float32()),
                                                                         ("d", pa.decimal128(3, 1))])),
    })
    build(str(tmp_path / "src"), str(tmp_path / "o"))
    sample = members_by_key(tmp_path / "o")["a"]
    assert sample["score"] == b"nan"  # the top level's text, which nested values are written as too
    assert sample["scores"] == b'["nan", "inf", "-inf", 1.5, null]'
    assert strict_loads(sample["scores"]) == ["nan", "inf", "-inf", Decimal("1.5"), None]
    assert sample["meta"] == b'{"f": "-inf", "d": 1.5}'
