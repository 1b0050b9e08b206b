"""Format 2 (BLAKE3 chunk digests): round trips, damage named on restore and verify, refused
formats, the committed format-1 store, and codec choices reused between saves."""

from __future__ import annotations

import json
import typing

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from seedance_tasks import checkpoint, storage
from seedance_tasks.checkpoint import choices
from seedance_tasks.checkpoint import store as ckstore
from seedance_tasks.checkpoint.manifest import DELTA_CODECS, FORMAT_1, FORMAT_2, Codec
from seedance_tasks.cli import app
from seedance_tasks.errors import IntegrityError

from . import format1
from .conftest import assert_same, drifting_states

runner = CliRunner()


@pytest.fixture(autouse=True)
def _fresh_memory():
    ckstore._CACHE.clear()
    choices.forget()
    yield
    ckstore._CACHE.clear()
    choices.forget()


def _manifest(store, run, step):
    return json.loads((store / run / f"step-{step}" / "manifest.json").read_text())


def _write_manifest(store, run, step, manifest):
    (store / run / f"step-{step}" / "manifest.json").write_text(json.dumps(manifest))


def test_format2_round_trip_is_bit_exact_with_blake3_digests(tmp_path, drifting):
    store = tmp_path / "s"
    for step, state in drifting:
        checkpoint.save(state, str(store), "r", step, chunk_size="64KiB")
    ckstore._CACHE.clear()
    for step, state in drifting:
        manifest = _manifest(store, "r", step)
        assert manifest["format"] == FORMAT_2
        chunks = [c for t in manifest["tensors"] for c in t["chunks"]]
        assert chunks and all(len(c["blake3"]) == 64 and "sha256" not in c for c in chunks)
        assert_same(state, checkpoint.load(str(store), "r", step))
    assert any(_manifest(store, "r", s)["kind"] == "delta" for s, _ in drifting)
    assert ckstore.verify_run(str(store), "r")["ok"]


def _raw_plane_spot(store, run, step):
    """(tensor name, chunk index, chunk, byte offset in its file) of a byte inside a plane stored raw:
    flipping it leaves the zstd frames intact, so only the chunk digest can catch it."""
    manifest = _manifest(store, run, step)
    for tensor in manifest["tensors"]:
        planes = tensor.get("planes") or ""
        if "r" not in planes:
            continue
        width = len(planes)
        for index, chunk in enumerate(tensor["chunks"]):
            data = (store / run / f"step-{step}" / chunk["file"]).read_bytes()
            header = np.frombuffer(data[chunk["offset"]: chunk["offset"] + 4 * width], dtype="<u4")
            position = chunk["offset"] + 4 * width
            for mode, entry in zip(planes, header.tolist(), strict=True):
                length = entry & ~(1 << 31)
                if mode == "r" and length:
                    return tensor["name"], index, chunk, position + length // 2
                position += length
    raise AssertionError("no raw plane in this checkpoint")


@pytest.mark.parametrize("step", [0, 30])  # a keyframe, and a delta whose chain reads two bases
def test_a_flipped_byte_is_named_by_file_tensor_and_chunk_on_restore_and_verify(tmp_path, drifting, step):
    store = tmp_path / "s"
    for saved, state in drifting:
        checkpoint.save(state, str(store), "r", saved, chunk_size="64KiB")
    ckstore._CACHE.clear()
    name, index, chunk, spot = _raw_plane_spot(store, "r", step)
    path = store / "r" / f"step-{step}" / chunk["file"]
    data = bytearray(path.read_bytes())
    data[spot] ^= 0x01
    path.write_bytes(bytes(data))

    with pytest.raises(IntegrityError) as caught:
        checkpoint.load(str(store), "r", step)
    message = caught.value.message
    assert f"tensor {name} of r/step-{step}: chunk {index} in {path}" in message and "blake3" in message
    with pytest.raises(IntegrityError) as again:
        ckstore.verify(str(store), "r", step)
    assert f"tensor {name}" in again.value.message and f"chunk {index}" in again.value.message
    result = runner.invoke(app, ["ckpt", "verify", "--store", str(store), "--run", "r", "--step", str(step), "--json"])
    assert result.exit_code == 4
    damaged = json.loads(result.stdout)["damaged"]
    assert [d["step"] for d in damaged] == [step] and chunk["file"] in damaged[0]["error"]


