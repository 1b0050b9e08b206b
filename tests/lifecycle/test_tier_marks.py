"""A local tier location whose volume is not mounted: its mountpoint is an empty folder on the root
disk. Tiering must not write there and GC must not drop the checkpoints whose files it cannot see."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from seedance_tasks.checkpoint.store import list_checkpoints
from seedance_tasks.errors import RefusedError
from seedance_tasks.lifecycle import gc, tier_marks, tiering

from .conftest import assert_restorable, make_store

LATER = timedelta(hours=2)


def _steps(store, run="r"):
    return [item["step"] for item in list_checkpoints(str(store), run)]


def _settings(lifecycle_settings, warm, cold=None):
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.warm.uri = str(warm)
    settings.tiers.cold.uri = str(cold) if cold else None
    return settings


def _files_under(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_an_unmounted_tier_volume_is_not_written_to_and_gc_leaves_its_checkpoints(
        tmp_path, lifecycle_settings, trust_tiers):
    store, warm, volume = tmp_path / "s", tmp_path / "warm", tmp_path / "volume"
    trust_tiers(warm)
    digests = make_store(store, steps=range(0, 40, 10), keyframe_every=1)
    settings = _settings(lifecycle_settings, warm)
    assert tiering.tier(str(store), ["r"], settings=settings, apply=True,
                        now=datetime.now(UTC) + LATER)["moved"] == 4
    warm.rename(volume)  # "umount": the volume's files go away, an empty mountpoint stays
    warm.mkdir()

    result = gc.collect(str(store), settings=settings, apply=True, keep_last=1, keep_every=None)
    assert (result["checkpoints_deleted"], result["bytes_freed"]) == (0, 0)
    refused = result["runs"][0]["refused"]
    assert [item["step"] for item in refused] == [10, 20]  # 0: every 100th; 30: the last
    assert all("not mounted" in item["reason"] and str(warm) in item["reason"] for item in refused)
    assert _steps(store) == [0, 10, 20, 30]

    for apply in (False, True):
        with pytest.raises(RefusedError, match="not mounted") as caught:
            tiering.tier(str(store), settings=settings, apply=apply, now=datetime.now(UTC) + LATER)
        assert "lifecycle.tiers.warm.uri" in caught.value.hint
    assert _files_under(warm) == []  # nothing landed on the "root disk"

    warm.rmdir()
    volume.rename(warm)  # mounted again: everything is where the manifests say
    assert_restorable(store, "r", digests)
    make_store(store, steps=[40], keyframe_every=1)
    assert tiering.tier(str(store), settings=settings, apply=True, now=datetime.now(UTC) + LATER)["moved"] == 1
    assert gc.collect(str(store), settings=settings, apply=True, keep_last=1, keep_every=None)["checkpoints_deleted"] == 3


def test_a_first_tiering_below_a_declared_but_unmounted_mountpoint_is_refused(
        tmp_path, lifecycle_settings, trust_tiers, monkeypatch):
    store, mountpoint = tmp_path / "s", tmp_path / "mnt" / "cold"
    mountpoint.mkdir(parents=True)
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# comment\nUUID=abc / ext4 defaults 0 1\n/dev/sdb1 {mountpoint} xfs defaults,nofail 0 2\n")
    monkeypatch.setattr(tier_marks, "FSTAB", str(fstab))
    warm = mountpoint / "ckpt-warm"
    trust_tiers(warm)
    make_store(store, steps=range(0, 30, 10), keyframe_every=1)
    settings = _settings(lifecycle_settings, warm)
    with pytest.raises(RefusedError, match=f"below {mountpoint}.*not mounted"):
        tiering.tier(str(store), settings=settings, apply=True, now=datetime.now(UTC) + LATER)
    assert _files_under(mountpoint) == [] and _steps(store) == [0, 10, 20]
    assert not (store / "_seedance" / "tier-marks").exists()

    fstab.write_text("UUID=abc / ext4 defaults 0 1\n")  # not a mountpoint (any more): a plain folder
    assert tiering.tier(str(store), settings=settings, apply=True, now=datetime.now(UTC) + LATER)["moved"] == 3
    assert (warm / "_seedance" / "tier-mark.json").is_file()
