"""Default runs: with the shipped config and the form's defaults (an empty conf), every DAG run
ends without a failed task (nothing configured = skipped, with the reason); and an edit of the
config file changes what the next DAG run does, pipeline by pipeline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, xcom_value

DAG_IDS = sorted(
    "seedance_" + path.stem.removeprefix("seedance_") for path in (REPO / "dags").glob("seedance_*.py")
)
NOTHING_CONFIGURED = {  # DAG -> the task that skips, and what its reason names
    "seedance_compaction": ("plan", "compaction.default_uri"),
    "seedance_checkpoints": ("scan", "checkpoint.inbox"),
    "seedance_checkpoint_lifecycle": ("plan", "checkpoint.store"),
    "seedance_cost_recovery": ("prepare", "cost.billing_uri"),
    "seedance_cost_actions": ("plan", "cost.out_uri"),
    "seedance_preprocess": ("build_shards", "source"),
    "seedance_signals": ("prepare", "signals.root"),
}


def _states(dag_run) -> dict[str, str]:
    return {f"{ti.task_id}[{ti.map_index}]": str(ti.state) for ti in dag_run.get_task_instances()}


@pytest.fixture
def quick_training(monkeypatch):
    """The training DAG trains for real with an empty conf: two steps on one CPU process keep it short."""
    monkeypatch.setenv("SEEDANCE__TRAINING__STEPS", "2")
    monkeypatch.setenv("SEEDANCE__TRAINING__NPROC_PER_NODE", "1")


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_an_empty_conf_succeeds_or_skips_with_a_reason(dag_id, run_dag, request):
    if dag_id == "seedance_training":
        request.getfixturevalue("quick_training")
    dag_run = run_dag(dag_id, {})
    states = _states(dag_run)
    assert dag_run.state == "success", states
    assert set(states.values()) <= {"success", "skipped"}, states
    if dag_id in NOTHING_CONFIGURED:
        task_id, named = NOTHING_CONFIGURED[dag_id]
        assert states[f"{task_id}[-1]"] == "skipped", states
        assert all(state == "skipped" for state in states.values()), states  # nothing ran half-way
        reason = xcom_value(dag_run, task_id)["skipped"]  # the task's summary says why
        assert named in reason, reason
    else:  # training has defaults for everything: a synthetic-token CPU job
        assert "success" in states.values()


def test_an_earlier_runs_conf_does_not_leak_into_the_next_run(tmp_path, run_dag):
    """The form's defaults are what the next run gets, whatever a run before it was given."""
    first = run_dag("seedance_preprocess", {"source": str(tmp_path / "missing")})
    assert first.state == "failed"  # a source that does not exist: fails fast, not retried
    second = run_dag("seedance_preprocess", {})
    assert second.state == "success" and "source" in xcom_value(second, "build_shards")["skipped"]


def test_every_dag_is_covered():
    assert set(NOTHING_CONFIGURED) | {"seedance_training"} == set(DAG_IDS)


# --------------------------------------------------------------------------- config edits


@pytest.fixture
def edit_config(tmp_path, monkeypatch):
    """Write a copy of the shipped config with `changes` merged in and point SEEDANCE_CONFIG at it."""

    def _edit(changes: dict) -> Path:
        data = yaml.safe_load((REPO / "config" / "seedance.yaml").read_text())
        for section, values in changes.items():
            data[section] = _merge(data.get(section) or {}, values)
        path = tmp_path / f"seedance-{len(list(tmp_path.glob('seedance-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(data))
        monkeypatch.setenv("SEEDANCE_CONFIG", str(path))
        return path

    return _edit


def _merge(base: dict, changes: dict) -> dict:
    merged = dict(base)
    for key, value in changes.items():
        merged[key] = _merge(merged.get(key) or {}, value) if isinstance(value, dict) else value
    return merged


def test_compaction_follows_the_configured_lake_and_sizes(tmp_path, run_dag, edit_config):
    from seedance_tasks.compaction.sample import make_sample_lake

    lake = tmp_path / "lake"
    make_sample_lake(str(lake), partitions=2, files_per_partition=3, rows_per_file=400)
    edit_config({"compaction": {"default_uri": str(lake), "target_file_size": "512KiB", "min_age": "0"}})
    dag_run = run_dag("seedance_compaction", {})
    assert dag_run.state == "success", _states(dag_run)
    report = xcom_value(dag_run, "report")
    assert report["uri"].endswith("lake") and report["partitions_compacted"] == 2
    assert report["target_file_size"] == 512 * 1024  # not the shipped 512MiB
    assert report["small_file_size"] == 384 * 1024

    edit_config({"compaction": {"default_uri": str(lake), "target_file_size": "1MiB", "small_file_size": "1KiB",
                                "min_age": "0"}})
    again = xcom_value(run_dag("seedance_compaction", {}), "report")
    assert again["target_file_size"] == 1024**2 and again["small_file_size"] == 1024


def test_preprocess_follows_the_configured_shard_size(tmp_path, run_dag, edit_config):
    from seedance_tasks.shards.sample import make_sample_files

    source = tmp_path / "samples"
    make_sample_files(str(source), 12)
    conf = {"source": str(source), "cpu_workers": 1, "io_workers": 1}
    edit_config({"shards": {"shard_size": "8KiB"}, "preprocess": {"size": 16}})
    small = run_dag("seedance_preprocess", conf)
    assert small.state == "success", _states(small)
    small_count = xcom_value(small, "build_shards")["shard_count"]

    edit_config({"shards": {"shard_size": "64MiB"}, "preprocess": {"size": 16}})
    conf["shards"], conf["out"] = str(tmp_path / "big-shards"), str(tmp_path / "big-out")
    big = run_dag("seedance_preprocess", conf)
    assert big.state == "success", _states(big)
    assert small_count > 1 and xcom_value(big, "build_shards")["shard_count"] == 1


