"""What GC and tiering report comes from what they find, not from what a manifest claims: a manifest
is untrusted input, and one damaged while a pass runs is reported, never silently dropped."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from seedance_tasks.lifecycle import gc, tiering

from .conftest import make_store


def _file_bytes(store, steps):
    return sum(p.stat().st_size for step in steps for p in (store / "r" / f"step-{step}").glob("*.bin"))


def test_gc_reports_the_bytes_on_disk_not_the_sizes_a_manifest_claims(tmp_path, lifecycle_settings):
    store = tmp_path / "s"
    make_store(store, steps=range(0, 40, 10), keyframe_every=1)
    path = store / "r" / "step-10" / "manifest.json"
    manifest = json.loads(path.read_text())
    for entry in manifest["files"].values():
        entry["size"] = 10**15  # a petabyte "freed": files are not sealed, anyone can write this
    path.write_text(json.dumps(manifest))
    expected = _file_bytes(store, [10, 20])
    for apply in (False, True):
        result = gc.collect(str(store), settings=lifecycle_settings, apply=apply, keep_last=1, keep_every=None)
        run = result["runs"][0]
        assert sorted(item["step"] for item in run["delete"]) == [10, 20]
        assert result["bytes_freed"] == expected == sum(item["bytes"] for item in run["delete"])
        assert result["cost"]["saving"]["bytes"] == expected


def test_a_manifest_damaged_during_tiering_is_reported_and_no_saving_claimed_for_it(
        tmp_path, lifecycle_settings, trust_tiers, monkeypatch):
    store, warm = tmp_path / "s", tmp_path / "warm"
    trust_tiers(warm)
    make_store(store, steps=range(0, 30, 10), keyframe_every=1)
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.warm.uri = str(warm)
    moving = tiering.move_checkpoint

    def move_then_damage(store_location, manifest, *args, **kwargs):
        outcome = moving(store_location, manifest, *args, **kwargs)
        if manifest["step"] == 10:  # someone else's write breaks an already moved manifest meanwhile
            (store / "r" / "step-0" / "manifest.json").write_text('{"format": 2, "run": "r"')
        return outcome

    monkeypatch.setattr(tiering, "move_checkpoint", move_then_damage)
    result = tiering.tier(str(store), settings=settings, apply=True, now=datetime.now(UTC) + timedelta(hours=2))
    assert result["moved"] == 3
    assert [(item["run"], item["step"]) for item in result["damaged"]] == [("r", 0)]
    assert result["cost"]["after"]["checkpoints"] == result["cost"]["before"]["checkpoints"] == 3
    assert result["cost"]["saving"]["bytes"] == 0  # tiering moves bytes, it frees none


def test_gc_of_an_s3_store_reports_the_bytes_of_the_objects(s3_bucket, lifecycle_settings):
    from seedance_tasks import storage

    store = f"s3://{s3_bucket}/ckpt"
    make_store(store, steps=range(0, 40, 10), keyframe_every=1)
    client = storage.boto3_client("s3")
    key = "ckpt/r/step-10/manifest.json"
    manifest = json.loads(client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    for entry in manifest["files"].values():
        entry["size"] *= 1000
    client.put_object(Bucket=s3_bucket, Key=key, Body=json.dumps(manifest).encode())
    objects = client.list_objects_v2(Bucket=s3_bucket, Prefix="ckpt/r/step-")["Contents"]
    expected = sum(item["Size"] for item in objects if item["Key"].startswith(("ckpt/r/step-10/", "ckpt/r/step-20/"))
                   and item["Key"].endswith(".bin"))
    result = gc.collect(store, settings=lifecycle_settings, apply=True, keep_last=1, keep_every=None)
    assert not result["damaged"]  # step 0: every 100th; 30: the last, result["damaged"]
    assert result["checkpoints_deleted"] == 2 and result["bytes_freed"] == expected
