"""What users save comes back as `torch.save` + `torch.load` give it: strides of permuted layouts
(transposed, channels_last), broadcast tensors stored once and restored expanded, every NaN
scalar bit for bit, and dtypes a manifest cannot hold refused before anything is written."""

from __future__ import annotations

import enum
import json
import math
import os
import stat
import struct

import numpy as np
import pytest
import torch

from seedance_tasks import checkpoint
from seedance_tasks.checkpoint import store as ckstore
from seedance_tasks.checkpoint.files import read_checkpoint, write_checkpoint
from seedance_tasks.errors import IntegrityError, UsageError

from .conftest import assert_same, torch_roundtrip


def _manifest(store, step=0):
    return json.loads((store / "r" / f"step-{step}" / "manifest.json").read_text())


def _layouts():
    torch.manual_seed(0)
    return {
        "transposed": torch.randn(30, 40).t(),
        "channels_last": torch.randn(2, 3, 8, 9).to(memory_format=torch.channels_last),
        "expanded": torch.randn(3, 1, 5).expand(3, 7, 5),
        "expanded_transposed": torch.randn(3, 1, 5).expand(3, 7, 5).transpose(0, 2),
        "position_ids": torch.arange(16).expand(1, -1),
        "plain": torch.randn(4, 5),
    }


def _assert_layouts(state, back):
    assert_same(state, back)
    for key, tensor in state.items():
        assert back[key].stride() == tensor.stride(), key


@pytest.mark.parametrize("codec", ["auto", "zstd", "lz4", "bgzstd"])
def test_permuted_and_broadcast_tensors_restore_with_torch_loads_strides(tmp_path, codec):
    state = _layouts()
    checkpoint.save(state, str(tmp_path), "r", 0, codec=codec)
    back = checkpoint.load(str(tmp_path), "r", 0)
    _assert_layouts(torch_roundtrip(state), back)
    _assert_layouts(state, back)
    for name in state:
        assert checkpoint.load_tensor(str(tmp_path), "r", 0, name).stride() == state[name].stride()
    out = tmp_path / "out.pt"  # `ckpt get --out x.pt` writes them as torch.save would
    write_checkpoint(back, out)
    _assert_layouts(state, read_checkpoint(out))


def test_a_permuted_tensor_keeps_its_strides_across_deltas_and_lossy_saves(tmp_path):
    weight = torch.randn(64, 3, 16, 16).to(memory_format=torch.channels_last)
    checkpoint.save({"w": weight}, str(tmp_path), "r", 0, keyframe_every=4)
    moved = (weight.view(torch.int32) ^ 1).view(torch.float32)  # a few ulps: a delta pays
    checkpoint.save({"w": moved}, str(tmp_path), "r", 1, keyframe_every=4)
    back = checkpoint.load(str(tmp_path), "r", 1)["w"]
    assert back.stride() == weight.stride() and torch.equal(back.view(torch.int32), moved.view(torch.int32))
    checkpoint.save({"w": weight}, str(tmp_path), "r", 2, codec="zstd", lossy="bf16")
    lossy = checkpoint.load(str(tmp_path), "r", 2)["w"]
    assert lossy.stride() == weight.stride() and torch.equal(lossy, weight.to(torch.bfloat16).float())


def test_a_huge_broadcast_tensor_is_stored_once(tmp_path):
    huge = torch.tensor([1.5, -0.0]).expand(10**6, 10**6, 2)  # 2 * 10**12 elements over 8 bytes
    checkpoint.save({"mask": huge}, str(tmp_path), "r", 0)
    entry, = _manifest(tmp_path)["tensors"]
    assert entry["nbytes"] == 8 and entry["shape"] == [10**6, 10**6, 2] and entry["stored_shape"] == [1, 1, 2]
    back = checkpoint.load(str(tmp_path), "r", 0)["mask"]
    assert back.shape == huge.shape and back.stride() == (0, 0, 1)
    assert torch.equal(back[123456, 654321].view(torch.int32), huge[0, 0].view(torch.int32))
    checkpoint.save_async({"mask": huge}, str(tmp_path), "r", 1)  # its host copy is 8 bytes too
    checkpoint.wait_for_saves()
    assert checkpoint.load(str(tmp_path), "r", 1)["mask"].stride() == (0, 0, 1)


def test_a_one_element_tensor_with_stride_zero_is_saved(tmp_path):
    state = {"one": torch.tensor(2.5).expand(1), "ones": torch.tensor(7).expand(1, 1)}
    checkpoint.save(state, str(tmp_path), "r", 0)
    assert_same(state, checkpoint.load(str(tmp_path), "r", 0))


def _bits(value: float) -> bytes:
    return struct.pack(">d", value)


def _nan(hex_bits: str) -> float:
    return struct.unpack(">d", bytes.fromhex(hex_bits))[0]


