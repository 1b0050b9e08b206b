"""`seedance ckpt gc`: dry run by default, manifests leave first, data to the trash, purge frees it."""

from __future__ import annotations

import hashlib
import json
import os
import time
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


def test_a_run_named_twice_is_counted_once(tmp_path):
    store = tmp_path / "s"
    make_store(store, steps=range(0, 50, 10), keyframe_every=1)
    once, twice = ({"gc": gc.collect(str(store), names, keep_last=1, keep_every=1000),
                    "tier": tiering.tier(str(store), names, now=datetime.now(UTC) + timedelta(days=2))}
                   for names in (["r"], ["r", "r"]))
    assert twice["gc"]["checkpoints_deleted"] == once["gc"]["checkpoints_deleted"] == 3
    assert [p["run"] for p in twice["gc"]["runs"]] == ["r"]
    assert twice["gc"]["cost"] == once["gc"]["cost"] and twice["tier"]["cost"] == once["tier"]["cost"]


def test_a_run_the_store_does_not_hold_is_an_error_naming_the_runs(tmp_path):
    store = tmp_path / "s"
    make_store(store, steps=[0, 10], keyframe_every=1)
    before = snapshot(store)
    for command in (["gc", "--apply"], ["tier", "--apply"]):
        result = CliRunner().invoke(app, ["ckpt", *command, "--store", str(store), "--run", "rr"])
        assert result.exit_code == 2, result.output
        said = " ".join(result.output.split())
        assert "error: no run 'rr' in checkpoint store" in said and "hint: runs there: r;" in said
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


def test_checkpoints_on_a_missing_tier_location_are_left_alone(tmp_path, lifecycle_settings, trust_tiers):
    """An unmounted warm volume: GC neither drops the manifests (its files would be orphans once
    it is back) nor reports bytes freed that it never found; once it is back, GC collects them."""
    store, warm = tmp_path / "s", tmp_path / "warm"
    trust_tiers(warm, tmp_path / "cold")
    make_store(store, steps=range(0, 40, 10), keyframe_every=1)
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.warm.uri, settings.tiers.cold.uri = str(warm), str(tmp_path / "cold")
    assert tiering.tier(str(store), settings=settings, apply=True, now=datetime.now(UTC) + timedelta(hours=2))["moved"] == 4
    warm.rename(tmp_path / "unmounted")
    result = gc.collect(str(store), settings=settings, apply=True, keep_last=1, keep_every=None)
    assert (result["checkpoints_deleted"], result["bytes_freed"]) == (0, 0)
    refused = result["runs"][0]["refused"]
    assert [item["step"] for item in refused] == [10, 20] and str(warm) in refused[0]["reason"]  # 0: every 100th
    assert checkpoint_steps(store) == [0, 10, 20, 30]
    out = CliRunner().invoke(app, ["ckpt", "gc", "--store", str(store), "--keep-last", "1", "--keep-every", "1000"])
    said = " ".join(out.output.split())
    assert "left alone r/step-10" in said and "does not exist (unmounted, or deleted?)" in said
    (tmp_path / "unmounted").rename(warm)
    again = gc.collect(str(store), settings=settings, apply=True, keep_last=1, keep_every=None)
    assert again["checkpoints_deleted"] == 2 and checkpoint_steps(store) == [0, 30]
    assert len(list((warm / "_seedance" / "trash").rglob("*.bin"))) == 2


def test_keep_best_by_a_metric_no_checkpoint_records_leaves_the_run_alone(tmp_path):
    """A misspelt --metric ranks nothing: GC would collect the very checkpoints keep_best protects."""
    store = tmp_path / "s"
    losses = {0: 5.0, 10: 4.0, 20: 1.0, 30: 3.0, 40: 2.0}
    make_store(store, steps=losses, keyframe_every=1, metrics={s: {"val_loss": v} for s, v in losses.items()})
    options = ["ckpt", "gc", "--store", str(store), "--keep-last", "1", "--keep-every", "1000", "--keep-best", "1"]
    typo = CliRunner().invoke(app, [*options, "--metric", "val_los", "--apply"])
    assert typo.exit_code == 0, typo.output
    said = " ".join(typo.output.split())
    assert "deleted 0 checkpoint(s)" in said and "run r left alone: no checkpoint records metric 'val_los'" in said
    assert checkpoint_steps(store) == [0, 10, 20, 30, 40]
    right = CliRunner().invoke(app, [*options, "--metric", "val_loss", "--apply", "--json"])
    assert json.loads(right.output)["runs"][0]["left_alone"] is None
    assert checkpoint_steps(store) == [0, 20, 40]  # every 1000th, the best, the last


def test_save_after_gc_starts_a_new_keyframe_group(tmp_path):
    """GC may remove the base the next save would have used: the store starts a new group, no damage."""
    store = tmp_path / "s"
    digests = make_store(store, steps=range(0, 50, 10), keyframe_every=8)
    gc.collect(str(store), apply=True, keep_last=1, keep_every=None)
    digests.update(make_store(store, steps=[50, 60], keyframe_every=8))
    assert_restorable(store, "r", {s: digests[s] for s in checkpoint_steps(store)})
    assert checkpoint.latest_step(str(store), "r") == 60


def _age(path, seconds):
    moment = datetime.now(UTC).timestamp() - seconds
    os.utime(path, (moment, moment))


