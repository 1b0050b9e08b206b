"""`seedance ckpt gc`: dry run by default, manifests leave first, data to the trash, purge frees it."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

from typer.testing import CliRunner

from seedance_tasks import checkpoint, storage
from seedance_tasks.cli import app
from seedance_tasks.lifecycle import gc, journaled, tiering

from .conftest import assert_restorable, make_store


def snapshot(root):
    """{relative path: sha256} of every file under `root` (hidden ones included)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def test_dry_run_changes_nothing(tmp_path):
    store = tmp_path / "s"
    make_store(store, steps=range(0, 120, 10))
    before = snapshot(store)
    result = CliRunner().invoke(app, ["ckpt", "gc", "--store", str(store), "--keep-last", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["applied"] is False and report["checkpoints_deleted"] > 0 and report["bytes_freed"] > 0
    assert snapshot(store) == before
    human = CliRunner().invoke(app, ["ckpt", "gc", "--store", str(store), "--keep-last", "2"])
    assert "would delete" in human.output and "dry run" in human.output
    assert snapshot(store) == before


def test_apply_removes_garbage_keeps_policy_and_chains_restorable(tmp_path):
    store = tmp_path / "s"
    losses = {s: 5.0 - s / 100 if s != 30 else 0.1 for s in range(0, 120, 10)}
    digests = make_store(store, steps=range(0, 120, 10), metrics={s: {"val_loss": v} for s, v in losses.items()})
    result = CliRunner().invoke(app, ["ckpt", "gc", "--store", str(store), "--keep-last", "2", "--keep-every", "50",
                                      "--keep-best", "1", "--metric", "val_loss", "--apply", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    kept = {k["step"] for k in report["runs"][0]["kept"]}
    assert {0, 50, 100, 110, 30} <= kept  # every 50, last 2, best by val_loss
    remaining = set(checkpoint_steps(store))
    assert remaining == kept
    assert_restorable(store, "r", {s: digests[s] for s in kept})
    # garbage went to the trash: manifests and data, nothing deleted yet
    trash = store / "_seedance" / "trash" / report["trash_id"] / "r"
    deleted = {d["step"] for d in report["runs"][0]["delete"]}
    assert deleted == set(digests) - kept
    for step in deleted:
        assert (trash / f"step-{step}" / "manifest.json").is_file()
        assert not (store / "r" / f"step-{step}").exists()
    # cost report: before > after, saving = bytes freed
    assert report["cost"]["saving"]["bytes"] == report["bytes_freed"] > 0
    assert report["cost"]["before"]["bytes"] - report["cost"]["after"]["bytes"] == report["bytes_freed"]
    # the same purge command as for datasets frees the bytes
    purge = CliRunner().invoke(app, ["trash", "purge", str(store), "--older-than", "0", "--json"])
    assert purge.exit_code == 0 and json.loads(purge.output)["bytes"] >= report["bytes_freed"]
    assert not list((store / "_seedance" / "trash").rglob("*.bin"))
    assert_restorable(store, "r", {s: digests[s] for s in kept})
    # a second GC finds nothing more to delete
    again = CliRunner().invoke(app, ["ckpt", "gc", "--store", str(store), "--keep-last", "2", "--keep-every", "50",
                                     "--keep-best", "1", "--metric", "val_loss", "--apply", "--json"])
    assert json.loads(again.output)["checkpoints_deleted"] == 0


def checkpoint_steps(store, run="r"):
    from seedance_tasks.checkpoint.store import committed_steps

    return committed_steps(storage.resolve(store), run)


def test_gc_of_tiered_checkpoints_trashes_files_in_their_tier(tmp_path, lifecycle_settings, trust_tiers):
    store, warm = tmp_path / "s", tmp_path / "warm"
    trust_tiers(warm, tmp_path / "cold")
    digests = make_store(store, steps=range(0, 60, 10))
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.warm.uri = str(warm)
    settings.tiers.cold.uri = str(tmp_path / "cold")
    moved = tiering.tier(str(store), settings=settings, apply=True, now=datetime.now(UTC) + timedelta(hours=2))
    assert moved["moved"] == 6
    result = gc.collect(str(store), settings=settings, apply=True, keep_last=1, keep_every=None)
    assert result["checkpoints_deleted"] >= 1
    kept = set(checkpoint_steps(store))
    assert_restorable(store, "r", {s: digests[s] for s in kept})
    trash = list((warm / "_seedance" / "trash").rglob("*.bin"))
    assert len(trash) == sum(1 for _ in result["runs"][0]["delete"])
    assert not journaled.pending(storage.resolve(store), journaled.GC_KIND)


def test_save_after_gc_starts_a_new_keyframe_group(tmp_path):
    """GC may remove the base the next save would have used: the store starts a new group, no damage."""
    store = tmp_path / "s"
    digests = make_store(store, steps=range(0, 50, 10), keyframe_every=8)
    gc.collect(str(store), apply=True, keep_last=1, keep_every=None)
    digests.update(make_store(store, steps=[50, 60], keyframe_every=8))
    assert_restorable(store, "r", {s: digests[s] for s in checkpoint_steps(store)})
    assert checkpoint.latest_step(str(store), "r") == 60
