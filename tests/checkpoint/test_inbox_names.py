"""The inbox takes a checkpoint's step only from an explicit step marker in its name; any other name
(no marker, two different steps) is skipped with a warning naming the file and a hint, never
stored under a guessed step."""

from __future__ import annotations

import os
import time

import pytest
import torch

from seedance_tasks import checkpoint
from seedance_tasks.checkpoint import _settings, ingest
from seedance_tasks.checkpoint import store as ckstore


@pytest.mark.parametrize("name, step", [
    ("step-500.pt", 500),
    ("step-000120.pt", 120),
    ("step_500.pth", 500),
    ("step500.safetensors", 500),
    ("STEP-7.pt", 7),
    # numbers that are not the step: a loss, a dtype, a version, a date, an epoch
    ("step-500-val1.93.pt", 500),
    ("checkpoint-1000.bf16.pt", 1000),
    ("epoch3-step1000-v2.pt", 1000),
    ("step_500_2026-01-01.pt", 500),
    # the forms trainers write: HF Trainer, Lightning, DeepSpeed
    ("checkpoint-1000.pt", 1000),
    ("checkpoint_1000.safetensors", 1000),
    ("epoch=3-step=1000.pt", 1000),
    ("epoch=0-step=100-val_loss=0.50-v1.pt", 100),
    ("global_step1000.pt", 1000),
    ("global_step1000_mp_rank_00_model_states.pt", 1000),
    ("step-500-global_step500.pt", 500),  # two markers, one step
    ("epoch=3-step=1000.ckpt", 1000),  # PyTorch Lightning's ModelCheckpoint
])
def test_the_step_comes_from_the_step_marker_only(name, step):
    assert ingest.parse_name(f"gpt/{name}") == ("gpt", step)
    assert ingest.name_problem(f"gpt/{name}") is None


@pytest.mark.parametrize("name, problem", [
    ("model-1000.pt", "no step marker"),
    ("last.pt", "no step marker"),
    ("laststep5.pt", "no step marker"),  # `step` inside a word is not a marker
    ("steps-5.pt", "no step marker"),
    ("step5k.pt", "no step marker"),
    ("step-1.5.pt", "no step marker"),  # not a whole step
    ("checkpoint1000.pt", "no step marker"),  # `checkpoint` needs its `-`/`_`
    ("zero_pp_rank_0_mp_rank_00_optim_states.pt", "no step marker"),
    ("step-500-step-600.pt", "2 different steps (500, 600)"),
    ("epoch=3-step=1000-global_step999.pt", "2 different steps (999, 1000)"),
    ("step-" + "9" * 19 + ".pt", "more than 18 digits"),
    ("epoch=3-step=1000.bin", "not a .pt, .pth, .ckpt or .safetensors file"),
])
def test_a_name_without_one_step_is_not_taken(name, problem):
    assert ingest.parse_name(f"gpt/{name}") is None
    assert problem in ingest.name_problem(f"gpt/{name}")


def _drop(path, state):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    old = time.time() - 3600
    os.utime(path, (old, old))


def test_scan_skips_misnamed_files_with_a_warning_and_stores_the_marked_step(tmp_path, caplog):
    ckstore._CACHE.clear()
    inbox, store = tmp_path / "inbox", tmp_path / "store"
    _drop(inbox / "gpt" / "step-500-val1.93.pt", {"w": torch.full((4,), 500.0)})
    _drop(inbox / "gpt" / "model-93.pt", {"w": torch.full((4,), 93.0)})
    _drop(inbox / "gpt" / "step-1-step-2.pt", {"w": torch.full((4,), 2.0)})
    with caplog.at_level("WARNING", logger="seedance_tasks.checkpoint.ingest"):
        found = ingest.scan(str(inbox), 60)
    assert [(item["path"], item["step"]) for item in found["ready"]] == [("gpt/step-500-val1.93.pt", 500)]
    skipped = {item["path"]: item for item in found["skipped"]}
    assert set(skipped) == {"gpt/model-93.pt", "gpt/step-1-step-2.pt"}
    assert "no step marker" in skipped["gpt/model-93.pt"]["reason"]
    assert "different steps" in skipped["gpt/step-1-step-2.pt"]["reason"]
    assert all("step-<N>.pt" in item["hint"] for item in skipped.values())
    for path in skipped:
        line = next(line for line in caplog.text.splitlines() if path in line)
        assert "warning: inbox file" in line and "skipped" in line and "hint: rename it to" in line

    result = ingest.ingest_one(found["ready"][0], str(inbox), str(store), _settings())
    assert (result["status"], result["step"]) == ("stored", 500)
    assert sorted(os.listdir(store / "gpt")) == ["step-500"]
    assert checkpoint.load(str(store), "gpt", 500)["w"][0].item() == 500.0
    assert (inbox / "gpt" / "model-93.pt").exists() and (inbox / "gpt" / "step-1-step-2.pt").exists()  # left alone


class _HyperParameters(dict):
    """Stands in for Lightning's AttributeDict: a class torch's weights-only loader does not know."""


def test_a_lightning_ckpt_is_stored_under_its_step_and_one_needing_unpickling_is_quarantined(tmp_path):
    ckstore._CACHE.clear()
    inbox, store = tmp_path / "inbox", tmp_path / "store"
    weights = {"layer.weight": torch.arange(12.0).reshape(3, 4), "layer.bias": torch.ones(3)}
    lightning = {"epoch": 3, "global_step": 1000, "pytorch-lightning_version": "2.5.0", "state_dict": weights,
                 "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.001, "params": [0, 1]}]}],
                 "lr_schedulers": [], "hyper_parameters": {"lr": 0.001, "layers": 4}}
    _drop(inbox / "gpt" / "epoch=3-step=1000.ckpt", lightning)
    _drop(inbox / "gpt" / "epoch=4-step=1250.ckpt", {**lightning, "hyper_parameters": _HyperParameters(lr=0.1)})
    found = ingest.scan(str(inbox), 60)
    assert [(item["path"], item["step"]) for item in found["ready"]] == [
        ("gpt/epoch=3-step=1000.ckpt", 1000), ("gpt/epoch=4-step=1250.ckpt", 1250)]

    stored = ingest.ingest_one(found["ready"][0], str(inbox), str(store), _settings())
    assert (stored["status"], stored["step"]) == ("stored", 1000)
    restored = checkpoint.load(str(store), "gpt", 1000)
    assert torch.equal(restored["state_dict"]["layer.weight"], weights["layer.weight"])
    assert restored["hyper_parameters"] == {"lr": 0.001, "layers": 4} and restored["global_step"] == 1000

    refused = ingest.ingest_one(found["ready"][1], str(inbox), str(store), _settings())
    assert refused["status"] == "quarantined" and "arbitrary unpickling" in refused["reason"]
    assert not (inbox / "gpt" / "epoch=4-step=1250.ckpt").exists()
    assert list((inbox / "_seedance" / "quarantine").rglob("epoch=4-step=1250.ckpt"))  # kept, not deleted
