"""Tiering: local folders, S3 storage classes on the loopback S3 server, archive classes and thaw."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from seedance_tasks import storage
from seedance_tasks.checkpoint.store import list_checkpoints, read_manifest
from seedance_tasks.cli import app
from seedance_tasks.errors import UsageError
from seedance_tasks.lifecycle import gc, inventory, tiering

from .conftest import assert_restorable, make_store


def _classes(bucket, prefix=""):
    client = storage.boto3_client("s3")
    found = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {item["Key"]: item.get("StorageClass", "STANDARD") for item in found}


def test_local_folders_hot_warm_cold(tmp_path, lifecycle_settings, trust_tiers):
    store = tmp_path / "hot"
    trust_tiers(tmp_path / "warm", tmp_path / "cold")
    digests = make_store(store, steps=range(0, 50, 10))
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.hot.price_class = "LOCAL_SSD"
    settings.tiers.warm.uri, settings.tiers.warm.price_class = str(tmp_path / "warm"), "STANDARD_IA"
    settings.tiers.cold.uri, settings.tiers.cold.price_class = str(tmp_path / "cold"), "GLACIER_IR"
    now = datetime.now(UTC)

    dry = tiering.tier(str(store), settings=settings, now=now + timedelta(hours=2))
    assert len(dry["moves"]) == 5 and not (tmp_path / "warm").exists()
    assert dry["cost"]["after"]["tiers"]["warm"]["bytes"] == dry["cost"]["before"]["tiers"]["hot"]["bytes"]

    warm = tiering.tier(str(store), settings=settings, now=now + timedelta(hours=2), apply=True)
    assert warm["moved"] == 5 and {r["tier"] for r in list_checkpoints(str(store))} == {"warm"}
    assert not list((store / "r").rglob("*.bin"))  # sources retired to the store's trash
    assert_restorable(store, "r", digests)
    assert tiering.tier(str(store), settings=settings, now=now + timedelta(hours=3), apply=True)["moved"] == 0

    cold = tiering.tier(str(store), settings=settings, now=now + timedelta(days=2), apply=True)
    assert cold["moved"] == 5 and {r["tier"] for r in list_checkpoints(str(store))} == {"cold"}
    assert len(list((tmp_path / "cold").rglob("*.bin"))) == 5
    assert_restorable(store, "r", digests)
    before, after = cold["cost"]["before"], cold["cost"]["after"]
    assert float(after["monthly_usd"]) <= float(before["monthly_usd"]) and after["tiers"]["cold"]["files"] == 5


def test_age_counts_from_the_last_restore(tmp_path, lifecycle_settings, trust_tiers):
    trust_tiers(tmp_path / "warm", tmp_path / "cold")
    store = tmp_path / "hot"
    make_store(store, steps=[0, 10], keyframe_every=1)
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.warm.uri, settings.tiers.cold.uri = str(tmp_path / "warm"), str(tmp_path / "cold")
    later = datetime.now(UTC) + timedelta(days=2)
    inventory.record_restore(storage.resolve(store), "r", 10, when=later - timedelta(minutes=30))
    moves = {m["step"]: m["to"] for m in tiering.tier(str(store), settings=settings, now=later)["moves"]}
    assert moves == {0: "cold"}  # step 10 was restored 30 min ago: still hot


def test_s3_storage_classes_in_place_glacier_needs_thaw(s3_bucket, tmp_path, lifecycle_settings):
    store = f"s3://{s3_bucket}/ckpt"
    digests = make_store(store, steps=range(0, 40, 10))
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.cold.storage_class = "GLACIER"
    now = datetime.now(UTC)

    tiering.tier(store, settings=settings, now=now + timedelta(hours=2), apply=True)
    data = {k: v for k, v in _classes(s3_bucket, "ckpt/r/").items() if k.endswith(".bin")}
    assert len(data) == 4 and set(data.values()) == {"STANDARD_IA"}
    assert set(v for k, v in _classes(s3_bucket, "ckpt/r/").items() if k.endswith(".json")) == {"STANDARD"}
    assert_restorable(store, "r", digests)

    tiering.tier(store, settings=settings, now=now + timedelta(days=2), apply=True)
    assert {v for k, v in _classes(s3_bucket, "ckpt/r/").items() if k.endswith(".bin")} == {"GLACIER"}
    assert {r["tier"] for r in list_checkpoints(store)} == {"cold"}

    out = tmp_path / "restored.pt"
    runner = CliRunner()
    refused = runner.invoke(app, ["ckpt", "get", "--store", store, "--run", "r", "--step", "30", "--out", str(out)])
    assert refused.exit_code == 3 and not out.exists()  # RefusedError
    assert "GLACIER" in refused.output and "ckpt thaw" in refused.output, refused.output

    thawed = runner.invoke(app, ["ckpt", "thaw", "--store", store, "--run", "r", "--step", "30", "--json"])
    assert thawed.exit_code == 0, thawed.output
    report = json.loads(thawed.output)
    steps = {f["step"] for f in report["files"]}
    assert steps == {30, *read_manifest(storage.resolve(store), "r", 30)["chain"]}  # its chain too
    assert report["requested"] == len(report["files"]) and report["ready"]  # moto restores at once
    again = json.loads(runner.invoke(app, ["ckpt", "thaw", "--store", store, "--run", "r", "--step", "30",
                                           "--json"]).output)
    assert again["requested"] == 0  # idempotent
    got = runner.invoke(app, ["ckpt", "get", "--store", store, "--run", "r", "--step", "30", "--out", str(out)])
    assert got.exit_code == 0, got.output
    assert_restorable(store, "r", {30: digests[30]})

    # GC of archived objects: S3 cannot copy them to the trash, so they are deleted (after the manifests)
    result = gc.collect(store, settings=settings, apply=True, keep_last=1, keep_every=None)
    gone = {d["step"] for d in result["runs"][0]["delete"]}
    left = [k for k in _classes(s3_bucket, "ckpt/r/") if k.endswith((".bin", ".json"))]
    assert gone and not [k for k in left for s in gone if f"/step-{s}/" in k], left
    assert_restorable(store, "r", {30: digests[30]})


def test_base_on_a_colder_tier_than_its_delta_across_s3_and_local(s3_bucket, tmp_path, lifecycle_settings,
                                                                   trust_tiers):
    """Hot local store, warm = S3 prefix (STANDARD_IA), cold = another bucket (DEEP_ARCHIVE)."""
    cold_bucket = f"{s3_bucket}-cold"
    trust_tiers(f"s3://{s3_bucket}/warm", f"s3://{cold_bucket}/cold")
    storage.boto3_client("s3").create_bucket(Bucket=cold_bucket)
    store = tmp_path / "hot"
    digests = make_store(store, steps=range(0, 40, 10), keyframe_every=4)
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.warm.uri = f"s3://{s3_bucket}/warm"
    settings.tiers.cold.uri, settings.tiers.cold.storage_class = f"s3://{cold_bucket}/cold", "DEEP_ARCHIVE"
    later = datetime.now(UTC) + timedelta(days=2)
    for step in (10, 20, 30):  # the deltas were restored 2 h ago: warm; their keyframe (0) goes cold
        inventory.record_restore(storage.resolve(store), "r", step, when=later - timedelta(hours=2))
    result = tiering.tier(str(store), settings=settings, now=later, apply=True)
    assert {(m["step"], m["to"]) for m in result["moves"]} == {(0, "cold"), (10, "warm"), (20, "warm"), (30, "warm")}
    assert set(_classes(cold_bucket).values()) == {"DEEP_ARCHIVE"}
    assert set(_classes(s3_bucket, "warm/").values()) == {"STANDARD_IA"}
    assert read_manifest(storage.resolve(store), "r", 30)["chain"][-1] == 0

    refused = CliRunner().invoke(app, ["ckpt", "get", "--store", str(store), "--run", "r", "--step", "30",
                                       "--out", str(tmp_path / "x.pt")])
    assert refused.exit_code == 3 and "DEEP_ARCHIVE" in refused.output and "thaw" in refused.output
    thawed = json.loads(CliRunner().invoke(app, ["ckpt", "thaw", "--store", str(store), "--run", "r", "--step", "30",
                                                 "--json"]).output)
    assert [f["step"] for f in thawed["files"] if f["action"] == "restore requested"] == [0]
    assert_restorable(store, "r", digests)


def test_latest_checkpoint_of_each_run_stays_hot(tmp_path, lifecycle_settings, trust_tiers):
    trust_tiers(tmp_path / "warm", tmp_path / "cold")
    store = tmp_path / "hot"
    make_store(store, steps=[0, 10, 20], keyframe_every=1)
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.warm.uri, settings.tiers.cold.uri = str(tmp_path / "warm"), str(tmp_path / "cold")
    assert settings.tiers.keep_latest_hot  # the default
    tiering.tier(str(store), settings=settings, now=datetime.now(UTC) + timedelta(days=2), apply=True)
    assert {r["step"]: r["tier"] for r in list_checkpoints(str(store))} == {0: "cold", 10: "cold", 20: "hot"}


@pytest.mark.parametrize("where", ["store", "store/", "store/warm", "alias"])
def test_a_tier_location_that_is_the_store_or_inside_it_is_refused(tmp_path, lifecycle_settings, where):
    """Tiering into the store itself used to point the manifest at the retired sources."""
    store = tmp_path / "store"
    digests = make_store(store, steps=[0, 10], keyframe_every=1)
    (tmp_path / "alias").symlink_to(store)
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.warm.uri = str(tmp_path / where)
    before = sorted(p for p in store.rglob("*") if "_seedance" not in p.parts)
    with pytest.raises(UsageError, match="lifecycle.tiers.warm.uri") as refused:
        tiering.tier(str(store), settings=settings, apply=True, now=datetime.now(UTC) + timedelta(hours=2))
    assert "outside the store" in refused.value.hint
    assert sorted(p for p in store.rglob("*") if "_seedance" not in p.parts) == before
    assert_restorable(store, "r", digests)


def test_local_store_without_tier_locations_moves_nothing_and_says_why(tmp_path):
    store = tmp_path / "hot"
    make_store(store, steps=[0, 10], keyframe_every=1)
    result = CliRunner().invoke(app, ["ckpt", "tier", "--store", str(store), "--apply", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["moves"] == [] and any("tiers.warm.uri" in note for note in report["notes"])


def test_a_restore_is_recorded_and_resets_the_age(tmp_path, lifecycle_settings):
    from seedance_tasks import checkpoint

    store = tmp_path / "hot"
    make_store(store, steps=[0, 10], keyframe_every=1)
    assert inventory.last_restored(storage.resolve(store), "r") == {}
    checkpoint.load(str(store), "r", 0)
    restored = inventory.last_restored(storage.resolve(store), "r")
    assert set(restored) == {0} and (datetime.now(UTC) - restored[0]).total_seconds() < 600
