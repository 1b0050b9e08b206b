"""`seedance ckpt` put/get/ls/verify, on local disk and on the loopback S3 server."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from seedance_tasks import checkpoint
from seedance_tasks.checkpoint import store as ckstore
from seedance_tasks.checkpoint.files import read_checkpoint
from seedance_tasks.cli import app

from .conftest import assert_same, first_data_file

runner = CliRunner()


def _invoke(*args):
    result = runner.invoke(app, ["ckpt", *args])
    assert result.exit_code == 0, result.output
    return result


def _put_chain(tmp_path, states, store, fmt):
    """`ckpt put` each state; `states` drift (conftest), so each later one is a delta on any machine."""
    for step, state in states:
        src = tmp_path / f"raw-{step}.{fmt}"
        if fmt == "pt":
            torch.save(state, src)
        else:
            from seedance_tasks.checkpoint.files import write_checkpoint

            write_checkpoint(state, src)
        out = json.loads(_invoke("put", str(src), "--store", store, "--run", "gpt", "--step", str(step), "--json",
                                 "--metric", f"val_loss={5 - step / 10}", "--tag", "nightly").stdout)
        assert out["step"] == step and out["stored_bytes"] < out["raw_bytes"] and out["mb_per_s"] > 0
        assert out["kind"] == ("full" if step == 0 else "delta") and out["base"] == {0: None, 10: 0, 20: 0, 30: 20}[step]


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_cli_put_get_ls_verify_local(tmp_path, drifting, fmt):
    ckstore._CACHE.clear()
    store = str(tmp_path / "store")
    _put_chain(tmp_path, drifting, store, fmt)
    rows = json.loads(_invoke("ls", "--store", store, "--json").stdout)
    assert [(r["run"], r["step"], r["kind"], r["base"]) for r in rows] == [
        ("gpt", 0, "full", None), ("gpt", 10, "delta", 0), ("gpt", 20, "delta", 0), ("gpt", 30, "delta", 20)]
    assert all(r["tier"] == "hot" and r["age_s"] >= 0 and r["ratio"] > 1 for r in rows)
    assert rows[2]["metrics"] == {"val_loss": 3.0} and rows[2]["tags"] == ["nightly"]
    bad = runner.invoke(app, ["ckpt", "put", str(tmp_path / f"raw-0.{fmt}"), "--store", store, "--run", "x",
                              "--step", "1", "--metric", "val_loss"])
    assert bad.exit_code == 2 and "NAME=NUMBER" in bad.output
    assert "delta" in _invoke("ls", "--store", store, "--run", "gpt").stdout
    assert json.loads(_invoke("verify", "--store", store, "--run", "gpt", "--json").stdout)["ok"]
    for out_fmt in ("pt", "safetensors"):
        out = tmp_path / f"restored.{out_fmt}"
        _invoke("get", "--store", store, "--run", "gpt", "--step", "20", "--out", str(out))
        assert_same(drifting[2][1], read_checkpoint(out))


def test_s3_store_roundtrip_api_and_cli(tmp_path, drifting, s3_bucket):
    ckstore._CACHE.clear()
    store = f"s3://{s3_bucket}/ckpts"
    _put_chain(tmp_path, drifting[:3], store, "pt")
    ckstore._CACHE.clear()
    assert checkpoint.latest_step(store, "gpt") == 20
    assert_same(drifting[1][1], checkpoint.load(store, "gpt", 10))
    out = tmp_path / "from-s3.pt"
    _invoke("get", "--store", store, "--run", "gpt", "--out", str(out))
    assert_same(drifting[2][1], read_checkpoint(out))
    assert [r["step"] for r in json.loads(_invoke("ls", "--store", store, "--json").stdout)] == [0, 10, 20]
    # damage on S3 is caught too: truncate the keyframe (step 0), which every delta needs
    from seedance_tasks.storage import boto3_client

    s3 = boto3_client("s3")
    key = f"ckpts/gpt/step-0/{first_data_file(store, 'gpt', 0)}"
    body = s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
    s3.put_object(Bucket=s3_bucket, Key=key, Body=body[:-10])
    result = runner.invoke(app, ["ckpt", "verify", "--store", store, "--run", "gpt", "--json"])
    assert result.exit_code == 4
    assert [d["step"] for d in json.loads(result.stdout)["damaged"]] == [0, 10, 20]


def test_api_save_on_s3_with_training_state(s3_bucket):
    ckstore._CACHE.clear()
    store = f"s3://{s3_bucket}/api"
    state = {"w": torch.randn(50_000), "step": 3}
    summary = checkpoint.save(state, store, "r", 3)
    assert summary["kind"] == "full"
    state2 = {"w": state["w"] + 1e-4 * torch.randn(50_000), "step": 4}
    assert checkpoint.save(state2, store, "r", 4)["kind"] == "delta"
    ckstore._CACHE.clear()
    assert_same(state2, checkpoint.load(store, "r"))
