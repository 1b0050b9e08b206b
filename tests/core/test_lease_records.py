"""A lease record is untrusted input: every field is validated, and a bad one is an error naming
the lease file and the key, with a hint; never a traceback, never a lease that cannot expire."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from seedance_tasks import lease, storage
from seedance_tasks.cli import app
from seedance_tasks.errors import ConfigError, IntegrityError

runner = CliRunner()
NOW = datetime.now(UTC).isoformat()


def _record(**fields) -> dict:
    record = {"name": "dataset", "holder": "x", "purpose": "p", "host": socket.gethostname(), "pid": 1,
              "acquired_at": NOW, "heartbeat_at": NOW, "ttl_s": 600, "token": "t"}
    record.update(fields)
    return {key: value for key, value in record.items() if value is not ...}


def _write(tmp_path, text: str):
    path = tmp_path / "_seedance" / "leases" / "dataset.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


BAD = [
    ({"pid": 99999999999999999999}, "pid"),
    ({"pid": 2**63 + 1}, "pid"),
    ({"pid": -3}, "pid"),
    ({"pid": 0}, "pid"),
    ({"pid": "12"}, "pid"),
    ({"pid": True}, "pid"),
    ({"ttl_s": float("nan")}, "ttl_s"),
    ({"ttl_s": float("inf")}, "ttl_s"),
    ({"ttl_s": 1e400}, "ttl_s"),
    ({"ttl_s": 0}, "ttl_s"),
    ({"ttl_s": 30 * 86400}, "ttl_s"),
    ({"ttl_s": "600"}, "ttl_s"),
    ({"ttl_s": ...}, "ttl_s"),
    ({"heartbeat_at": 1.5}, "heartbeat_at"),
    ({"heartbeat_at": "yesterday"}, "heartbeat_at"),
    ({"heartbeat_at": (datetime.now(UTC) + timedelta(days=3000)).isoformat()}, "heartbeat_at"),
    ({"acquired_at": None}, "acquired_at"),
    ({"holder": ""}, "holder"),
    ({"holder": ["x"]}, "holder"),
    ({"host": "h" * 5000}, "host"),
    ({"token": 7}, "token"),
    ({"pid_bound": "no"}, "pid_bound"),
]


@pytest.mark.parametrize("fields, key", BAD)
def test_a_bad_lease_field_is_named_with_the_file(tmp_path, fields, key):
    path = _write(tmp_path, json.dumps(_record(**fields)).replace("Infinity", "1e400"))
    with pytest.raises(IntegrityError) as refused:
        lease.acquire(storage.resolve(tmp_path), "dataset", holder="run-B", purpose="x", ttl_s=60)
    assert refused.value.message.startswith(f"lease record {path}: {key}"), refused.value.message
    assert "move the file away" in refused.value.hint
    assert path.exists()  # never removed by a reader


@pytest.mark.parametrize("text", ["{", "[1]", "[" * 60_000, "x" * 100_000])
def test_a_lease_file_that_is_not_a_record_is_named(tmp_path, text):
    path = _write(tmp_path, text)
    with pytest.raises(IntegrityError, match=f"lease record {path}"):
        lease.current(storage.resolve(tmp_path), "dataset")


def test_a_sound_record_is_read_back(tmp_path):
    _write(tmp_path, json.dumps(_record(host="elsewhere", pid=2**31 - 1, ttl_s=0.5, pid_bound=False)))
    record = lease.current(storage.resolve(tmp_path), "dataset")
    assert record.pid == 2**31 - 1 and record.ttl_s == 0.5 and not record.pid_bound


@pytest.mark.parametrize("fields", [{"pid": 99999999999999999999}, {"ttl_s": float("nan"), "host": "elsewhere",
                                                                   "heartbeat_at": "2020-01-01T00:00:00+00:00"}])
def test_compact_with_a_bad_lease_record_is_a_clear_error(tmp_path, fields):
    lake = tmp_path / "lake"
    (lake / "p=1").mkdir(parents=True)
    for name in "ab":
        pq.write_table(pa.table({"x": [1]}), lake / "p=1" / f"{name}.parquet")
    _write(lake, json.dumps(_record(**fields)))
    result = runner.invoke(app, ["compact", str(lake), "--min-age", "0"])
    assert result.exit_code == 4, result.output  # IntegrityError, as for a damaged journal
    assert "error: lease record" in result.output and "dataset.json" in result.output
    assert "hint:" in result.output and "unexpected" not in result.output
    assert sorted(p.name for p in (lake / "p=1").iterdir()) == ["a.parquet", "b.parquet"]


@pytest.mark.parametrize("ttl", [float("nan"), 0, 30 * 86400])
def test_a_lease_ttl_out_of_range_is_refused_before_anything_is_written(tmp_path, ttl):
    with pytest.raises(ConfigError, match="lease TTL"):
        lease.acquire(storage.resolve(tmp_path), "dataset", holder="a", purpose="x", ttl_s=ttl)
    assert not (tmp_path / "_seedance").exists()


def test_the_safety_page_lists_a_damaged_lease_record_and_still_shows_the_rest(tmp_path):
    from seedance_tasks.dashboard.safety import root_status

    _write(tmp_path, json.dumps(_record(ttl_s=float("nan"))))
    good = tmp_path / "_seedance" / "leases" / "other.json"
    good.write_text(json.dumps(_record(name="other")))
    status = root_status(str(tmp_path))
    assert [item["name"] for item in status["leases"]] == ["other"]
    [damaged] = status["damaged_leases"]
    assert "dataset.json" in damaged["error"] and "ttl_s" in damaged["error"] and damaged["hint"]
    with pytest.raises(IntegrityError, match="ttl_s"):
        lease.list_leases(storage.resolve(str(tmp_path)))
