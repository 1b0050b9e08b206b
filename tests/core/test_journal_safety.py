"""The journal under retries, purges and tampering: never overwritten, never obeyed when unsound."""

from __future__ import annotations

import json
import os

import pytest

from seedance_tasks import faults, journal, storage
from seedance_tasks.errors import IntegrityError


@pytest.fixture
def root(tmp_path):
    (tmp_path / "data").mkdir()
    for name in ("a", "b"):
        (tmp_path / "data" / f"{name}.txt").write_text(name * 10)
    return storage.resolve(tmp_path)


def _stage(root, name: str, text: str) -> dict:
    staged = f"data/.{name}.staged"
    storage.write_bytes_atomic(root.fs, root.join(staged), text.encode())
    return {"staged": staged, "final": f"data/{name}"}


def test_an_attempt_never_overwrites_another_attempts_journal(root):
    first = journal.Journal.begin(root, "run1-p00000-a1", "test", [], ["data/a.txt"])
    with pytest.raises(IntegrityError, match="already exists"):
        journal.Journal.begin(root, "run1-p00000-a1", "test", [], ["data/b.txt"])
    first.commit()
    with pytest.raises(IntegrityError, match="already exists"):  # a done journal counts too
        journal.Journal.begin(root, "run1-p00000-a1", "test", [], ["data/b.txt"])
    assert journal.find(root, "run1-p00000-a1").state == journal.DONE
    assert (root.path + "/data/b.txt") and os.path.exists(root.join("data/b.txt"))


def test_recover_touches_only_the_journals_of_its_prefix(root):
    mine = journal.Journal.begin(root, "run1-p00000-a1", "test", [_stage(root, "x.txt", "x")], [])
    sibling = journal.Journal.begin(root, "run1-p00001-a1", "test", [_stage(root, "y.txt", "y")], [])
    outcomes = journal.recover(root, "test", prefix="run1-p00000-")
    assert outcomes == [{"run_id": mine.run_id, "action": "rolled back"}]
    assert [item.run_id for item in journal.pending(root, "test")] == [sibling.run_id]


def test_a_retire_already_gone_after_a_purge_is_not_an_error(root):
    entry = journal.Journal.begin(root, "run2", "test", [_stage(root, "c.txt", "c")], ["data/a.txt", "data/b.txt"])
    with faults.armed(at=1, mode="raise", match="storage.retire.after"):  # dies after retiring a.txt
        with pytest.raises(faults.InjectedFault):
            entry.commit()
    assert journal.purge_trash(root, 0, apply=True)["purged"] == []  # the pending attempt's trash is kept
    storage.purge_trash(root, 0)  # an older purge, or a user's rm, freed it anyway
    outcomes = journal.recover(root, "test")
    assert outcomes == [{"run_id": "run2", "action": "rolled forward"}]
    assert sorted(os.listdir(root.join("data"))) == ["c.txt"]


def test_publish_never_overwrites_a_different_file(root):
    entry = journal.Journal.begin(root, "run3", "test", [_stage(root, "a.txt", "new")], [])
    with pytest.raises(IntegrityError, match="different file"):
        entry.commit()
    assert open(root.join("data/a.txt")).read() == "a" * 10


def test_replace_moves_the_old_version_to_the_trash_first(root):
    item = {**_stage(root, "a.txt", "new"), "replace": True}
    journal.Journal.begin(root, "run4", "test", [item], []).commit()
    assert open(root.join("data/a.txt")).read() == "new"
    assert open(root.join(storage.TRASH_DIR, "run4", "data/a.txt")).read() == "a" * 10


def _write_journal(root, name: str, **fields) -> str:
    data = {"run_id": name, "kind": "test", "state": "publishing", "publishes": [], "retires": [], "meta": {}}
    data.update(fields)
    path = root.join(journal.JOURNAL_DIR, f"{name}.json")
    storage.write_json_atomic(root.fs, path, data)
    return path


@pytest.mark.parametrize("fields", [
    {"retires": ["../outside.txt"]},
    {"retires": ["/etc/hostname"]},
    {"retires": ["data/../../outside.txt"]},
    {"publishes": [{"staged": "../outside.txt", "final": "data/z"}]},
    {"publishes": [{"staged": "data/visible.txt", "final": "data/z"}]},  # a staged file must be hidden
    {"state": "exploded"},
    {"run_id": "someone-else"},
    {"trash_id": "../../x"},
    {"external": [{"root": "/", "rel": "outside.txt"}]},
])
def test_a_tampered_journal_is_refused_and_nothing_outside_is_touched(root, tmp_path, fields):
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("keep me")
    (tmp_path / "outside.txt").write_text("keep me too")
    _write_journal(root, "run5", **fields)
    outcomes = journal.recover(root, "test")
    assert [item["action"] for item in outcomes] == ["refused"]
    assert outside.read_text() == "keep me" and (tmp_path / "outside.txt").read_text() == "keep me too"
    assert sorted(os.listdir(root.join("data"))) == ["a.txt", "b.txt"]
    assert os.path.exists(root.join(journal.REFUSED_DIR, "run5.json"))
    assert journal.pending(root) == []