NANS = {"negative": _nan("fff8000000000000"), "payload": _nan("7ff8000000000001"),
        "signalling": _nan("7ff0000000000001"), "canonical": math.nan}


@pytest.mark.parametrize("out", [None, "x.pt", "x.safetensors"])
def test_every_nan_scalar_restores_bit_for_bit(tmp_path, out):
    state = {**NANS, "list": list(NANS.values()), "keyed": {NANS["negative"]: 1}, "w": torch.ones(2)}
    checkpoint.save(state, str(tmp_path), "r", 0)
    back = checkpoint.load(str(tmp_path), "r", 0)
    if out:
        write_checkpoint(back, tmp_path / out)
        back = read_checkpoint(tmp_path / out)
    for name, value in NANS.items():
        assert _bits(back[name]) == _bits(value), name
    assert [_bits(v) for v in back["list"]] == [_bits(v) for v in NANS.values()]
    assert [_bits(k) for k in back["keyed"]] == [_bits(NANS["negative"])]
    assert ckstore.same_content(state, _manifest(tmp_path))


def test_a_dtype_no_manifest_holds_is_refused_before_anything_is_written(tmp_path):
    state = {"ok": torch.ones(3), "packed": torch.zeros(4, dtype=torch.int16).view(torch.bits16)}
    with pytest.raises(UsageError, match="bits16 tensor at packed") as caught:
        checkpoint.save(state, str(tmp_path / "s"), "r", 0)
    assert "view" in caught.value.hint
    assert not (tmp_path / "s" / "r").exists()


def _bad_stride(manifest):
    manifest["tensors"][0]["stride"] = [1, 1]  # two elements at one place


def _bad_stored_shape(manifest):
    manifest["tensors"][0]["stored_shape"] = [2, 4]


@pytest.mark.parametrize(("change", "words"), [(_bad_stride, "is not a dense layout"),
                                                (_bad_stored_shape, "does not hold its nbytes")])
def test_a_layout_that_does_not_fit_the_tensor_is_refused(tmp_path, change, words):
    checkpoint.save({"w": torch.randn(3, 4).t()}, str(tmp_path), "r", 0, codec="zstd")
    path = tmp_path / "r" / "step-0" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.pop("manifest_blake3")  # as a manifest from before the seal: the field check itself speaks
    change(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match=words):
        checkpoint.load(str(tmp_path), "r", 0)


class _Level(enum.IntEnum):
    HIGH = 3


def test_numpy_floats_and_int_subclasses_are_saved_as_their_values(tmp_path):
    state = {"best": np.float64("inf"), "worst": np.float64("-inf"), "loss": np.float64(NANS["negative"]),
             "mean": np.float64(1.25), "level": _Level.HIGH, "w": torch.ones(1)}
    checkpoint.save(state, str(tmp_path), "r", 0)
    back = checkpoint.load(str(tmp_path), "r", 0)
    assert back["best"] == math.inf and back["worst"] == -math.inf and back["mean"] == 1.25
    assert _bits(back["loss"]) == _bits(NANS["negative"]) and back["level"] == 3


def test_a_huge_broadcast_tensor_is_refused_for_safetensors_not_written_out(tmp_path):
    state = {"mask": torch.ones(1, 1).expand(10**6, 10**6), "small": torch.ones(3, 1).expand(3, 4)}
    with pytest.raises(UsageError, match=r"tensor mask is broadcast .* 4,000,000,000,000 bytes") as caught:
        write_checkpoint(state, tmp_path / "x.safetensors")
    assert ".pt" in caught.value.hint and not list(tmp_path.iterdir())
    write_checkpoint({"small": state["small"]}, tmp_path / "y.safetensors")  # a small one is written out
    assert torch.equal(read_checkpoint(tmp_path / "y.safetensors")["small"], torch.ones(3, 4))


@pytest.mark.parametrize("name", ["x.pt", "x.safetensors"])
def test_a_written_checkpoint_file_gets_the_mode_torch_save_gives(tmp_path, name):
    old = os.umask(0o022)
    try:
        write_checkpoint({"w": torch.ones(2)}, tmp_path / name)
        torch.save({"w": torch.ones(2)}, tmp_path / "ref.pt")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / name).stat().st_mode) == stat.S_IMODE((tmp_path / "ref.pt").stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "ref.pt"])


def test_a_dict_key_a_checkpoint_cannot_hold_is_named_as_a_key(tmp_path):
    with pytest.raises(UsageError, match=r"dict key '\(1, 2\)' \(a tuple\) of opt/state") as caught:
        checkpoint.save({"opt": {"state": {(1, 2): torch.ones(1)}}}, str(tmp_path), "r", 0)
    assert "str(key)" in caught.value.hint
