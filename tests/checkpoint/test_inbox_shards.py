"""Parts of one checkpoint in the inbox (Hugging Face shards, DeepSpeed model-parallel ranks, two
files naming one step): none is stored as the step, since any one of them is only part of it."""

from __future__ import annotations

import os
import time

import pytest
import torch
from safetensors.torch import save_file

from seedance_tasks.checkpoint import _settings, ingest
from seedance_tasks.checkpoint import store as ckstore


def _age(path):
    old = time.time() - 3600
    os.utime(path, (old, old))


@pytest.mark.parametrize("name", [
    "step-100-model-00001-of-00002.safetensors",
    "checkpoint-100_model-2-of-3.pt",
    "global_step100-00002-of-00002.pt",
])
def test_a_shard_of_a_sharded_checkpoint_is_not_taken(name):
    assert ingest.parse_name(f"gpt/{name}") is None
    problem = ingest.name_problem(f"gpt/{name}")
    assert "one shard" in problem and "-of-" in problem


def test_a_single_shard_checkpoint_is_whole():
    assert ingest.parse_name("gpt/step-100-model-00001-of-00001.safetensors") == ("gpt", 100)


def test_files_naming_the_same_step_are_all_skipped_and_nothing_partial_is_stored(tmp_path, caplog):
    ckstore._CACHE.clear()
    inbox, store = tmp_path / "inbox", tmp_path / "store"
    run = inbox / "gpt"
    run.mkdir(parents=True)
    ranks = [run / f"global_step100_mp_rank_0{rank}_model_states.pt" for rank in (0, 1)]
    for rank, path in enumerate(ranks):  # DeepSpeed, model parallel: each rank holds its half
        torch.save({"module": {"w": torch.full((4,), float(rank))}}, path)
    save_file({"w": torch.ones(4)}, str(run / "step-200.safetensors"))
    torch.save({"w": torch.ones(4)}, run / "step_200.pt")  # the same step twice
    torch.save({"w": torch.full((4,), 3.0)}, run / "step-300.pt")
    for path in run.iterdir():
        _age(path)

    with caplog.at_level("WARNING", logger="seedance_tasks.checkpoint.ingest"):
        found = ingest.scan(str(inbox), 60)
    assert [item["step"] for item in found["ready"]] == [300]
    skipped = {item["path"].split("/")[1]: item for item in found["skipped"]}
    assert set(skipped) == {ranks[0].name, ranks[1].name, "step-200.safetensors", "step_200.pt"}
    assert "2 files name step 100 of run gpt" in skipped[ranks[0].name]["reason"]
    assert ranks[1].name in skipped[ranks[0].name]["reason"] and "one file per step" in skipped[ranks[0].name]["hint"]
    assert sum("warning: inbox file" in line for line in caplog.text.splitlines()) == 4

    result = ingest.ingest_one(found["ready"][0], str(inbox), str(store), _settings())
    assert (result["status"], result["step"]) == ("stored", 300)
    assert sorted(os.listdir(store / "gpt")) == ["step-300"]
    assert all(path.exists() for path in ranks)  # left for a person, never half-stored
