"""Steps stored by older versions of Seedance, met again by this one."""

from __future__ import annotations

import collections
import functools
import logging

import torch

from seedance_tasks.checkpoint import _settings, ingest, tree
from seedance_tasks.checkpoint import store as ckstore


def test_an_inbox_file_with_tied_weights_stored_untied_by_an_older_version_is_not_a_conflict(tmp_path, monkeypatch):
    """Before tied weights were stored once, each tied key was an entry of its own: the same file
    (an attempt that stored it and died before retiring it, or a copy dropped again) is the same
    content, not a conflict left in the inbox for a person."""
    inbox, store = tmp_path / "inbox", tmp_path / "store"
    (inbox / "r").mkdir(parents=True)
    w = torch.randn(32, 16)
    state = {"model": {"embed.weight": w, "head.weight": w, "bias": torch.zeros(16)}, "step": 7}
    torch.save(state, inbox / "r" / "step-7.pt")
    settings = _settings()
    item = ingest.scan(str(inbox), 0)["ready"][0]

    older = functools.partial(tree.flatten, share=False)
    monkeypatch.setattr(ckstore, "flatten", older)  # what the older version stored
    ckstore.save_state(ingest._read(ckstore.storage.resolve(str(inbox)), item["path"]), str(store), "r", 7,
                       settings=settings)
    assert len(ckstore.read_manifest(ckstore.storage.resolve(str(store)), "r", 7)["tensors"]) == 3
    monkeypatch.undo()

    result = ingest.ingest_one(item, str(inbox), str(store), settings)
    assert result["status"] == "already stored" and result["verified"] is True
    assert not (inbox / "r" / "step-7.pt").exists()  # retired to the inbox trash

    other = {"model": {"embed.weight": w, "head.weight": w + 1, "bias": torch.zeros(16)}, "step": 7}
    assert not ckstore.same_content(other, ckstore.read_manifest(ckstore.storage.resolve(str(store)), "r", 7))


Stats = collections.namedtuple("Stats", "loss acc")


def test_a_namedtuple_is_said_at_save_time_to_restore_as_a_plain_tuple(tmp_path, caplog, monkeypatch):
    """A checkpoint records no classes of the caller's code (restoring one would import it): a
    namedtuple or a defaultdict comes back plain, and the save says so, naming where it is, once
    a process (a training loop saves the same state again and again)."""
    from seedance_tasks import checkpoint
    from seedance_tasks.checkpoint import tree

    monkeypatch.setattr(tree, "_NOTED", set())
    state = {"stats": [Stats(0.5, torch.ones(2))], "counts": collections.defaultdict(int, a=1), "shape": torch.Size([2])}
    with caplog.at_level(logging.WARNING, logger="seedance_tasks.checkpoint.tree"):
        checkpoint.save(state, str(tmp_path), "r", 1)
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 2
    assert "stats/0" in said[0] and "namedtuple Stats(loss, acc)" in said[0] and "restores as one" in said[0]
    assert "counts" in said[1] and "collections.defaultdict" in said[1] and "plain dict" in said[1]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="seedance_tasks.checkpoint.tree"):
        checkpoint.save(state, str(tmp_path), "r", 2)
    assert not caplog.records  # said once
    restored = checkpoint.load(str(tmp_path), "r", 1)
    assert type(restored["stats"][0]) is tuple and type(restored["counts"]) is dict  # as it said
    assert type(restored["shape"]) is torch.Size