def test_external_retires_only_under_trusted_roots(root, tmp_path):
    tier = tmp_path / "tier"
    (tier / "r").mkdir(parents=True)
    (tier / "r" / "f.bin").write_text("tiered")
    entry = journal.Journal.begin(root, "run6", "test", [], [], external=[{"root": str(tier), "rel": "r/f.bin"}])
    with pytest.raises(IntegrityError, match="not one of"):
        entry.commit(external_roots=[str(tmp_path / "elsewhere")])
    assert (tier / "r" / "f.bin").exists()
    entry.commit(external_roots=[str(tier)])
    assert not (tier / "r" / "f.bin").exists()
    assert (tier / storage.TRASH_DIR / "run6" / "r" / "f.bin").read_text() == "tiered"


def test_a_journal_that_is_not_json_is_refused(root):
    path = root.join(journal.JOURNAL_DIR, "run7.json")
    storage.write_bytes_atomic(root.fs, path, b"{not json")
    assert journal.recover(root)[0]["action"] == "refused"


@pytest.mark.parametrize("bad", ["", "/abs", "a/../../b", "..", "a\x00b", "s3://bucket/x", "a\\..\\b"])
def test_confine_refuses_paths_that_leave_their_root(bad):
    with pytest.raises(IntegrityError, match="manifest m"):
        storage.confine(bad, what="manifest m")


def test_confine_normalises_harmless_paths():
    assert storage.confine("./a//b/./c.parquet", what="x") == "a/b/c.parquet"


def test_listing_never_follows_a_symlink(tmp_path):
    (tmp_path / "dt=1").mkdir()
    (tmp_path / "dt=1" / "f.parquet").write_text("x")
    (tmp_path / "latest").symlink_to(tmp_path / "dt=1")
    (tmp_path / "link.parquet").symlink_to(tmp_path / "dt=1" / "f.parquet")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "secret.parquet").write_text("x")
    (tmp_path / "escape").symlink_to(outside)
    listing = storage.list_tree(storage.resolve(tmp_path))
    assert [storage.resolve(tmp_path).relative(item.path) for item in listing.files] == ["dt=1/f.parquet"]
    assert listing.symlinks == ["escape", "latest", "link.parquet"]


def test_a_failed_atomic_write_leaves_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "out.json"

    def full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        storage.write_json_atomic(storage.resolve(tmp_path).fs, str(target), {"a": 1})
    assert os.listdir(tmp_path) == []


def test_every_journal_step_is_a_fault_point(root):
    with faults.tracing() as names:
        journal.Journal.begin(root, "run8", "test", [_stage(root, "d.txt", "d")], ["data/a.txt"]).commit()
    for expected in ("journal.begun", "journal.publishing", "storage.publish.before", "storage.publish.after",
                     "storage.retire.before", "storage.retire.after", "journal.closed"):
        assert expected in names, names
    assert json.loads(open(root.join(journal.DONE_DIR, "run8.json")).read())["state"] == "done"


def test_purge_frees_old_finished_journals_but_keeps_pending_ones(root):
    from datetime import UTC, datetime, timedelta

    journal.Journal.begin(root, "run9", "test", [], ["data/a.txt"]).commit()
    journal.Journal.begin(root, "run10", "test", [_stage(root, "e.txt", "e")], [])
    later = datetime.now(UTC) + timedelta(days=8)
    assert journal.purge_trash(root, 7 * 86400, now=later, apply=False)["journals_purged"] == 1
    assert journal.find(root, "run9") is not None  # a dry run deletes nothing
    result = journal.purge_trash(root, 7 * 86400, now=later)
    assert result["journals_purged"] == 1 and journal.find(root, "run9") is None
    assert [item.run_id for item in journal.pending(root)] == ["run10"]


def test_an_attempt_presumed_dead_cannot_resurrect_its_recovered_journal(root):
    """A retry recovered (rolled back) attempt 1 while attempt 1 still ran: attempt 1 must stop."""
    stale = journal.Journal.begin(root, "run11-a1", "test", [_stage(root, "f.txt", "f")], ["data/a.txt"])
    assert journal.recover(root, "test", prefix="run11-") == [{"run_id": "run11-a1", "action": "rolled back"}]
    with pytest.raises(IntegrityError, match="closed by another attempt"):
        stale.commit()
    with pytest.raises(IntegrityError, match="closed by another attempt"):
        stale.add_publish("data/.g.staged", "data/g.txt")
    assert journal.pending(root) == []
    assert sorted(os.listdir(root.join("data"))) == ["a.txt", "b.txt"]