def _tensor_checkpoint(path: Path, step: int):
    import torch

    generator = torch.Generator().manual_seed(step)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"w": torch.randn(64, 64, generator=generator), "step": torch.tensor(step)}, path)
    os.utime(path, (0, 0))  # old enough for any inbox min_age


def test_checkpoints_follow_the_configured_locations_and_keyframes(tmp_path, run_dag, edit_config):
    from seedance_tasks.checkpoint.store import list_checkpoints

    inbox, store = tmp_path / "inbox", tmp_path / "store"
    for step in (10, 20, 30):
        _tensor_checkpoint(inbox / "r" / f"step-{step:06d}.pt", step)
    edit_config({"checkpoint": {"inbox": str(inbox), "store": str(store), "codec": "zstd", "keyframe_every": 1}})
    dag_run = run_dag("seedance_checkpoints", {})
    assert dag_run.state == "success", _states(dag_run)
    summary = xcom_value(dag_run, "report")
    assert summary["by_status"] == {"stored": 3} and summary["store"] == str(store)
    rows = list_checkpoints(str(store), "r")
    assert sorted(row["step"] for row in rows) == [10, 20, 30]
    assert {row["kind"] for row in rows} == {"full"}  # keyframe_every: 1
    manifests = [json.loads(p.read_text()) for p in store.rglob("*.json") if "_seedance" not in p.parts]
    codecs = {t["codec"] for m in manifests if isinstance(m, dict) and isinstance(m.get("tensors"), list)
              for t in m["tensors"]}
    assert "zstd" in codecs and not codecs & {"bgzstd", "delta", "lz4"}, codecs  # the configured codec


def test_lifecycle_follows_the_configured_store_and_retention(tmp_path, run_dag, edit_config):
    from tests.lifecycle.conftest import make_store

    store = tmp_path / "store"
    make_store(store, run="a", steps=range(0, 60, 10))
    edit_config({"lifecycle": {"store": str(store), "retention": {"keep_last": 1, "keep_every": None}}})
    dag_run = run_dag("seedance_checkpoint_lifecycle", {})
    assert dag_run.state == "success", _states(dag_run)
    report = xcom_value(dag_run, "report")
    assert report["store"].endswith("store") and report["applied"] is False  # manual run without apply: dry
    kept_one = report["runs"][0]["gc"]
    edit_config({"lifecycle": {"store": str(store), "retention": {"keep_last": 3, "keep_every": None}}})
    kept_three = xcom_value(run_dag("seedance_checkpoint_lifecycle", {}), "report")["runs"][0]["gc"]
    assert kept_one["kept"] < kept_three["kept"] and kept_one["deleted"] > kept_three["deleted"]


def test_training_uses_the_configured_max_restarts(run_dag, edit_config, quick_training):
    edit_config({"training": {"max_restarts": 3, "steps": 2, "nproc_per_node": 1}})
    dag_run = run_dag("seedance_training", {})
    assert dag_run.state == "success", _states(dag_run)
    planned = xcom_value(dag_run, "plan")
    assert planned["max_restarts"] == 3 and "--max-restarts=3" in planned["command"]


def test_cost_follows_the_configured_sources_and_basis(tmp_path, run_dag, edit_config):
    from tests.cost.helpers import three_months

    billing, owners = three_months(tmp_path)
    out = tmp_path / "out"
    sources = {"billing_uri": str(billing), "owners_file": str(owners), "out_uri": str(out)}
    for basis in ("BilledCost", "EffectiveCost"):
        edit_config({"cost": {**sources, "basis": basis}})
        dag_run = run_dag("seedance_cost_recovery", {"month": "2024-08"})
        assert dag_run.state == "success", _states(dag_run)
        summary = json.loads((out / "month=2024-08" / "summary.json").read_text())
        assert summary["basis"] == basis


# --------------------------------------------------------------------------- config at the edges


def test_resolving_an_s3_uri_builds_only_the_storage_section():
    """No import circle, and `storage` asks for its own section: no pipeline's model is imported."""
    import subprocess
    import sys

    probe = (
        "import json, sys\n"
        "from seedance_tasks import storage\n"
        "storage.resolve('s3://bucket/prefix')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('seedance_tasks.') and m.endswith('.settings'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120,
                         env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true"})
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_each_settings_module_imports_on_its_own():
    """A pipeline's settings module imports without `config` importing every other one first."""
    import subprocess
    import sys

    from seedance_tasks.config import SECTIONS

    for name, target in SECTIONS.items():
        module = target.partition(":")[0]
        probe = (f"import sys, {module}\n"
                 "print(sorted(m for m in sys.modules if m.startswith('seedance_tasks.') and m.endswith('.settings')))")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
        loaded = eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own probe's list
        assert set(loaded) <= {module}, (name, loaded)


def test_a_run_param_overrides_config_and_a_bad_one_is_named(edit_config):
    from seedance_tasks.compaction.airflow_tasks import SETTINGS_PARAMS
    from seedance_tasks.dag_support import run_settings
    from seedance_tasks.errors import ConfigError

    edit_config({"compaction": {"target_file_size": "1MiB", "min_age": "2h"}})
    settings = run_settings("compaction", {"target_file_size": "512M", "min_age": None, "small_file_size": ""},
                            SETTINGS_PARAMS)
    assert settings.target_file_size == 512 * 1000**2 and settings.min_age == 7200  # empty: config's
    with pytest.raises(ConfigError) as info:
        run_settings("compaction", {"min_age": "soon"}, SETTINGS_PARAMS)
    assert "param min_age" in info.value.message and "soon" in info.value.message
