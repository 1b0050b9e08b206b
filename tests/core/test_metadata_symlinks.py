"""A path named by metadata (a journal) never passes through a symlink below its root: such a
journal is refused and quarantined, and nothing outside the root is moved."""

from __future__ import annotations

import json
import os

import pytest

from seedance_tasks import journal, storage
from seedance_tasks.errors import IntegrityError


@pytest.fixture
def lake(tmp_path):
    """(root, outside): a root with data/a.txt and a symlink `link=1` to an outside folder holding precious.txt."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    (tmp_path / "root" / "data").mkdir(parents=True)
    (tmp_path / "root" / "data" / "a.txt").write_text("a")
    (tmp_path / "root" / "link=1").symlink_to(outside)
    return storage.resolve(tmp_path / "root"), outside


def _write_journal(root, run_id: str, **fields) -> None:
    record = {"run_id": run_id, "kind": "test", "state": "publishing", "publishes": [], "retires": [], **fields}
    storage.write_json_atomic(root.fs, root.join(journal.JOURNAL_DIR, f"{run_id}.json"), record)


@pytest.mark.parametrize("fields, key", [
    ({"retires": ["link=1/precious.txt"]}, "retires"),
    ({"retires": ["link=1"]}, "retires"),
    ({"publishes": [{"staged": "link=1/.x.staged", "final": "data/x"}]}, "publishes.staged"),
    ({"publishes": [{"staged": "data/.x.staged", "final": "link=1/precious.txt"}]}, "publishes.final"),
])
def test_a_journal_path_through_a_symlink_is_refused_and_quarantined(lake, fields, key):
    root, outside = lake
    storage.write_bytes_atomic(root.fs, root.join("data/.x.staged"), b"x")
    _write_journal(root, "run1", **fields)
    [outcome] = journal.recover(root, "test")
    assert outcome["action"] == "refused"
    assert f"run1.json {key}" in outcome["reason"] and "symlink" in outcome["reason"]
    assert os.listdir(outside) == ["precious.txt"] and (outside / "precious.txt").read_text() == "keep me"
    assert os.path.exists(root.join(journal.REFUSED_DIR, "run1.json"))
    assert not os.path.exists(root.join(storage.TRASH_DIR)) and journal.pending(root) == []


def test_an_external_retire_through_a_symlink_is_refused(lake, tmp_path):
    root, outside = lake
    tier = tmp_path / "tier"
    tier.mkdir()
    (tier / "link").symlink_to(outside)
    _write_journal(root, "run2", external=[{"root": str(tier), "rel": "link/precious.txt"}])
    [outcome] = journal.recover(root, "test", external_roots=[str(tier)])
    assert outcome["action"] == "refused" and "external.rel" in outcome["reason"]
    assert os.listdir(outside) == ["precious.txt"]


def test_begin_refuses_a_path_through_a_symlink(lake):
    root, outside = lake
    with pytest.raises(IntegrityError, match="symlink"):
        journal.Journal.begin(root, "run3", "test", [], ["link=1/precious.txt"])
    assert os.listdir(outside) == ["precious.txt"] and journal.find(root, "run3") is None


def test_a_root_reached_through_a_symlink_still_works(lake, tmp_path):
    """Only what lies below the root is checked: the root itself may be a link (a mounted lake)."""
    real, _ = lake
    (tmp_path / "alias").symlink_to(real.path)
    root = storage.resolve(tmp_path / "alias")
    entry = journal.Journal.begin(root, "run4", "test", [], ["data/a.txt"])
    entry.commit()
    assert (tmp_path / "alias" / storage.TRASH_DIR / "run4" / "data" / "a.txt").read_text() == "a"
    assert json.loads((tmp_path / "alias" / journal.DONE_DIR / "run4.json").read_text())["state"] == "done"


def test_confine_with_a_root_checks_every_component(lake):
    root, _ = lake
    assert storage.confine("data/a.txt", what="m", root=root) == "data/a.txt"
    assert storage.confine("data/not-yet/b.txt", what="m", root=root) == "data/not-yet/b.txt"  # absent: fine
    os.symlink(root.join("data", "a.txt"), root.join("data", "alias.txt"))  # a link inside the root, too
    for path in ("link=1/precious.txt", "data/alias.txt", "./link=1"):
        with pytest.raises(IntegrityError, match=r"manifest m: .*symlink") as refused:
            storage.confine(path, what="manifest m", root=root)
        assert refused.value.hint
    assert storage.confine("link=1/precious.txt", what="m") == "link=1/precious.txt"  # text only without a root


def test_through_link_names_the_first_link_below_the_root(lake):
    """`storage.through_link` is the one walk behind `confine(root=...)`, GC and tiering: the first
    symlink component relative to the root, or None (absent components and paths below a file too)."""
    root, _ = lake
    assert storage.through_link(root, "link=1/precious.txt") == "link=1"
    assert storage.through_link(root, "link=1") == "link=1"
    os.symlink(root.join("data"), root.join("data", "loop"))
    assert storage.through_link(root, "data/loop/a.txt") == "data/loop"
    for path in ("data/a.txt", "data/not-yet/b.txt", "data/a.txt/below"):
        assert storage.through_link(root, path) is None


# --------------------------------------------------------------------------- Seedance's own folder


@pytest.fixture
def linked_state(tmp_path):
    """(root, outside): a root with data/a.txt whose `_seedance/<sub>` is a symlink to `outside`."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "root" / "data").mkdir(parents=True)
    (tmp_path / "root" / "data" / "a.txt").write_text("a")
    return tmp_path / "root", outside


