"""Manifests, journals and symlinks are untrusted: nothing outside the store is ever deleted,
moved or re-tiered by `gc`, `tier` or `thaw`, whatever a manifest or journal says."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from typer.testing import CliRunner

from seedance_tasks import journal, lease, storage
from seedance_tasks.checkpoint import catalog
from seedance_tasks.cli import app
from seedance_tasks.errors import IntegrityError
from seedance_tasks.lifecycle import gc, journaled

from .conftest import assert_restorable, make_store

runner = CliRunner()


def _manifest_file(store, step, run="r"):
    return store / run / f"step-{step}" / "manifest.json"


def _tamper(store, step, change, run="r"):
    path = _manifest_file(store, step, run)
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def _foreign_uri(target, root):
    def change(manifest):
        name = sorted(manifest["files"])[0]
        manifest["files"][name].update(uri=str(target), root=str(root), tier="cold", storage_class="GLACIER")
    return change


def _rename_file(new_name):
    def change(manifest):
        old = sorted(manifest["files"])[0]
        manifest["files"][new_name] = manifest["files"].pop(old)
        for tensor in manifest["tensors"]:
            for chunk in tensor["chunks"]:
                chunk["file"] = new_name if chunk["file"] == old else chunk["file"]
    return change


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def victim(tmp_path):
    """A file outside the store that a tampered manifest points at."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    target = outside / "precious.bin"
    target.write_bytes(os.urandom(4096))
    return target


TAMPERS = {
    "foreign uri (GLACIER)": lambda victim: _foreign_uri(victim, victim.parent),
    "uri under a trusted-looking root": lambda victim: _foreign_uri(victim, "/"),
    "file name with ../../": lambda victim: _rename_file("../../" + victim.name),
    "absolute file name": lambda victim: _rename_file(str(victim)),
    "wrong run": lambda victim: (lambda m: m.update(run="other")),
    "wrong step": lambda victim: (lambda m: m.update(step=m["step"] + 1)),
    "id that is a path": lambda victim: (lambda m: m.update(id="../../x")),
}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_a_tampered_manifest_is_refused_by_gc_tier_and_thaw(tmp_path, victim, tamper, trust_tiers):
    store = tmp_path / "s"
    trust_tiers(tmp_path / "warm", tmp_path / "cold")
    make_store(store, steps=range(0, 50, 10), keyframe_every=1)
    before = _digest(victim)
    _tamper(store, 10, TAMPERS[tamper](victim))

    with pytest.raises(IntegrityError) as caught:
        catalog.read_manifest(storage.resolve(store), "r", 10)
    assert "step-10/manifest.json" in caught.value.message and "refused" in caught.value.message

    for command in (["gc", "--keep-last", "1", "--keep-every", "1000"], ["tier"]):
        result = runner.invoke(app, ["ckpt", *command, "--store", str(store), "--apply"])
        assert result.exit_code == 4, result.output
        assert "error:" in result.output and "manifest.json" in result.output and "Traceback" not in result.output
    thawed = runner.invoke(app, ["ckpt", "thaw", "--store", str(store), "--run", "r", "--step", "10"])
    assert thawed.exit_code == 4, thawed.output
    assert victim.is_file() and _digest(victim) == before
    assert catalog.committed_steps(storage.resolve(store), "r") == [0, 10, 20, 30, 40]  # nothing collected


