"""A restore gives back what `torch.save` + `torch.load(weights_only=True)` gives for tied weights
(stored once, shared again), `torch.Size` and `nn.Parameter` (with its requires_grad); tensors
without data (meta) are refused naming the file and the key."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from typer.testing import CliRunner

from seedance_tasks import checkpoint
from seedance_tasks.checkpoint import _settings, ingest, tree
from seedance_tasks.checkpoint import store as ckstore
from seedance_tasks.checkpoint.files import read_checkpoint, write_checkpoint
from seedance_tasks.cli import app
from seedance_tasks.errors import IntegrityError, UsageError

from .conftest import torch_roundtrip

runner = CliRunner()


def _sharing(state) -> dict:
    """Which keys are one object, and which share data with key `a`: what tying looks like."""
    return {key: (value is state["a"], value.untyped_storage().data_ptr() == state["a"].untyped_storage().data_ptr())
            for key, value in state.items() if isinstance(value, torch.Tensor)}


def _kinds(state) -> dict:
    return {key: (type(value).__name__, getattr(value, "requires_grad", None)) for key, value in state.items()}


def _state():
    w = torch.randn(64, 32)
    p = torch.nn.Parameter(torch.randn(8))
    return {
        "a": w, "b": w,  # one object at two keys
        "c": w.detach(),  # another object over the same data (what state_dict() gives for tied weights)
        "d": w[1:], "t": w.t(),  # views with another offset / strides: stored on their own
        "p": p, "pd": p.detach(), "frozen": torch.nn.Parameter(torch.ones(3), requires_grad=False),
        "grad": torch.ones(2, requires_grad=True), "ints": torch.nn.Parameter(torch.arange(3), requires_grad=False),
        "size": torch.Size([2, 3]), "sizes": [torch.Size([]), (torch.Size([4]),)],
        "e1": torch.empty(0), "e2": torch.empty(0),  # distinct empty tensors stay distinct
    }


UNSHARED_VIEWS = ("d", "t")  # other offset / strides: torch.load shares their data, a restore does not (documented)


def _check_like_torch(reference, restored):
    expected = _sharing(reference)
    assert all(expected[key] == (False, True) for key in UNSHARED_VIEWS)
    expected.update({key: (False, False) for key in UNSHARED_VIEWS})
    assert _sharing(restored) == expected
    assert _kinds(restored) == _kinds(reference)
    assert type(restored["size"]) is torch.Size and restored["size"] == reference["size"]
    assert [type(x) for x in restored["sizes"]] == [torch.Size, tuple] and type(restored["sizes"][1][0]) is torch.Size
    assert restored["e1"] is not restored["e2"]
    for key in ("a", "c", "d", "t", "p", "frozen", "ints"):
        assert torch.equal(restored[key].detach(), reference[key].detach()), key


def test_save_and_load_give_back_what_torch_load_would(tmp_path):
    state = _state()
    reference = torch_roundtrip(state)
    assert _sharing(reference)["b"] == (True, True) and _sharing(reference)["c"] == (False, True)
    store = str(tmp_path / "s")
    summary = checkpoint.save(state, store, "r", 0)
    manifest = json.loads((tmp_path / "s" / "r" / "step-0" / "manifest.json").read_text())
    names = [entry["name"] for entry in manifest["tensors"]]
    assert names == ["a", "d", "t", "p", "frozen", "grad", "ints", "e1", "e2"]  # b, c and pd are a's and p's data
    assert summary["raw_bytes"] == sum(entry["nbytes"] for entry in manifest["tensors"])
    ckstore._CACHE.clear()
    restored = checkpoint.load(store, "r", 0)
    _check_like_torch(reference, restored)
    restored["a"][0, 0] = 42.0  # one tensor: a change shows at every key it is tied to, as after torch.load
    assert restored["b"][0, 0] == 42.0 and restored["c"][0, 0] == 42.0 and restored["d"][0, 0] != 42.0
    assert ckstore.same_content(state, manifest)


def test_a_tied_model_keeps_its_tying_and_loads(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(50, 16)
            self.head = torch.nn.Linear(16, 50, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    store = str(tmp_path / "s")
    checkpoint.save({"model": model.state_dict()}, store, "r", 0)
    manifest = json.loads((tmp_path / "s" / "r" / "step-0" / "manifest.json").read_text())
    assert [entry["name"] for entry in manifest["tensors"]] == ["model/embed.weight"]  # stored once
    by_name = checkpoint.load_tensor(store, "r", 0, "model/head.weight")  # a tied name still finds its tensor
    assert torch.equal(by_name, model.embed.weight.detach())
    restored = checkpoint.load(store, "r", 0)["model"]
    reference = torch_roundtrip(model.state_dict())
    assert restored["embed.weight"].data_ptr() == restored["head.weight"].data_ptr()
    assert (restored["embed.weight"] is restored["head.weight"]) == (reference["embed.weight"] is reference["head.weight"])
    fresh = Tied()
    fresh.load_state_dict(restored)
    assert torch.equal(fresh.head.weight, model.embed.weight) and fresh.head.weight is fresh.embed.weight


def test_put_and_get_of_a_tied_file_keep_its_size_and_tying(tmp_path):
    w = torch.randn(1000, 64)
    source, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({"embed": w, "lm_head": w, "p": torch.nn.Parameter(torch.ones(2)), "size": torch.Size([2, 3])}, source)
    store = str(tmp_path / "s")
    put = runner.invoke(app, ["ckpt", "put", str(source), "--store", store, "--run", "r", "--step", "0"])
    assert put.exit_code == 0, put.output
    got = runner.invoke(app, ["ckpt", "get", "--store", store, "--run", "r", "--out", str(out)])
    assert got.exit_code == 0, got.output
    back = torch.load(out, weights_only=True)
    assert back["embed"] is back["lm_head"] and type(back["p"]) is torch.nn.Parameter and back["p"].requires_grad
    assert type(back["size"]) is torch.Size
    assert os.path.getsize(out) < 1.1 * os.path.getsize(source)  # the tied tensor written once, not twice


def test_safetensors_files_and_background_saves_keep_them_too(tmp_path):
    state = _state()
    reference = torch_roundtrip(state)
    write_checkpoint(state, tmp_path / "x.safetensors")  # views into one storage: safetensors refused them
    # flags and classes ride in Seedance's tree metadata (a plain safetensors reader sees plain tensors)
    back = read_checkpoint(tmp_path / "x.safetensors")
    assert _kinds(back) == _kinds(reference) and type(back["size"]) is torch.Size
    assert back["a"] is back["b"] and back["c"].data_ptr() == back["a"].data_ptr() and torch.equal(back["d"], state["d"])

    full = _state()
    checkpoint.save_async(full, str(tmp_path / "s"), "async", 1)
    checkpoint.wait_for_saves()
    ckstore._CACHE.clear()
    _check_like_torch(torch_roundtrip(full), checkpoint.load(str(tmp_path / "s"), "async", 1))


def test_a_tied_name_still_finds_its_tensor():
    skeleton, named = tree.flatten({"model": {"embed": (w := torch.ones(2)), "head": w}, "x": [w.detach()]})
    names = [name for name, _ in named]
    assert names == ["model/embed"]
    assert tree.aliases(skeleton, names) == {"model/head": "model/embed", "x/0": "model/embed"}


def _strip_new(node):
    if isinstance(node, dict):
        return {key: _strip_new(value) for key, value in node.items()
                if key not in ("parameter", "requires_grad") and not (key == "class" and "tuple" in node)}
    if isinstance(node, list):
        return [_strip_new(item) for item in node]
    return node


def test_a_manifest_from_before_leaf_flags_restores_as_before(tmp_path):
    state = {"p": torch.nn.Parameter(torch.ones(2)), "size": torch.Size([2]), "w": torch.zeros(3)}
    store = str(tmp_path / "s")
    checkpoint.save(state, store, "r", 0)
    path = tmp_path / "s" / "r" / "step-0" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["tree"] = _strip_new(manifest["tree"])  # what the Seedance before them wrote
    manifest.pop("manifest_blake3", None)  # ... without a seal, which would refuse the edited tree
    path.write_text(json.dumps(manifest))
    old = checkpoint.load(store, "r", 0)
    assert type(old["p"]) is torch.Tensor and not old["p"].requires_grad and type(old["size"]) is tuple
    assert ckstore.same_content(state, manifest)  # a re-run of the inbox is not a conflict


@pytest.mark.parametrize("change, problem", [
    (lambda leaf: leaf.update(view=-1), "view"),
    (lambda leaf: leaf.update(view="1"), "view"),
    (lambda leaf: leaf.update(parameter="yes"), "parameter"),
    (lambda leaf: leaf.update(requires_grad=False), "requires_grad"),
])
def test_a_damaged_leaf_is_refused_when_the_manifest_is_read(tmp_path, change, problem):
    store = str(tmp_path / "s")
    checkpoint.save({"w": torch.ones(2)}, store, "r", 0)
    path = tmp_path / "s" / "r" / "step-0" / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest["tree"]["dict"][0][1])
    manifest.pop("manifest_blake3", None)  # the tree check itself, not the seal, refuses it
    path.write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match=problem):
        checkpoint.load(store, "r", 0)


@pytest.mark.parametrize("node, problem", [
    ({"tuple": [{"str": "x"}], "class": "Size"}, "a Size node holds ints"),
    ({"tuple": [], "class": "namedtuple"}, "unknown tuple class"),
])
def test_tree_problem_names_a_bad_tuple_class(node, problem):
    where, found = tree.tree_problem({"dict": [[{"str": "s"}, node]]}, 0)
    assert where == "tree.dict[0]" and found.startswith(problem)


def test_an_integer_tensor_marked_as_requiring_grad_is_an_integrity_error():
    with pytest.raises(IntegrityError, match="cannot be restored as recorded") as caught:
        tree.unflatten({"tensor": 0, "requires_grad": True}, [torch.arange(3)])
    assert caught.value.hint


def test_a_file_with_a_meta_tensor_is_refused_naming_the_file_and_key(tmp_path):
    source = tmp_path / "meta.pt"
    torch.save({"model": {"fc.weight": torch.zeros(2, device="meta"), "fc.bias": torch.zeros(2)}}, source)
    result = runner.invoke(app, ["ckpt", "put", str(source), "--store", str(tmp_path / "s"), "--run", "r", "--step", "0"])
    assert result.exit_code == 2, result.output
    assert "unexpected" not in result.output
    assert f"{source}: cannot store the meta tensor at model/fc.weight" in result.output.replace("\n", "")
    assert "hint:" in result.output and "materialise" in result.output
    assert not (tmp_path / "s" / "r").exists()

    with pytest.raises(UsageError, match="meta tensor at w.*no data") as caught:
        checkpoint.save({"w": torch.empty(3, device="meta")}, str(tmp_path / "s"), "r", 0)
    assert caught.value.hint


def test_an_inbox_file_with_a_meta_tensor_is_quarantined_with_the_reason(tmp_path):
    inbox = tmp_path / "inbox"
    (inbox / "gpt").mkdir(parents=True)
    raw = inbox / "gpt" / "step-5.pt"
    torch.save({"w": torch.zeros(2, device="meta")}, raw)
    os.utime(raw, (time.time() - 3600,) * 2)
    item, = ingest.scan(str(inbox), 60)["ready"]
    result = ingest.ingest_one(item, str(inbox), str(tmp_path / "store"), _settings())
    assert result["status"] == "quarantined" and "meta tensor at w" in result["reason"] and str(raw) in result["reason"]
    assert list((inbox / "_seedance" / "quarantine").rglob("step-5.pt"))


def test_a_tensor_subclass_without_data_is_refused_by_name():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(2)
    with pytest.raises(UsageError, match="FakeTensor \\(a tensor subclass\\) at x"):
        tree.flatten({"x": fake})