def test_unknown_or_tampered_format_is_refused_with_a_clear_error(tmp_path, drifting):
    store = tmp_path / "s"
    (step, state), = drifting[:1]
    checkpoint.save(state, str(store), "r", step)
    good = _manifest(store, "r", step)

    _write_manifest(store, "r", step, {**good, "format": "seedance-checkpoint/9"})
    with pytest.raises(IntegrityError) as caught:
        checkpoint.load(str(store), "r", step)
    assert "seedance-checkpoint/9" in caught.value.message and FORMAT_2 in caught.value.message
    assert "newer Seedance" in caught.value.hint

    # a format-2 manifest passed off as format 1: its chunks carry no sha256
    _write_manifest(store, "r", step, {**good, "format": FORMAT_1})
    with pytest.raises(IntegrityError) as caught:
        checkpoint.load(str(store), "r", step)
    assert "sha256 is missing" in caught.value.message and "refused" in caught.value.message

    # a digest swapped for one of the other format
    tampered = json.loads(json.dumps(good))
    chunk = tampered["tensors"][0]["chunks"][0]
    chunk["sha256"] = chunk.pop("blake3")
    _write_manifest(store, "r", step, tampered)
    with pytest.raises(IntegrityError) as caught:
        ckstore.verify(str(store), "r", step)
    assert "blake3 is missing" in caught.value.message

    # a well-formed digest that is not the chunk's
    tampered = json.loads(json.dumps(good))
    biggest = max(tampered["tensors"], key=lambda t: t["nbytes"])
    biggest["chunks"][0]["blake3"] = "0" * 64
    _write_manifest(store, "r", step, tampered)
    with pytest.raises(IntegrityError, match="manifest_blake3") as caught:  # the manifest's seal sees it first
        checkpoint.load(str(store), "r", step)
    tampered.pop("manifest_blake3")  # a manifest from before the seal: the chunk's own digest sees it
    _write_manifest(store, "r", step, tampered)
    with pytest.raises(IntegrityError) as caught:
        checkpoint.load(str(store), "r", step)
    assert f"tensor {biggest['name']}" in caught.value.message and "does not match its blake3" in caught.value.message


def _biggest(manifest):
    return max(manifest["tensors"], key=lambda t: t["nbytes"])


