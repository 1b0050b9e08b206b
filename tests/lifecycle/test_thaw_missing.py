"""Thaw reports a file the checkpoint's restore reads but that is not there as missing, never as
readable (a local tier volume not mounted, an object deleted behind Seedance's back)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from typer.testing import CliRunner

from seedance_tasks import storage
from seedance_tasks.cli import app
from seedance_tasks.lifecycle import tiering

from .conftest import make_store


def _thaw(store, step):
    return CliRunner().invoke(app, ["ckpt", "thaw", "--store", str(store), "--run", "r", "--step", str(step)])


def test_thaw_of_a_checkpoint_on_an_unmounted_local_tier_says_its_files_are_missing(
        tmp_path, lifecycle_settings, trust_tiers):
    store, warm = tmp_path / "s", tmp_path / "warm"
    trust_tiers(warm)
    make_store(store, steps=[0, 10], keyframe_every=4)
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.warm.uri = str(warm)
    assert tiering.tier(str(store), settings=settings, apply=True, now=datetime.now(UTC) + timedelta(hours=2))["moved"] == 2
    assert json.loads(CliRunner().invoke(app, ["ckpt", "thaw", "--store", str(store), "--run", "r", "--step", "10",
                                               "--json"]).output)["ready"] is True
    warm.rename(tmp_path / "elsewhere")
    warm.mkdir()  # the empty mountpoint
    out = _thaw(store, 10)
    assert out.exit_code == 0, out.output
    said = " ".join(out.output.split())
    assert "2 file(s) missing" in said and "every file is readable" not in said and "retry" not in said
    report = json.loads(CliRunner().invoke(app, ["ckpt", "thaw", "--store", str(store), "--run", "r", "--step", "10",
                                                 "--json"]).output)
    assert report["ready"] is False and {f["state"] for f in report["files"]} == {"missing"}


def test_thaw_of_a_checkpoint_whose_object_was_deleted_on_s3_says_it_is_missing(s3_bucket):
    store = f"s3://{s3_bucket}/ckpt"
    make_store(store, steps=[0, 10], keyframe_every=4)
    client = storage.boto3_client("s3")
    keys = [item["Key"] for item in client.list_objects_v2(Bucket=s3_bucket, Prefix="ckpt/r/step-0/")["Contents"]
            if item["Key"].endswith(".bin")]
    client.delete_object(Bucket=s3_bucket, Key=keys[0])
    out = _thaw(store, 10)
    assert out.exit_code == 0, out.output
    assert "Traceback" not in out.output and "1 file(s) missing" in " ".join(out.output.split())
