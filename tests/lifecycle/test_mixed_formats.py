"""GC and tiering over a store holding format-1 checkpoints (the committed fixture, written by the
old code) and format-2 ones saved on top of them, with a format-2 delta on a format-1 base."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from seedance_tasks import checkpoint, storage
from seedance_tasks.checkpoint import store as ckstore
from seedance_tasks.checkpoint.manifest import FORMAT_1, FORMAT_2
from seedance_tasks.lifecycle import gc, tiering
from tests.checkpoint import format1

RUN = format1.RUN


def _formats(store) -> dict[int, str]:
    return {step: json.loads((store / RUN / f"step-{step}" / "manifest.json").read_text())["format"]
            for step in ckstore.committed_steps(storage.resolve(store), RUN)}


def _restorable(store, fingerprints, steps):
    for step in steps:
        assert format1.fingerprint(checkpoint.load(str(store), RUN, step)) == fingerprints[step], f"step {step}"
    assert ckstore.verify_run(str(store), RUN)["ok"]


def test_gc_over_a_mixed_store_keeps_the_format1_bases_of_format2_deltas(tmp_path):
    store = tmp_path / "mixed"
    fingerprints = format1.mixed_store(store)  # 0, 10, 20 format 1; 30 (delta on 20), 40 (key), 50 format 2
    assert set(_formats(store).values()) == {FORMAT_1, FORMAT_2}
    result = gc.collect(str(store), apply=True, keep_last=1, keep_every=30)
    kept = set(ckstore.committed_steps(storage.resolve(store), RUN))
    # keep every 30: 0 and 30; 30 needs 20 and 0 (format 1); keep last 1: 50, which needs 40
    assert kept == {0, 20, 30, 40, 50}
    assert {d["step"] for d in result["runs"][0]["delete"]} == {10}
    assert _formats(store) == {0: FORMAT_1, 20: FORMAT_1, 30: FORMAT_2, 40: FORMAT_2, 50: FORMAT_2}
    _restorable(store, fingerprints, kept)


def test_tiering_a_mixed_store_rewrites_each_manifest_in_its_own_format(tmp_path, lifecycle_settings, trust_tiers):
    store, warm, cold = tmp_path / "mixed", tmp_path / "warm", tmp_path / "cold"
    trust_tiers(warm, cold)
    fingerprints = format1.mixed_store(store)
    settings = lifecycle_settings.model_copy(deep=True)
    settings.tiers.keep_latest_hot = False
    settings.tiers.warm.uri, settings.tiers.cold.uri = str(warm), str(cold)
    # the format-1 checkpoints were saved when the fixture was committed, the others just now: with
    # cold only after ~100 years, "2 hours from now" is warm for both, whatever today's date
    settings.tiers.cold_after = 100 * 365 * 86400
    before = _formats(store)

    moved = tiering.tier(str(store), settings=settings, apply=True, now=datetime.now(UTC) + timedelta(hours=2))
    assert moved["moved"] == len(fingerprints)
    assert {row["tier"] for row in ckstore.list_checkpoints(str(store), RUN)} == {"warm"}
    assert _formats(store) == before  # a format-1 manifest stays format 1 (sha256 chunks), and 2 stays 2
    for step, fmt in before.items():
        manifest = json.loads((store / RUN / f"step-{step}" / "manifest.json").read_text())
        digests = {key for tensor in manifest["tensors"] for chunk in tensor["chunks"] for key in chunk
                   if key in ("sha256", "blake3")}
        assert digests == ({"sha256"} if fmt == FORMAT_1 else {"blake3"})
        assert all(entry["uri"].startswith(str(warm)) for entry in manifest["files"].values())
    _restorable(store, fingerprints, fingerprints)

    gc.collect(str(store), settings=settings, apply=True, keep_last=1)  # and every 100th (config): step 0
    kept = set(ckstore.committed_steps(storage.resolve(store), RUN))
    assert kept == {0, 40, 50}  # 50 is a delta on 40; 0 (format 1, on the warm tier) stays restorable
    _restorable(store, fingerprints, kept)