@pytest.mark.parametrize("field, change, expected", [
    ("codec", lambda t: t.update(codec="pickle"), "codec: Input should be 'zstd'"),
    ("raw", lambda t: t["chunks"][0].update(raw=10**15), "chunks hold 1000000000000000 bytes, not its nbytes"),
    ("dtype", lambda t: t.update(dtype="evil"), "unknown dtype 'evil' in manifest"),
    ("stored_dtype", lambda t: t.update(stored_dtype="os.system"), "unknown dtype 'os.system' in manifest"),
    ("shape", lambda t: t.update(shape=[2]), "shape [2] of float32 does not hold its nbytes"),
    ("shape", lambda t: t.update(shape=[-t["nbytes"] // 4]), "does not hold its nbytes"),
    ("shape", lambda t: t.update(shape=[10**30]), "does not hold its nbytes"),
])
def test_a_manifest_with_a_bad_tensor_field_is_refused_naming_it_with_a_hint(tmp_path, drifting, field, change,
                                                                              expected):
    """A codec, chunk size or dtype the manifest cannot have: refused before any decoding, the
    manifest's path and the field named, with a hint, on restore and verify alike."""
    store = tmp_path / "s"
    (step, state), = drifting[:1]
    checkpoint.save(state, str(store), "r", step)
    tampered = _manifest(store, "r", step)
    change(_biggest(tampered))
    _write_manifest(store, "r", step, tampered)
    for attempt in (lambda: checkpoint.load(str(store), "r", step), lambda: ckstore.verify(str(store), "r", step)):
        with pytest.raises(IntegrityError) as caught:
            attempt()
        assert expected in caught.value.message and "manifest.json" in caught.value.message, caught.value.message
        assert caught.value.hint
    assert field in caught.value.message or f"{_biggest(tampered)['name']!r}" in caught.value.message


def test_the_manifest_model_accepts_exactly_the_codecs_there_are():
    assert set(typing.get_args(Codec)) == set(ckstore.codecs.ALL_CODECS)


def test_the_format1_fixture_restores_and_verifies(tmp_path):
    store = format1.copy_store(tmp_path / "v1store")
    for step, fingerprint in format1.expected().items():
        assert _manifest(store, format1.RUN, step)["format"] == FORMAT_1
        assert format1.fingerprint(checkpoint.load(str(store), format1.RUN, step)) == fingerprint
        assert_same(format1.state_at(step), checkpoint.load(str(store), format1.RUN, step))
    report = ckstore.verify_run(str(store), format1.RUN)
    assert report["ok"] and report["checked"] == list(format1.STEPS)
    result = runner.invoke(app, ["ckpt", "verify", "--store", str(store), "--run", format1.RUN])
    assert result.exit_code == 0, result.output
    assert ckstore.same_content(format1.state_at(10), ckstore.read_manifest(storage.resolve(store), format1.RUN, 10))


def test_a_flipped_byte_in_a_format1_chunk_is_named_with_its_sha256(tmp_path):
    store = format1.copy_store(tmp_path / "v1store")
    name, index, chunk, spot = _raw_plane_spot(store, format1.RUN, 0)
    path = store / format1.RUN / "step-0" / chunk["file"]
    data = bytearray(path.read_bytes())
    data[spot] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as caught:
        checkpoint.load(str(store), format1.RUN, 0)
    assert f"tensor {name} of v1/step-0: chunk {index} in {path}" in caught.value.message
    assert "sha256" in caught.value.message
    report = ckstore.verify_run(str(store), format1.RUN)
    assert [d["step"] for d in report["damaged"]] == list(format1.STEPS)  # 10 and 20 are deltas on step 0


def test_format2_deltas_on_a_format1_base_restore_bit_exact(tmp_path):
    store = tmp_path / "mixed"
    fingerprints = format1.mixed_store(store)
    manifests = {step: _manifest(store, format1.RUN, step) for step in fingerprints}
    assert {s: m["format"] for s, m in manifests.items()} == {0: FORMAT_1, 10: FORMAT_1, 20: FORMAT_1,
                                                              30: FORMAT_2, 40: FORMAT_2, 50: FORMAT_2}
    assert manifests[30]["base"]["step"] == 20 and manifests[30]["chain"] == [20, 0]
    for step, fingerprint in fingerprints.items():
        assert format1.fingerprint(checkpoint.load(str(store), format1.RUN, step)) == fingerprint
    assert ckstore.verify_run(str(store), format1.RUN)["ok"]


# --------------------------------------------------------------------------- codec choices reused


def _tensors(store, step):
    return {t["name"]: t for t in _manifest(store, "r", step)["tensors"]}


def test_codec_choices_are_reused_then_sampled_again_after_n_saves(tmp_path):
    """With `previous` bases every delta is of one kind: step 0 (no base) and step 1 (first delta)
    sample; a choice then serves `resample_every` = 3 saves in all before the next sample."""
    states = drifting_states(steps=tuple(range(0, 80, 10)))
    reused_store, fresh_store = tmp_path / "reused", tmp_path / "fresh"
    options = {"keyframe_every": 100, "delta_reference": "previous", "chunk_size": "64KiB", "resample_drift": 0.9}
    for step, state in states:
        checkpoint.save(state, str(reused_store), "r", step, resample_every=3, **options)
        checkpoint.save(state, str(fresh_store), "r", step, resample_every=0, **options)
    ckstore._CACHE.clear()

    sampled = [{t["sampled"] for t in _tensors(reused_store, step).values()} for step, _ in states]
    assert sampled == [{True}, {True}, {False}, {False}, {True}, {False}, {False}, {True}]
    assert all(t["sampled"] for step, _ in states for t in _tensors(fresh_store, step).values())
    stats = _manifest(reused_store, "r", 20)["stats"]
    assert stats["reused"] == len(_tensors(reused_store, 20)) and stats["sampled"] == 0
    for (step, _state), (previous, _) in zip(states[1:], states, strict=False):
        assert _manifest(reused_store, "r", step)["kind"] == "delta"
        for name, tensor in _tensors(reused_store, step).items():
            if not tensor["sampled"]:  # reused: the choice of the save before, plane mask included
                before = _tensors(reused_store, previous)[name]
                assert (tensor["codec"], tensor["planes"]) == (before["codec"], before["planes"])
    for step, state in states:  # reuse changes no byte of what comes back
        for store in (reused_store, fresh_store):
            assert_same(state, checkpoint.load(str(store), "r", step))


def _drifted(tensor, step):
    """`tensor` (float32) with a new lowest mantissa byte per element: an XOR delta stays cheap."""
    low = torch.from_numpy(np.random.default_rng(step).integers(0, 256, tensor.numel(), dtype=np.int32))
    return ((tensor.view(torch.int32) & -256) | low.reshape(tensor.shape)).view(torch.float32)


def test_a_reused_choice_whose_ratio_drifts_is_sampled_again_at_the_next_save(tmp_path):
    base = {"big": torch.randn(65536, generator=torch.Generator().manual_seed(1)),
            "other": torch.randn(32768, generator=torch.Generator().manual_seed(2))}

    def state(step, noisy=False):  # from step 30 on, "big" turns to noise: its delta stops paying
        big = torch.randn(65536, generator=torch.Generator().manual_seed(step)) if noisy else _drifted(base["big"], step)
        return {"big": big, "other": _drifted(base["other"], step), "step": step}

    plan = [(0, state(0)), (10, state(10)), (20, state(20)), (30, state(30, True)), (40, state(40, True))]
    store = tmp_path / "s"
    options = {"keyframe_every": 100, "delta_reference": "previous", "chunk_size": "64KiB", "resample_every": 10}
    for step, value in plan:
        checkpoint.save(value, str(store), "r", step, **options)
    ckstore._CACHE.clear()
    at = {step: _tensors(store, step) for step, _ in plan}
    assert [at[s]["big"]["sampled"] for s, _ in plan] == [True, True, False, False, True]
    assert at[30]["big"]["codec"] == at[20]["big"]["codec"] and at[20]["big"]["codec"].startswith("delta")
    assert at[40]["big"]["codec"] == "bgzstd"  # sampled again: a delta of noise does not pay
    assert [at[s]["other"]["sampled"] for s, _ in plan] == [True, True, False, False, False]
    for step, value in plan:
        assert_same(value, checkpoint.load(str(store), "r", step))


def _deep_tree(levels: int) -> str:
    """JSON text of a tensor inside `levels` lists (built as text: json.dumps recurses)."""
    return '{"list":[' * levels + '{"tensor":0}' + "]}" * levels


@pytest.mark.parametrize("tree, expected", [
    (json.dumps({"dict": [[{"str": "w"}, {"tensor": 10**6}]]}), "tree.dict[0]: tensor index '1000000' is not one of its"),
    (json.dumps({"dict": [[{"str": "n"}, {"int": "9" * 5000}]]}), "tree.dict[0]: int node holds"),
    ('"x"', "tree: 'x' is not a tree node"),
    ('{"set": [1]}', "unknown node kind 'set'"),
    (_deep_tree(300), "nested more than 100 containers deep"),
    (_deep_tree(5000), "nested too deeply to be a manifest"),
], ids=["tensor-index", "huge-int", "not-a-node", "unknown-kind", "deep", "deeper-than-json"])
def test_a_manifest_whose_tree_cannot_be_rebuilt_is_refused_by_verify_get_and_ls(tmp_path, drifting, tree, expected):
    """verify must not pass a checkpoint that get cannot rebuild; a hostile tree (bad index, huge
    int, deep nesting) is refused naming the manifest, never an internal error."""
    store = tmp_path / "s"
    (step, state), = drifting[:1]
    checkpoint.save(state, str(store), "r", step)
    tampered = _manifest(store, "r", step)
    tampered["tree"] = "TREE"
    text = json.dumps(tampered).replace('"tree": "TREE"', f'"tree": {tree}')
    (store / "r" / f"step-{step}" / "manifest.json").write_text(text)
    for attempt in (lambda: checkpoint.load(str(store), "r", step), lambda: ckstore.verify(str(store), "r", step),
                    lambda: ckstore.list_checkpoints(str(store))):
        with pytest.raises(IntegrityError) as caught:
            attempt()
        assert expected in caught.value.message and "manifest.json" in caught.value.message, caught.value.message
        assert caught.value.hint
    result = runner.invoke(app, ["ckpt", "verify", "--store", str(store), "--run", "r"])
    assert result.exit_code == 4 and "damaged" in result.output


def test_ls_reads_sizes_from_the_manifest_fields_not_its_stats(tmp_path, drifting):
    store = tmp_path / "s"
    (step, state), = drifting[:1]
    checkpoint.save(state, str(store), "r", step)
    good = ckstore.list_checkpoints(str(store))[0]
    tampered = _manifest(store, "r", step)
    tampered["stats"] = {"raw_bytes": 1}
    _write_manifest(store, "r", step, tampered)
    (row,) = ckstore.list_checkpoints(str(store))
    assert (row["raw_bytes"], row["stored_bytes"], row["ratio"]) == (good["raw_bytes"], good["stored_bytes"], good["ratio"])
    assert row["raw_bytes"] == sum(t["nbytes"] for t in tampered["tensors"])


def test_the_manifest_checks_know_the_delta_codecs_there_are():
    assert DELTA_CODECS == ckstore.codecs.DELTA_CODECS  # a copy (manifest imports no codec library)