def test_a_tampered_manifest_on_s3_cannot_reach_another_bucket(s3_bucket, trust_tiers):
    client = storage.boto3_client("s3")
    other = f"{s3_bucket}-other"
    client.create_bucket(Bucket=other)
    client.put_object(Bucket=other, Key="precious.bin", Body=b"keep me")
    store = f"s3://{s3_bucket}/ckpt"
    make_store(store, steps=[0, 10, 20], keyframe_every=1)
    key = "ckpt/r/step-10/manifest.json"
    manifest = json.loads(client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    _foreign_uri(f"s3://{other}/precious.bin", f"s3://{other}")(manifest)
    client.put_object(Bucket=s3_bucket, Key=key, Body=json.dumps(manifest).encode())
    result = runner.invoke(app, ["ckpt", "gc", "--store", store, "--keep-last", "1", "--keep-every", "1000", "--apply"])
    assert result.exit_code == 4 and "files[" in result.output, result.output
    assert runner.invoke(app, ["ckpt", "thaw", "--store", store, "--run", "r", "--step", "10"]).exit_code == 4
    assert client.get_object(Bucket=other, Key="precious.bin")["Body"].read() == b"keep me"
    assert client.head_object(Bucket=other, Key="precious.bin").get("StorageClass", "STANDARD") == "STANDARD"


def test_a_tampered_gc_journal_is_quarantined_not_obeyed(tmp_path, victim):
    store = tmp_path / "s"
    digests = make_store(store, steps=[0, 10], keyframe_every=1)
    location = storage.resolve(store)
    outside_root = journal.Journal.begin(location, journaled.new_id(journaled.GC_KIND, "r"), journaled.GC_KIND,
                                         [], [], external=[{"root": str(victim.parent), "rel": victim.name,
                                                            "delete": True}])
    escaping = journal.Journal.begin(location, journaled.new_id(journaled.GC_KIND, "r"), journaled.GC_KIND, [], [])
    for entry in (outside_root, escaping):  # as if killed past their point of no return
        entry.state = journal.PUBLISHING
        storage.write_json_atomic(location.fs, entry.path, entry.to_json())
    path = store / "_seedance" / "journal" / f"{escaping.run_id}.json"
    raw = json.loads(path.read_text())
    raw["retires"] = ["../../elsewhere/precious.bin"]  # a path leaving the store
    path.write_text(json.dumps(raw))

    result = gc.collect(str(store), ["r"], apply=True, keep_last=5)
    assert sorted(item["run_id"] for item in result["recovered"] if item["action"] == "refused") == sorted(
        [outside_root.run_id, escaping.run_id])
    for entry in (outside_root, escaping):
        assert (store / "_seedance" / "quarantine" / "journals" / f"{entry.run_id}.json").is_file()
    assert victim.is_file()
    assert_restorable(store, "r", digests)


def test_a_tampered_tier_journal_cannot_delete_outside_copies(tmp_path, victim, trust_tiers):
    store = tmp_path / "s"
    trust_tiers(tmp_path / "warm", tmp_path / "cold")
    make_store(store, steps=[0, 10], keyframe_every=1)
    location = storage.resolve(store)
    manifest = catalog.read_manifest(location, "r", 0)
    name = sorted(manifest["files"])[0]
    moves = [{"name": name, "src": {"root": location.uri, "rel": f"r/step-0/{name}"},
              "dst": {"root": str(victim.parent), "rel": victim.name}, "in_place": False,
              "storage_class": None, "src_storage_class": None}]
    journal.Journal.begin(location, journaled.new_id(journaled.TIER_KIND, "r"), journaled.TIER_KIND, [], [],
                          meta={"run": "r", "step": 0, "id": manifest["id"], "target": "warm", "moves": moves})
    result = runner.invoke(app, ["ckpt", "tier", "--store", str(store), "--apply", "--json"])
    assert result.exit_code == 0, result.output
    assert [item["action"] for item in json.loads(result.output)["recovered"]] == ["refused"]
    assert victim.is_file()


def test_symlinks_are_never_followed_out_of_the_store(tmp_path, trust_tiers):
    outside = tmp_path / "outside"
    digests = make_store(outside, run="r", steps=[0, 10, 20], keyframe_every=1)
    before = {p: _digest(p) for p in outside.rglob("*") if p.is_file()}
    store = tmp_path / "s"
    make_store(store, run="mine", steps=[0, 10, 20], keyframe_every=1)
    (store / "linked").symlink_to(outside / "r", target_is_directory=True)  # a whole run through a link
    (store / "mine" / "step-0").rename(tmp_path / "moved-step-0")
    (store / "mine" / "step-0").symlink_to(tmp_path / "moved-step-0", target_is_directory=True)
    trust_tiers(tmp_path / "warm", tmp_path / "cold")
    assert catalog.runs(storage.resolve(store)) == ["mine"]
    assert catalog.committed_steps(storage.resolve(store), "mine") == [10, 20]
    for command in (["gc", "--keep-last", "1", "--keep-every", "1000"], ["tier"]):
        result = runner.invoke(app, ["ckpt", *command, "--store", str(store), "--apply"])
        assert result.exit_code == 0, result.output
    assert {p: _digest(p) for p in outside.rglob("*") if p.is_file()} == before
    assert (tmp_path / "moved-step-0" / "manifest.json").is_file()
    assert_restorable(outside, "r", digests)


def test_a_data_file_symlinked_out_of_the_store_is_not_tiered(tmp_path, victim, trust_tiers, lifecycle_settings):
    from datetime import UTC, datetime, timedelta

    from seedance_tasks.lifecycle import tiering

    store = tmp_path / "s"
    trust_tiers(tmp_path / "warm", tmp_path / "cold")
    make_store(store, steps=[0, 10], keyframe_every=1)
    name = sorted(catalog.read_manifest(storage.resolve(store), "r", 0)["files"])[0]
    data = store / "r" / "step-0" / name
    victim.write_bytes(data.read_bytes())
    data.unlink()
    data.symlink_to(victim)
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.warm.uri, settings.tiers.cold.uri = str(tmp_path / "warm"), str(tmp_path / "cold")
    result = tiering.tier(str(store), settings=settings, apply=True, now=datetime.now(UTC) + timedelta(hours=2))
    assert [item["step"] for item in result["skipped"]] == [0] and "symlink" in result["skipped"][0]["reason"]
    assert victim.is_file() and data.is_symlink()


def test_the_bases_of_a_checkpoint_left_alone_stay(tmp_path, victim):
    """GC leaves a symlinked delta alone; collecting its base would make it unrestorable for good."""
    store = tmp_path / "s"
    digests = make_store(store, steps=range(1, 80, 10), keyframe_every=4)
    chains = {m["step"]: m["chain"] for m in catalog.read_run(storage.resolve(store), "r")[0]}
    assert chains[21] == [1]
    name = sorted(catalog.read_manifest(storage.resolve(store), "r", 21)["files"])[0]
    data = store / "r" / "step-21" / name
    victim.write_bytes(data.read_bytes())
    data.unlink()
    data.symlink_to(victim)
    result = gc.collect(str(store), ["r"], apply=True, keep_last=1, keep_every=1000)
    plan = result["runs"][0]
    assert [item["step"] for item in plan["refused"]] == [21]
    kept = {item["step"]: item["reasons"] for item in plan["kept"]}
    assert kept[1] == ["base of 21"] and kept[21] == ["left alone"]
    assert catalog.committed_steps(storage.resolve(store), "r") == [1, 21, 41, 61, 71]
    data.unlink()
    data.write_bytes(victim.read_bytes())  # the link replaced by the file: 21 restores bit-exact
    assert_restorable(store, "r", {21: digests[21]})


def test_tier_report_counts_only_what_moved(tmp_path, victim, trust_tiers, lifecycle_settings):
    """A checkpoint skipped (symlinked file) is in `skipped`, not in the moves, count or bytes."""
    from datetime import UTC, datetime, timedelta

    from seedance_tasks.lifecycle import inventory, tiering

    store = tmp_path / "s"
    trust_tiers(tmp_path / "warm", tmp_path / "cold")
    make_store(store, steps=[0, 10, 20], keyframe_every=1)
    name = sorted(catalog.read_manifest(storage.resolve(store), "r", 0)["files"])[0]
    data = store / "r" / "step-0" / name
    victim.write_bytes(data.read_bytes())
    data.unlink()
    data.symlink_to(victim)
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.warm.uri, settings.tiers.cold.uri = str(tmp_path / "warm"), str(tmp_path / "cold")
    later = datetime.now(UTC) + timedelta(hours=2)
    result = tiering.tier(str(store), settings=settings, apply=True, now=later)
    moved = [m for m in inventory.manifests(storage.resolve(store), "r") if inventory.tier_of(m) == "warm"]
    assert [m["step"] for m in moved] == [10, 20] and [item["step"] for item in result["skipped"]] == [0]
    assert [m["step"] for m in result["moves"]] == [10, 20] and result["moved"] == 2
    assert result["bytes_moved"] == sum(inventory.stored_bytes(m) for m in moved)
    again = tiering.tier(str(store), settings=settings, apply=True, now=later)
    assert (again["moves"], again["moved"], again["bytes_moved"]) == ([], 0, 0) and len(again["skipped"]) == 1


def test_a_second_gc_or_tier_refuses_naming_the_holder(tmp_path):
    store = tmp_path / "s"
    make_store(store, steps=[0, 10, 20], keyframe_every=1)
    held = lease.acquire(storage.resolve(store), "run-r", holder="nightly-gc-on-host-b", purpose="checkpoint gc")
    try:
        for command in (["gc", "--keep-last", "1"], ["tier"]):
            result = runner.invoke(app, ["ckpt", *command, "--store", str(store), "--apply"])
            assert result.exit_code == 5, result.output
            assert "nightly-gc-on-host-b" in result.output
        assert catalog.committed_steps(storage.resolve(store), "r") == [0, 10, 20]
    finally:
        held.release()
    again = runner.invoke(app, ["ckpt", "gc", "--store", str(store), "--keep-last", "1", "--keep-every", "1000",
                                "--apply"])
    assert again.exit_code == 0, again.output
    assert catalog.committed_steps(storage.resolve(store), "r") == [0, 20]  # 0: every 1000th step


def _symlinked_file(store, victim):
    name = sorted(catalog.read_manifest(storage.resolve(store), "r", 0)["files"])[0]
    data = store / "r" / "step-0" / name
    victim.write_bytes(data.read_bytes())
    data.unlink()
    data.symlink_to(victim)


def _archived_file(store, victim):
    _tamper(store, 0, lambda m: m["files"][sorted(m["files"])[0]].update(storage_class="DEEP_ARCHIVE"))


@pytest.mark.parametrize("leave", [_symlinked_file, _archived_file], ids=["symlinked file", "archive class"])
def test_a_dry_run_reports_what_apply_would_skip(tmp_path, victim, trust_tiers, lifecycle_settings, leave):
    """The dry run used to count a checkpoint that apply skips among its moves and cost saving."""
    from datetime import UTC, datetime, timedelta

    from seedance_tasks.lifecycle import tiering

    store = tmp_path / "s"
    trust_tiers(tmp_path / "warm", tmp_path / "cold")
    make_store(store, steps=[0, 10, 20], keyframe_every=1)
    leave(store, victim)
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.warm.uri, settings.tiers.cold.uri = str(tmp_path / "warm"), str(tmp_path / "cold")
    later = datetime.now(UTC) + timedelta(hours=2)
    dry = tiering.tier(str(store), settings=settings, now=later)
    assert not (tmp_path / "warm").exists()
    applied = tiering.tier(str(store), settings=settings, apply=True, now=later)
    assert [m["step"] for m in applied["moves"]] == [10, 20] and [s["step"] for s in applied["skipped"]] == [0]
    for key in ("moves", "moved", "bytes_moved", "skipped"):
        assert dry[key] == applied[key], key
    assert dry["cost"]["after"] == applied["cost"]["after"]
