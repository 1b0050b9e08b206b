"""A restore gives back what `torch.save` + `torch.load(weights_only=True)` would: container classes,
a state_dict's `_metadata` (module versions for load_state_dict's migrations) and quantized tensors."""

from __future__ import annotations

import json
from collections import OrderedDict

import pytest
import torch
from typer.testing import CliRunner

from seedance_tasks import checkpoint
from seedance_tasks.checkpoint import store as ckstore
from seedance_tasks.checkpoint.files import read_checkpoint, write_checkpoint
from seedance_tasks.cli import app
from seedance_tasks.errors import IntegrityError, UsageError

from .conftest import assert_same, torch_roundtrip

runner = CliRunner()
pytestmark = [pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions:UserWarning"),
              pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")]


class Block(torch.nn.Module):
    """A submodule with a buffer, a BatchNorm (state_dict version 2) and a migration of its own."""

    _version = 3

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.register_buffer("ema", torch.zeros(8))
        self.versions_seen: list = []

    def forward(self, x):
        return self.bn(self.conv(x))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):
        self.versions_seen.append(local_metadata.get("version"))  # what a migration would branch on
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 16), torch.nn.BatchNorm1d(16))

    def forward(self, x):
        return self.head(self.block(x))


def _trained_state():
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    for _ in range(3):
        loss = net(torch.randn(4, 3, 8, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    state = {
        "model": net.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
        "epoch": 3, "lr": 1e-3, "name": "net", "betas": (0.9, 0.999), "history": [1.5, None, True],
        "ordered": OrderedDict([("b", 1), ("a", [2, (3,)])]),
    }
    return net, state


def test_restore_gives_back_what_torch_load_would(tmp_path):
    net, state = _trained_state()
    reference = torch_roundtrip(state)
    assert type(reference["model"]) is OrderedDict and reference["model"]._metadata[""]  # the reference keeps them
    store = str(tmp_path / "s")
    checkpoint.save(state, store, "r", 0)
    checkpoint.save(state, store, "r", 1)  # a delta: the tree comes from the delta's manifest
    ckstore._CACHE.clear()
    for step in (0, 1):
        restored = checkpoint.load(store, "r", step)
        assert_same(reference, restored, f"step {step}")
        assert type(restored["model"]) is OrderedDict and type(restored["optimizer"]) is dict
        assert type(restored["ordered"]) is OrderedDict and type(restored["betas"]) is tuple
        assert restored["model"]._metadata == net.state_dict()._metadata
        assert restored["model"]._metadata["block.bn"]["version"] == 2
        assert restored["model"]._metadata["block"]["version"] == 3

    fresh = Net()
    fresh.load_state_dict(restored["model"])  # the migrations see the versions that were saved
    assert fresh.block.versions_seen == [3]
    assert_same(net.state_dict(), fresh.state_dict())
    plain = Net()
    plain.load_state_dict(dict(restored["model"]))  # what a restore without _metadata used to give
    assert plain.block.versions_seen == [None]


def test_files_and_background_saves_keep_classes_and_metadata(tmp_path):
    _net, state = _trained_state()
    reference = torch_roundtrip(state)
    store = str(tmp_path / "s")
    raw = tmp_path / "raw.pt"
    torch.save(state, raw)
    put = runner.invoke(app, ["ckpt", "put", str(raw), "--store", store, "--run", "r", "--step", "1"])
    assert put.exit_code == 0, put.output
    for fmt in ("pt", "safetensors"):
        out = tmp_path / f"out.{fmt}"
        got = runner.invoke(app, ["ckpt", "get", "--store", store, "--run", "r", "--step", "1", "--out", str(out)])
        assert got.exit_code == 0, got.output
        assert_same(reference, read_checkpoint(out), fmt)
    checkpoint.save_async(state, store, "async", 1)  # the host copy of a background save keeps them too
    checkpoint.wait_for_saves()
    ckstore._CACHE.clear()
    assert_same(reference, checkpoint.load(store, "async", 1))


def _strip_classes(node):
    if isinstance(node, dict):
        return {key: _strip_classes(value) for key, value in node.items() if key not in ("class", "metadata")}
    if isinstance(node, list):
        return [_strip_classes(item) for item in node]
    return node


def test_a_manifest_from_before_classes_restores_as_before(tmp_path):
    _net, state = _trained_state()
    store = str(tmp_path / "s")
    checkpoint.save(state, store, "r", 0)
    path = tmp_path / "s" / "r" / "step-0" / "manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["tree"]["dict"][0][1]["class"] == "OrderedDict"  # recorded as JSON
    assert ckstore.same_content(state, manifest)
    changed = torch_roundtrip(state)
    changed["model"]._metadata["block"]["version"] = 2
    assert not ckstore.same_content(changed, manifest)  # another _metadata is another restore

    manifest["tree"] = _strip_classes(manifest["tree"])  # what an older Seedance wrote
    manifest.pop("manifest_blake3")  # (which wrote no seal either)
    path.write_text(json.dumps(manifest))
    old = checkpoint.load(store, "r", 0)
    assert type(old["model"]) is dict and not hasattr(old["model"], "_metadata")
    assert_same({**state, "model": dict(state["model"]), "ordered": dict(state["ordered"])}, old)
    assert ckstore.same_content(state, manifest)  # the inbox DAG does not call a re-run a conflict

    manifest["tree"]["dict"][0][1]["class"] = "defaultdict"  # a class this version does not know
    path.write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="unknown node") as caught:
        checkpoint.load(store, "r", 0)
    assert caught.value.hint


def _quantized_state():
    torch.manual_seed(1)
    per_channel_scales = torch.rand(6, dtype=torch.float64) / 10 + 1e-3
    return {
        "per_tensor": torch.quantize_per_tensor(torch.randn(5000), 0.0123, 7, torch.quint8),
        "per_tensor_qint8": torch.quantize_per_tensor(torch.randn(3, 4), 0.5, -3, torch.qint8),
        "per_tensor_qint32": torch.quantize_per_tensor(torch.randn(64), 1e-4, 11, torch.qint32),
        "per_channel": torch.quantize_per_channel(
            torch.randn(6, 900), per_channel_scales, torch.arange(6) - 3, 0, torch.qint8),
        "per_channel_axis1": torch.quantize_per_channel(
            torch.randn(900, 6), per_channel_scales, torch.arange(6), 1, torch.quint8),
        "float_qparams": torch.quantize_per_channel(  # float zero points (what quantized embeddings use)
            torch.randn(6, 50), per_channel_scales.float(), torch.rand(6), 0, torch.quint8),
        "linear": torch.ao.nn.quantized.Linear(32, 16).state_dict(),  # packed (weight, bias) and a dtype
    }


def test_quantized_tensors_come_back_with_their_quantizer_bit_exact(tmp_path):
    state = _quantized_state()
    reference = torch_roundtrip(state)
    store = str(tmp_path / "s")
    checkpoint.save(state, store, "q", 0)
    checkpoint.save(state, store, "q", 1)
    ckstore._CACHE.clear()
    for step in (0, 1):
        restored = checkpoint.load(store, "q", step)
        assert_same(reference, restored, f"step {step}")
        assert restored["per_tensor"].q_scale() == 0.0123 and restored["per_tensor"].q_zero_point() == 7
        assert restored["per_channel_axis1"].q_per_channel_axis() == 1
        assert torch.equal(restored["per_channel"].dequantize(), state["per_channel"].dequantize())
        assert restored["float_qparams"].qscheme() == torch.per_channel_affine_float_qparams
        assert restored["linear"]["_packed_params.dtype"] is torch.qint8
    fresh = torch.ao.nn.quantized.Linear(32, 16)
    fresh.load_state_dict(restored["linear"])
    assert torch.equal(fresh.weight().int_repr(), state["linear"]["_packed_params._packed_params"][0].int_repr())

    out = tmp_path / "q.safetensors"  # `ckpt get --out x.safetensors` keeps them too
    write_checkpoint(restored, out)
    assert_same(reference, read_checkpoint(out))


def test_lossy_saves_keep_quantization_parameters_exact(tmp_path):
    scales = torch.rand(5000, dtype=torch.float64) + 0.5  # enough channels to be a lossy candidate
    state = {"q": torch.quantize_per_channel(torch.randn(5000, 2), scales, torch.zeros(5000, dtype=torch.long),
                                             0, torch.qint8),
             "w": torch.randn(5000)}
    summary = checkpoint.save(state, str(tmp_path / "s"), "r", 0, lossy="bf16")
    assert summary["lossy"] == "bf16"  # `w` went bf16
    back = checkpoint.load(str(tmp_path / "s"), "r", 0)
    assert_same(state["q"], back["q"])
    assert not torch.equal(state["w"], back["w"])


def test_a_quantized_tensor_it_cannot_store_is_refused_by_name(tmp_path):
    packed = torch.quantize_per_tensor(torch.randn(8), 0.1, 0, torch.quint4x2)
    with pytest.raises(UsageError, match=r"model/packed.*quint4x2") as caught:
        checkpoint.save({"model": {"packed": packed}}, str(tmp_path / "s"), "r", 0)
    assert "dequantize" in caught.value.hint
    assert checkpoint.latest_step(str(tmp_path / "s"), "r") is None