def test_files_of_interrupted_saves_go_to_the_trash_once_old_and_young_ones_stay(tmp_path):
    store = tmp_path / "s"
    digests = make_store(store, steps=range(0, 40, 10))
    run = store / "r"
    killed = run / "step-50"  # a save killed before its commit: data, no manifest
    killed.mkdir()
    (killed / "data-a1b2c3d4e5f6-0000.bin").write_bytes(b"x" * 5000)
    (killed / "data-a1b2c3d4e5f6-0001.bin").write_bytes(b"y" * 3000)
    loser = run / "step-30" / "data-0badc0ffee00-0000.bin"  # the attempt that lost the commit race
    loser.write_bytes(b"z" * 2000)
    writing = run / "step-60"  # a save still writing: young, left alone
    writing.mkdir()
    (writing / "data-feedfacecafe-0000.bin").write_bytes(b"w" * 1000)
    for path in (*killed.iterdir(), loser):
        _age(path, 2 * 86400)
    committed = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.rglob("*")
                 if p.is_file() and "step-50" not in str(p) and "step-60" not in str(p) and p != loser}

    dry = CliRunner().invoke(app, ["ckpt", "gc", "--store", str(store), "--keep-last", "10", "--json"])
    assert dry.exit_code == 0, dry.output
    report = json.loads(dry.output)
    assert report["stray_files"] == 3 and report["stray_bytes"] == 10000 and report["checkpoints_deleted"] == 0
    assert sorted(item["rel"] for item in report["runs"][0]["strays"]) == [
        "r/step-30/data-0badc0ffee00-0000.bin", "r/step-50/data-a1b2c3d4e5f6-0000.bin",
        "r/step-50/data-a1b2c3d4e5f6-0001.bin"]
    assert loser.exists() and killed.exists()  # a dry run moves nothing

    human = CliRunner().invoke(app, ["ckpt", "gc", "--store", str(store), "--keep-last", "10"])
    assert "would move 3 file(s) of interrupted saves" in human.output

    applied = CliRunner().invoke(app, ["ckpt", "gc", "--store", str(store), "--keep-last", "10", "--apply", "--json"])
    assert applied.exit_code == 0, applied.output
    trash = store / "_seedance" / "trash" / json.loads(applied.output)["trash_id"] / "r"
    assert (trash / "step-30" / loser.name).read_bytes() == b"z" * 2000  # in the trash, not deleted
    assert (trash / "step-50" / "data-a1b2c3d4e5f6-0001.bin").is_file() and not killed.exists()
    assert not loser.exists() and (writing / "data-feedfacecafe-0000.bin").exists()
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in committed} == committed
    assert_restorable(store, "r", digests)
    again = json.loads(CliRunner().invoke(app, ["ckpt", "gc", "--store", str(store), "--keep-last", "10",
                                                "--json"]).output)
    assert again["stray_files"] == 0


def test_only_files_that_no_committed_manifest_names_are_strays(tmp_path):
    """Files a manifest names stay, wherever its other files went; only unnamed ones are strays."""
    from seedance_tasks.checkpoint import catalog

    store = tmp_path / "s"
    make_store(store, steps=range(0, 30, 10))
    root = storage.resolve(str(store))
    found = catalog.manifests(root, "r")
    assert catalog.stray_files(root, "r", found) == []
    assert {item["rel"] for item in catalog.stray_files(root, "r", found[1:])} == {
        f"r/step-0/{name}" for name in (*found[0]["files"], "manifest.json")}  # step 0 unnamed: all of it


def test_a_save_killed_before_its_commit_leaves_files_that_gc_trashes(tmp_path):
    """kill -9 between a save's data files and its manifest, the retry commits the step; the killed
    attempt's files are named by no manifest, and GC moves them to the trash (once 10 minutes old, the least `stray_min_age` accepted)."""
    import torch

    from tests.chaos.harness import result_of, run_task

    store = tmp_path / "s"
    args = {"store_uri": str(store), "run": "r", "step": 10}
    killed = run_task("tests.chaos.tasks:save_checkpoint", args, fault_at=1, match="ckpt.commit.before")
    assert killed.returncode == -9, killed.stderr
    left = sorted(p.name for p in (store / "r" / "step-10").iterdir())
    assert left and all(name.startswith("data-") for name in left)  # data written, no manifest
    result_of(run_task("tests.chaos.tasks:save_checkpoint", args))  # the retry: another attempt
    strays = {f"r/step-10/{name}" for name in left}
    settings = gc.load_lifecycle_settings(stray_min_age=600)  # the least accepted
    assert gc.collect(str(store), settings=settings, apply=False)["stray_files"] == 0  # too young yet
    for rel in strays:  # the interrupted save is now 11 minutes old
        os.utime(store / rel, (time.time() - 660, time.time() - 660))
    report = gc.collect(str(store), settings=settings, apply=True)
    assert {item["rel"] for item in report["runs"][0]["strays"]} == strays and report["checkpoints_deleted"] == 0
    trash = store / "_seedance" / "trash" / report["trash_id"]
    assert all((trash / rel).is_file() for rel in strays)
    manifest = json.loads((store / "r" / "step-10" / "manifest.json").read_text())
    assert sorted(p.name for p in (store / "r" / "step-10").iterdir()) == sorted(["manifest.json", *manifest["files"]])
    state = checkpoint.load(str(store), "r", 10)
    assert state["step"] == 10 and torch.equal(state["w"], torch.arange(20_000, dtype=torch.float32) / 17)


def test_a_stray_min_age_below_ten_minutes_is_refused_with_the_key_named():
    """Below it GC could trash the files of a save still writing (a save holds no lease)."""
    import pytest

    from seedance_tasks.errors import ConfigError

    with pytest.raises(ConfigError, match="stray_min_age.*greater than or equal to 600"):
        gc.load_lifecycle_settings(stray_min_age=0)
    assert gc.load_lifecycle_settings(stray_min_age="10m").stray_min_age == 600