@pytest.mark.parametrize("linked", ["_seedance", "_seedance/trash", "_seedance/quarantine", "_seedance/journal",
                                    "_seedance/leases"])
@pytest.mark.parametrize("action", ["trash", "quarantine", "journal", "lease"])
def test_a_symlinked_state_folder_is_refused_before_anything_moves(linked_state, linked, action):
    from seedance_tasks import lease

    root_dir, outside = linked_state
    (root_dir / linked).parent.mkdir(parents=True, exist_ok=True)
    (root_dir / linked).symlink_to(outside)
    root = storage.resolve(root_dir)
    run = storage.new_run_id()
    steps = {
        "trash": lambda: storage.move_to_trash(root, "data/a.txt", run),
        "quarantine": lambda: storage.quarantine(root, "data/a.txt", run, "bad"),
        "journal": lambda: journal.Journal.begin(root, run, "test", [], []),
        "lease": lambda: lease.acquire(root, "dataset", holder="test", purpose="test", ttl_s=60),
    }
    affected = {"trash": "_seedance/trash", "quarantine": "_seedance/quarantine", "journal": "_seedance/journal",
                "lease": "_seedance/leases"}[action]
    if linked not in ("_seedance", affected):
        steps[action]()  # another folder's link does not concern this action
        return
    with pytest.raises(IntegrityError, match="state folder.*symlink"):
        steps[action]()
    assert list(outside.iterdir()) == []
    assert (root_dir / "data" / "a.txt").read_text() == "a"


def test_purge_never_deletes_through_a_symlink(tmp_path):
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "precious.txt").write_text("keep me")
    root_dir = tmp_path / "root"
    (root_dir / "_seedance" / "trash").mkdir(parents=True)
    old_run = storage.new_run_id(storage.run_id_time("20200101T000000Z-aaaaaa"))
    (root_dir / "_seedance" / "trash" / old_run).symlink_to(outside / "keep")
    root = storage.resolve(root_dir)

    report = storage.purge_trash(root, 0)
    assert report["purged"] == [] and report["undated"] == [old_run]
    assert (outside / "keep" / "precious.txt").read_text() == "keep me"

    (root_dir / "_seedance" / "trash" / old_run).unlink()
    (root_dir / "_seedance" / "trash").rmdir()
    (outside / old_run).mkdir()
    (root_dir / "_seedance" / "trash").symlink_to(outside)  # the whole trash elsewhere
    with pytest.raises(IntegrityError, match="state folder"):
        storage.purge_trash(root, 0)
    assert (outside / old_run).is_dir() and (outside / "keep" / "precious.txt").exists()
