"""Retention policies: last N, every M, best K by a metric, tags, bases of kept deltas; bad policies."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.errors import ConfigError, UsageError
from seedance_tasks.lifecycle import policy
from seedance_tasks.lifecycle.settings import RetentionPolicy

from .conftest import make_store

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def manifest(step, *, chain=(), metrics=None, tags=(), age_s=86400):
    return {"step": step, "chain": list(chain), "metrics": metrics or {}, "tags": list(tags),
            "created_at": (NOW - timedelta(seconds=age_s)).isoformat()}


def rules(**values):
    defaults = {"keep_last": 1, "keep_every": None, "keep_best": 0, "keep_tagged": False}
    return RetentionPolicy(**{**defaults, **values})


def test_keep_last_n():
    found = [manifest(s) for s in range(0, 100, 10)]
    assert list(policy.select(found, rules(keep_last=3), NOW)) == [70, 80, 90]


def test_keep_every_m_th_step():
    found = [manifest(s) for s in range(0, 1000, 50)]
    kept = policy.select(found, rules(keep_every=200), NOW)
    assert list(kept) == [0, 200, 400, 600, 800, 950]
    assert kept[400] == ["every"] and kept[950] == ["last"]


def test_keep_best_k_by_metric_lower_or_higher_is_better():
    losses = {0: 3.0, 10: 1.5, 20: 2.0, 30: 1.2, 40: 2.5, 50: 9.0}
    found = [manifest(s, metrics={"val_loss": v}) for s, v in losses.items()] + [manifest(60)]  # 60: no metric
    best = policy.select(found, rules(keep_best=2, metric="val_loss"), NOW)
    assert [s for s, why in best.items() if "best" in why] == [10, 30]
    worst = policy.select(found, rules(keep_best=2, metric="val_loss", metric_mode="max"), NOW)
    assert [s for s, why in worst.items() if "best" in why] == [0, 50]


@pytest.mark.parametrize("mode", ["min", "max"])
def test_best_ignores_metrics_that_cannot_rank(mode):
    """NaN, infinities, bools, strings and ints too large for a float never push a real best out."""
    odd = {1: float("nan"), 2: float("inf"), 3: float("-inf"), 4: True, 5: "0.1", 6: 10**400, 7: None}
    real = {0: 5.0, 10: 1.0, 20: 3.0, 30: 2.0}
    found = [manifest(s, metrics={"val_loss": v}) for s, v in {**odd, **real}.items()] + [manifest(99)]
    found.sort(key=lambda m: m["step"])
    kept = policy.select(found, rules(keep_best=2, metric="val_loss", metric_mode=mode), NOW)
    assert [s for s, why in kept.items() if "best" in why] == ([10, 30] if mode == "min" else [0, 20])


def test_equal_metrics_keep_the_latest_steps():
    found = [manifest(s, metrics={"val_loss": 1.0}) for s in range(0, 50, 10)]
    kept = policy.select(found, rules(keep_best=2, metric="val_loss"), NOW)
    assert [s for s, why in kept.items() if "best" in why] == [30, 40]


def test_naive_created_at_is_read_as_utc():
    """An edited manifest's time without a zone neither crashes GC nor tiering's age."""
    from seedance_tasks.lifecycle import inventory

    young = manifest(0, age_s=60)
    young["created_at"] = young["created_at"].removesuffix("+00:00")
    assert policy.select([young, manifest(10)], rules(min_age=3600), NOW) == {0: ["young"], 10: ["last"]}
    assert inventory.age_s(young, (NOW - timedelta(hours=1)).replace(tzinfo=None), NOW) == 60


def test_keep_tagged_and_young():
    found = [manifest(0, tags=["release"]), manifest(10), manifest(20, age_s=60), manifest(30)]
    kept = policy.select(found, rules(keep_tagged=True, min_age=3600), NOW)
    assert kept == {0: ["tagged"], 20: ["young"], 30: ["last"]}
    assert list(policy.select(found, rules(keep_tagged=False), NOW)) == [30]


def test_bases_of_kept_deltas_are_kept():
    found = [manifest(0), manifest(10, chain=[0]), manifest(20, chain=[0]), manifest(30, chain=[20, 0]),
             manifest(40), manifest(50, chain=[40])]
    kept = policy.select(found, rules(keep_last=1, keep_every=30), NOW)
    assert set(kept) == {0, 20, 30, 40, 50}
    assert kept[20] == ["base of 30"] and kept[40] == ["base of 50"]
    assert "every" in kept[0] and any(r.startswith("base of") for r in kept[0])


def test_bases_of_bases_are_kept_when_a_chain_stops_short():
    """An unsealed manifest whose chain names only its base: the base's own chain is kept too."""
    found = [manifest(0), manifest(10, chain=[0]), manifest(20, chain=[10, 0]), manifest(30, chain=[20]),
             manifest(40)]
    kept = policy.select(found, rules(keep_last=1, keep_every=30), NOW)
    assert set(kept) == {0, 10, 20, 30, 40}
    assert kept[10] == ["base of 20"] and kept[20] == ["base of 30"]


