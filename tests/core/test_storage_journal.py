from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from seedance_tasks import journal, storage
from seedance_tasks.cli import app
from seedance_tasks.errors import IntegrityError, UsageError


def test_resolve_local_forms(tmp_path):
    for uri in (str(tmp_path), f"file://{tmp_path}"):
        location = storage.resolve(uri)
        assert location.path == str(tmp_path) and not location.is_s3


def test_resolve_decodes_file_uris_and_refuses_a_host(tmp_path):
    odd = tmp_path / "a b%"
    assert storage.resolve("file://" + str(tmp_path) + "/a%20b%25").path == str(odd)
    assert storage.resolve("file://localhost" + str(tmp_path)).path == str(tmp_path)
    with pytest.raises(UsageError, match="three slashes"):
        storage.resolve("file://tmp/lake")


def test_resolve_rejects_unknown_scheme():
    with pytest.raises(UsageError, match="unsupported storage scheme"):
        storage.resolve("gs://bucket/x")


def test_list_files_skips_hidden(tmp_path):
    (tmp_path / "a=1").mkdir()
    for name in ("a=1/x.parquet", "a=1/_SUCCESS", "a=1/.x.parquet.crc", "_seedance/trash/r/y.parquet", "z.parquet"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"1")
    root = storage.resolve(tmp_path)
    assert [root.relative(f.path) for f in storage.list_files(root)] == ["a=1/x.parquet", "z.parquet"]
    assert len(storage.list_files(root, include_hidden=True)) == 5


def test_publish_trash_and_quarantine_move_never_delete(tmp_path):
    root = storage.resolve(tmp_path)
    storage.write_bytes_atomic(root.fs, root.join("p/.staged"), b"new")
    storage.publish(root.fs, root.join("p/.staged"), root.join("p/final"))
    storage.publish(root.fs, root.join("p/.staged"), root.join("p/final"))  # repeat after a crash: no-op
    assert (tmp_path / "p/final").read_bytes() == b"new"
    with pytest.raises(IntegrityError):
        storage.publish(root.fs, root.join("p/.gone"), root.join("p/other"))
    trashed = storage.move_to_trash(root, "p/final", "20260101T000000Z-aaaaaa")
    assert open(trashed, "rb").read() == b"new" and not (tmp_path / "p/final").exists()
    (tmp_path / "p/bad").write_bytes(b"junk")
    moved = storage.quarantine(root, "p/bad", "20260101T000000Z-aaaaaa", "not parquet")
    assert open(moved, "rb").read() == b"junk"
    assert "not parquet" in open(moved + ".reason.json").read()


def test_purge_trash_by_age(tmp_path):
    root = storage.resolve(tmp_path)
    now = datetime(2026, 11, 29, tzinfo=UTC)
    old = storage.new_run_id(now - timedelta(days=8))
    new = storage.new_run_id(now - timedelta(days=1))
    for run in (old, new):
        path = tmp_path / "_seedance/trash" / run / "p/f.parquet"
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x" * 10)
    dry = storage.purge_trash(root, 7 * 86400, now=now, apply=False)
    assert dry["purged"] == [old] and (tmp_path / "_seedance/trash" / old).exists()
    result = storage.purge_trash(root, 7 * 86400, now=now)
    assert result["purged"] == [old] and result["kept"] == [new] and result["bytes"] == 10
    assert not (tmp_path / "_seedance/trash" / old).exists() and (tmp_path / "_seedance/trash" / new).exists()
    assert storage.purge_trash(root, 0, now=now)["purged"] == [new]


def test_purge_trash_never_touches_folders_it_did_not_date_and_says_why_it_kept_each(tmp_path):
    root = storage.resolve(tmp_path)
    now = datetime(2026, 11, 29, tzinfo=UTC)
    old, pending = (storage.new_run_id(now - timedelta(days=days)) for days in (30, 20))
    for name in (old, pending, "someone-elses", "2020"):
        path = tmp_path / "_seedance/trash" / name / "f.bin"
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x")
    result = storage.purge_trash(root, 0, now=now, keep={pending})
    assert result["purged"] == [old] and result["in_use"] == [pending] and result["kept"] == []
    assert result["undated"] == ["2020", "someone-elses"]
    assert (tmp_path / "_seedance/trash/someone-elses/f.bin").exists() and (tmp_path / "_seedance/trash/2020").exists()
    done = CliRunner().invoke(app, ["trash", "purge", str(tmp_path), "--older-than", "0"])
    assert done.exit_code == 0, done.output
    assert "2 folder(s) not named by a run id" in " ".join(done.output.split())
    assert (tmp_path / "_seedance/trash/someone-elses/f.bin").exists()


