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


def _stop_chain_short(store, run: str, step: int) -> list[int]:
    """Rewrite `run`/`step`'s manifest as an unsealed one whose chain names only its base (a
    restore still reads every base of that base); returns the chain it had."""
    from seedance_tasks.checkpoint import catalog
    from seedance_tasks.checkpoint.manifest import DIGEST_KEY, to_bytes

    location = storage.resolve(str(store))
    path = catalog.manifest_path(location, run, step)
    manifest = json.loads(storage.read_bytes(location.fs, path))
    full = manifest["chain"]
    manifest.pop(DIGEST_KEY, None)
    manifest["chain"], manifest["depth"] = full[:1], 1
    storage.write_bytes_atomic(location.fs, path, to_bytes(manifest))
    return full


def test_thaw_follows_the_bases_of_bases_when_a_chain_stops_short(s3_bucket, lifecycle_settings):
    """Thaw used to read only the top manifest's chain: the bases of its base stayed archived."""
    store = f"s3://{s3_bucket}/ckpt"
    digests = make_store(store, steps=range(0, 40, 10), keyframe_every=4)
    full = _stop_chain_short(store, "r", 30)
    assert len(full) >= 2  # a base of its base that only the base's manifest names
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.cold.storage_class = "GLACIER"
    tiering.tier(store, settings=settings, now=datetime.now(UTC) + timedelta(days=2), apply=True)
    assert {v for k, v in _classes(s3_bucket, "ckpt/r/").items() if k.endswith(".bin")} == {"GLACIER"}

    thawed = CliRunner().invoke(app, ["ckpt", "thaw", "--store", store, "--run", "r", "--step", "30", "--json"])
    assert thawed.exit_code == 0, thawed.output
    report = json.loads(thawed.output)
    assert {f["step"] for f in report["files"]} == {30, *full} and report["ready"]
    assert_restorable(store, "r", {30: digests[30]})


def _two_runs(tmp_path, lifecycle_settings, warm):
    store = tmp_path / "hot"
    digests = {run: make_store(store, run=run, steps=[0, 10], keyframe_every=1) for run in ("a", "b")}
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.warm.uri = warm
    return store, digests, settings


def _left_as_it_was(store, run, digests):
    """`run` is where it was before the failed pass: hot, restorable, no journal pending."""
    from seedance_tasks import journal

    assert {r["tier"] for r in list_checkpoints(str(store)) if r["run"] == run} == {"hot"}
    assert journal.pending(storage.resolve(store)) == []
    assert_restorable(store, run, digests)


def test_a_run_whose_copy_fails_is_rolled_back_and_the_others_are_tiered(tmp_path, lifecycle_settings,
                                                                          trust_tiers, monkeypatch):
    """Out of disk space while copying run a used to stop the whole pass: b was never tiered."""
    import errno

    warm = tmp_path / "warm"
    trust_tiers(warm)
    store, digests, settings = _two_runs(tmp_path, lifecycle_settings, str(warm))
    real_copy = tiering.copy_verified

    def disk_full_for_run_a(src, dst, storage_class):
        real_copy(src, dst, storage_class)  # the copy is written: the rollback must remove it
        if src.rel.startswith("a/"):
            raise OSError(errno.ENOSPC, "No space left on device", storage.resolve(dst.root).join(dst.rel))
        return {}

    monkeypatch.setattr(tiering, "copy_verified", disk_full_for_run_a)
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__WARM_AFTER", "0")
    monkeypatch.setenv("SEEDANCE__LIFECYCLE__TIERS__KEEP_LATEST_HOT", "false")
    result = CliRunner().invoke(app, ["ckpt", "tier", "--store", str(store), "--apply", "--json"])
    assert result.exit_code == 6, result.output  # ResourceError: disk full
    assert "error: tiering failed for 1 run(s) (a)" in result.output and "no space left" in result.output
    report = json.loads(result.stdout)
    assert [(m["run"], m["step"]) for m in report["moves"]] == [("b", 0), ("b", 10)] and report["moved"] == 2
    assert [(f["run"], f["step"], f["recovery"]) for f in report["failed"]] == [("a", 0, "rolled back")]
    assert {r["tier"] for r in list_checkpoints(str(store)) if r["run"] == "b"} == {"warm"}
    _left_as_it_was(store, "a", digests["a"])
    assert not [p for p in (warm / "a").rglob("*") if p.is_file()]  # no orphan copy, hidden or not
    assert_restorable(store, "b", digests["b"])

    monkeypatch.setattr(tiering, "copy_verified", real_copy)  # space freed: the next pass tiers a
    again = tiering.tier(str(store), settings=settings, apply=True, now=datetime.now(UTC) + timedelta(hours=2))
    assert [(m["run"], m["step"]) for m in again["moves"]] == [("a", 0), ("a", 10)] and again["failed"] == []
    assert_restorable(store, "a", digests["a"])


def test_a_tier_bucket_that_does_not_exist_fails_every_run_and_changes_nothing(s3_bucket, tmp_path,
                                                                              lifecycle_settings, trust_tiers):
    warm = f"s3://{s3_bucket}-missing/warm"
    trust_tiers(warm)
    store, digests, settings = _two_runs(tmp_path, lifecycle_settings, warm)
    with pytest.raises(tiering.TieringFailedError) as failed:
        tiering.tier(str(store), settings=settings, apply=True, now=datetime.now(UTC) + timedelta(hours=2))
    report = failed.value.result
    assert [f["run"] for f in report["failed"]] == ["a", "b"] and report["moved"] == 0
    assert "(a, b)" in failed.value.message and "NoSuchBucket" in failed.value.message and warm in failed.value.message
    assert failed.value.exit_code != 70  # a clear error, not a bug report
    for run in ("a", "b"):
        _left_as_it_was(store, run, digests[run])