def test_store_policy_keeps_chains_restorable_end_to_end(tmp_path):
    """On a real store: every kept step's chain is kept (read from the manifests GC acts on)."""
    from seedance_tasks import storage
    from seedance_tasks.lifecycle import inventory

    make_store(tmp_path / "s", steps=range(0, 120, 10), keyframe_every=4)
    found = inventory.manifests(storage.resolve(tmp_path / "s"), "r")
    kept = policy.select(found, rules(keep_last=1), NOW)
    assert any(m["chain"] for m in found if m["step"] == 110)
    assert set(kept) == {110, *next(m["chain"] for m in found if m["step"] == 110)}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--keep-last", "0"], "keep_last"),
        (["--keep-every", "0"], "keep_every"),
        (["--keep-best", "-1"], "keep_best"),
        (["--keep-best", "2", "--metric", ""], "keep_best needs a metric"),
    ],
)
def test_bad_policies_are_rejected_with_a_clear_error(tmp_path, options, message):
    make_store(tmp_path / "s", steps=[0, 10])
    before = sorted(p for p in (tmp_path / "s").rglob("*"))
    result = CliRunner().invoke(app, ["ckpt", "gc", "--store", str(tmp_path / "s"), "--apply", *options])
    assert result.exit_code == 2, result.output
    assert "bad retention policy" in result.output and message in result.output
    assert sorted(p for p in (tmp_path / "s").rglob("*")) == before


def test_bad_policies_in_config_are_rejected(tmp_path):
    from seedance_tasks.config import load_settings

    for bad, key in [
        ("lifecycle:\n  runs: {big: {keep_last: 0}}\n", "runs.big"),
        ("lifecycle:\n  tiers: {warm_after: 2h, cold_after: 1h}\n", "cold_after"),
        ("lifecycle:\n  tiers: {cold: {storage_class: TAPE}}\n", "storage_class"),
        ("lifecycle:\n  retention: {keep_lats: 3}\n", "keep_lats"),
    ]:
        path = tmp_path / "bad.yaml"
        path.write_text(bad)
        with pytest.raises(ConfigError, match=key):
            load_settings(path, environ={})


def test_per_run_override_and_per_call_override(tmp_path):
    from seedance_tasks.config import load_settings

    path = tmp_path / "c.yaml"
    path.write_text("lifecycle:\n  retention: {keep_last: 2, keep_every: null}\n  runs: {big: {keep_last: 10}}\n")
    settings = load_settings(path, environ={}).lifecycle
    assert settings.policy_for("big").keep_last == 10 and settings.policy_for("other").keep_last == 2
    assert policy.policy_with(settings, "big", keep_last=4, keep_every=None).keep_last == 4
    with pytest.raises(UsageError, match="keep_last"):
        policy.policy_with(settings, "big", keep_last=0)


def test_tag_command_protects_a_checkpoint(tmp_path):
    store = tmp_path / "s"
    make_store(store, steps=range(0, 60, 10), keyframe_every=1)
    runner = CliRunner()
    tagged = runner.invoke(app, ["ckpt", "tag", "release", "--store", str(store), "--run", "r", "--step", "20", "--json"])
    assert tagged.exit_code == 0, tagged.output
    assert json.loads(tagged.output)["tags"] == ["release"]
    result = runner.invoke(app, ["ckpt", "gc", "--store", str(store), "--keep-last", "1", "--keep-every", "1000",
                                 "--json"])
    kept = {k["step"]: k["reasons"] for k in json.loads(result.output)["runs"][0]["kept"]}
    assert kept == {0: ["every"], 20: ["tagged"], 50: ["last"]}
    untag = runner.invoke(app, ["ckpt", "tag", "release", "--remove", "--store", str(store), "--run", "r", "--step", "20"])
    assert untag.exit_code == 0
    result = runner.invoke(app, ["ckpt", "gc", "--store", str(store), "--keep-last", "1", "--keep-every", "1000",
                                 "--json"])
    assert 20 not in {k["step"] for k in json.loads(result.output)["runs"][0]["kept"]}