def _staged_transaction(tmp_path):
    root = storage.resolve(tmp_path)
    (tmp_path / "old.parquet").write_bytes(b"old")
    txn = journal.Journal.begin(root, "20260101T000000Z-bbbbbb", "test", [], ["old.parquet"])
    txn.add_publish(".new.staged", "new.parquet")
    (tmp_path / ".new.staged").write_bytes(b"new")
    return root, txn


def test_journal_commit_publishes_then_retires(tmp_path):
    root, txn = _staged_transaction(tmp_path)
    txn.commit()
    assert (tmp_path / "new.parquet").read_bytes() == b"new"
    assert not (tmp_path / "old.parquet").exists()
    assert (tmp_path / "_seedance/trash/20260101T000000Z-bbbbbb/old.parquet").read_bytes() == b"old"
    assert journal.pending(root) == []


def test_recover_rolls_back_a_writing_run(tmp_path):
    root, _ = _staged_transaction(tmp_path)
    assert journal.recover(root) == [{"run_id": "20260101T000000Z-bbbbbb", "action": "rolled back"}]
    assert (tmp_path / "old.parquet").read_bytes() == b"old"
    assert not (tmp_path / "new.parquet").exists() and not (tmp_path / ".new.staged").exists()


def test_recover_rolls_forward_a_publishing_run_even_half_done(tmp_path):
    root, txn = _staged_transaction(tmp_path)
    txn.state = journal.PUBLISHING
    txn._save()
    storage.publish(root.fs, root.join(".new.staged"), root.join("new.parquet"))  # killed right after this
    assert journal.recover(root)[0]["action"] == "rolled forward"
    assert (tmp_path / "new.parquet").read_bytes() == b"new" and not (tmp_path / "old.parquet").exists()
    assert journal.recover(root) == []


def test_s3_storage_round_trip(s3_bucket):
    root = storage.resolve(f"s3://{s3_bucket}/lake")
    storage.write_bytes_atomic(root.fs, root.join("p/.staged"), b"payload")
    storage.publish(root.fs, root.join("p/.staged"), root.join("p/final"))
    assert [root.relative(f.path) for f in storage.list_files(root)] == ["p/final"]
    storage.move_to_trash(root, "p/final", "20260101T000000Z-cccccc")
    assert storage.list_files(root) == []
    trash = storage.list_files(root.child("_seedance/trash"), include_hidden=True)
    assert storage.read_bytes(root.fs, trash[0].path) == b"payload"
    head = storage.boto3_client("s3").head_object(Bucket=s3_bucket, Key="lake/_seedance/trash/20260101T000000Z-cccccc/p/final")
    assert head["ContentLength"] == 7


def test_s3_endpoint_and_credentials_from_an_airflow_connection(s3_server, s3_bucket, monkeypatch):
    import json

    from seedance_tasks.config import S3Settings

    monkeypatch.setenv(
        "AIRFLOW_CONN_SEEDANCE_S3",
        json.dumps({"conn_type": "aws", "login": "testing", "password": "testing",
                    "extra": {"endpoint_url": s3_server, "region_name": "us-east-1"}}),
    )
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # only the connection knows where the server is
    fs = storage.s3_filesystem(S3Settings(aws_conn_id="seedance_s3"))
    fs.create_dir(f"{s3_bucket}/via-connection")
    with fs.open_output_stream(f"{s3_bucket}/via-connection/x") as out:
        out.write(b"ok")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    assert storage.boto3_client("s3").get_object(Bucket=s3_bucket, Key="via-connection/x")["Body"].read() == b"ok"


def _record_write_back(monkeypatch) -> list[tuple[str, int, int]]:
    """Record every write-back hint as (file, offset, length)."""
    import os

    calls: list[tuple[str, int, int]] = []

    def fadvise(descriptor, offset, length, advice):
        assert advice == os.POSIX_FADV_DONTNEED
        calls.append((os.readlink(f"/proc/self/fd/{descriptor}"), offset, length))

    monkeypatch.setattr(storage.os, "posix_fadvise", fadvise)
    return calls


def test_write_back_is_queued_in_steps_covering_what_was_written(tmp_path, monkeypatch):
    calls = _record_write_back(monkeypatch)
    monkeypatch.setattr(storage.WriteBack, "STEP", 1000)
    root = storage.resolve(tmp_path)
    path = root.join("f.bin")
    with root.fs.open_output_stream(path) as stream:
        write_back = storage.WriteBack(root.fs, path)
        for _ in range(25):
            stream.write(b"x" * 300)
            write_back.written(stream.tell())
        write_back.close()
        write_back.close()
    assert {name for name, _, _ in calls} == {path}
    spans = [(offset, offset + length) for _, offset, length in calls]
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))  # contiguous, no gaps
    assert all(stop - start >= 1000 for start, stop in spans)
    assert 7500 - 1000 < spans[-1][1] <= 7500  # only the last, unfilled step is left to the fsync
    assert (tmp_path / "f.bin").stat().st_size == 7500


def test_write_back_with_drop_covers_the_whole_file_each_step_and_drops_it_once_durable(tmp_path, monkeypatch):
    calls = _record_write_back(monkeypatch)
    monkeypatch.setattr(storage.WriteBack, "STEP", 1000)
    root = storage.resolve(tmp_path)
    path = root.join("f.bin")
    with root.fs.open_output_stream(path) as stream:
        write_back = storage.WriteBack(root.fs, path, drop=True)
        for _ in range(25):
            stream.write(b"x" * 300)
            write_back.written(stream.tell())
    write_back.durable()
    write_back.close()
    *steps, last = calls
    assert steps and all(offset == 0 for _, offset, _ in steps)  # again from 0: pages written back since are clean
    lengths = [length for _, _, length in steps]
    assert lengths == sorted(lengths) and 7500 - 1000 < lengths[-1] <= 7500
    assert last == (path, 0, 0)  # the whole file, once it is on disk
    kept = storage.WriteBack(root.fs, path)
    kept.durable()  # without drop: nothing is dropped
    kept.close()
    assert len(calls) == len(steps) + 1


def test_a_local_shard_sink_drops_its_pages_only_after_its_fsync(tmp_path, monkeypatch):
    from seedance_tasks.shards import tario

    events: list = []
    real_fsync = tario.os.fsync
    monkeypatch.setattr(storage.os, "posix_fadvise", lambda fd, offset, length, advice: events.append(
        ("advise", offset, length)))
    monkeypatch.setattr(tario.os, "fsync", lambda fd: (events.append(("fsync",)), real_fsync(fd)))
    monkeypatch.setattr(storage.WriteBack, "STEP", 4096)
    sink = tario.LocalSink(str(tmp_path / "s.tar"))
    for _ in range(40):
        sink.write(b"y" * 100_000)
    sink.close()
    assert (tmp_path / "s.tar").read_bytes() == b"y" * 4_000_000
    assert events[-2:] == [("fsync",), ("advise", 0, 0)]
    assert any(event[0] == "advise" and event[2] > 0 for event in events[:-2])  # write-back started while writing


def test_write_back_never_fails_a_write_and_does_nothing_without_a_local_file(tmp_path, monkeypatch, s3_bucket):
    def broken(*_):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(storage.os, "posix_fadvise", broken)
    root = storage.resolve(tmp_path)
    (tmp_path / "f.bin").write_bytes(b"x" * 100)
    write_back = storage.WriteBack(root.fs, root.join("f.bin"))
    write_back.written(10**9)  # the hint fails: the write goes on
    write_back.close()
    calls = _record_write_back(monkeypatch)
    for fs, path in ((root.fs, None), (root.fs, root.join("missing.bin")), (storage.resolve(f"s3://{s3_bucket}").fs, f"{s3_bucket}/k")):
        write_back = storage.WriteBack(fs, path)
        write_back.written(10**9)
        write_back.close()
    assert calls == []
