"""A stored plan (`_seedance/plans/*.json`, read by the DAG's `compact` task) is untrusted: a
tampered one is refused with an error naming the plan file and the key; nothing is read, moved
or written through it."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seedance_tasks import journal, storage
from seedance_tasks.boundary import classify
from seedance_tasks.compaction.run import compact_group_attempt, load_plan, plan_for_dag
from seedance_tasks.errors import IntegrityError

HOLDER = "airflow:seedance_compaction:test-run"


@pytest.fixture
def planned(tmp_path, small_settings):
    """A lake of one partition (p=1, two small files), an outside folder with a file and a
    symlink `link=1` to it inside the lake, and the DAG's saved plan: (lake, outside, group, plan)."""
    lake, outside = tmp_path / "lake", tmp_path / "outside"
    (lake / "p=1").mkdir(parents=True)
    outside.mkdir()
    for name in ("a", "b"):
        pq.write_table(pa.table({"x": [1]}), lake / "p=1" / f"{name}.parquet")
    pq.write_table(pa.table({"x": [9]}), outside / "precious.parquet")
    (lake / "link=1").symlink_to(outside)
    out = plan_for_dag(str(lake), small_settings, holder=HOLDER)
    [group] = out["groups"]
    return lake, outside, group, json.loads(open(group["plan_uri"]).read())


def _tamper(group: dict, plan: dict) -> None:
    with open(group["plan_uri"], "w") as handle:
        json.dump(plan, handle)


def _assert_refused(lake, outside, group, *needles):
    with pytest.raises(IntegrityError) as refused:
        compact_group_attempt(group, holder=HOLDER)
    text = str(classify(refused.value))
    assert text.startswith(f"plan {group['plan_uri']}"), text  # the plan file, not a journal
    assert "journal" not in refused.value.message and "hint:" in text
    for needle in needles:
        assert needle in text, text
    assert os.listdir(outside) == ["precious.parquet"]
    assert sorted(os.listdir(lake / "p=1")) == ["a.parquet", "b.parquet"]
    assert not (lake / "_seedance" / "trash").exists() and journal.pending(storage.resolve(lake)) == []


def test_a_dotdot_path_in_a_plan_is_refused_naming_the_plan_file(planned):
    lake, outside, group, plan = planned
    plan["partitions"][0]["files"][0]["path"] = "../outside/precious.parquet"
    _tamper(group, plan)
    _assert_refused(lake, outside, group, "partitions[0].files[0].path", "'../outside/precious.parquet'")


def test_a_plan_path_through_a_symlink_is_refused_and_nothing_outside_is_touched(planned):
    lake, outside, group, plan = planned
    plan["partitions"][0]["files"][1]["path"] = "link=1/precious.parquet"
    plan["partitions"][0]["partition"] = "link=1"
    plan["partitions"][0]["files"] = plan["partitions"][0]["files"][1:]
    _tamper(group, plan)
    _assert_refused(lake, outside, group, "partitions[0].partition", "symlink")


def test_a_plan_file_through_a_symlink_in_its_partition_is_refused(planned):
    lake, outside, group, plan = planned
    plan["partitions"][0]["files"][1]["path"] = "p=1/escape.parquet"
    (lake / "p=1" / "escape.parquet").symlink_to(outside / "precious.parquet")
    _tamper(group, plan)
    with pytest.raises(IntegrityError, match=r"partitions\[0\]\.files\[1\]\.path: .*symlink"):
        compact_group_attempt(group, holder=HOLDER)
    assert os.listdir(outside) == ["precious.parquet"] and (lake / "p=1" / "escape.parquet").is_symlink()


@pytest.mark.parametrize("edit, needle", [
    (lambda p: p.update(uri="/"), "uri"),
    (lambda p: p.update(run_id="../x"), "run_id"),
    (lambda p: p.update(partitions={}), "partitions must be a list"),
    (lambda p: p["partitions"][0]["files"].append(dict(p["partitions"][0]["files"][0])), "named twice"),
    (lambda p: p["partitions"][0]["files"][0].update(path="q=2/a.parquet"), "not a file of partition"),
    (lambda p: p["partitions"][0]["files"][0].update(path="p=1/_SUCCESS"), "not a visible Parquet file"),
    (lambda p: p["partitions"][0]["files"][0].update(size=-1), "files[0].size"),
    (lambda p: p["partitions"][0]["files"][0].update(path=["a"]), "files[0].path"),
    (lambda p: p["partitions"][0].update(files=[]), "files is empty"),
])
def test_a_tampered_plan_is_refused_naming_the_key(planned, edit, needle):
    lake, outside, group, plan = planned
    edit(plan)
    _tamper(group, plan)
    _assert_refused(lake, outside, group, needle)


def test_a_plan_that_is_not_json_or_gone_is_refused(planned):
    lake, outside, group, _ = planned
    with open(group["plan_uri"], "w") as handle:
        handle.write("{not json")
    _assert_refused(lake, outside, group, "not valid JSON")
    os.unlink(group["plan_uri"])
    _assert_refused(lake, outside, group, "does not exist")


def test_group_indices_outside_the_plan_are_refused(planned):
    lake, outside, group, _ = planned
    with pytest.raises(IntegrityError, match="indices"):
        compact_group_attempt({**group, "indices": [0, 7]}, holder=HOLDER)
    assert sorted(os.listdir(lake / "p=1")) == ["a.parquet", "b.parquet"]


def test_an_untampered_plan_loads_and_compacts(planned):
    lake, outside, group, _ = planned
    assert [p.partition for p in load_plan(group["plan_uri"]).partitions] == ["p=1"]
    [result] = compact_group_attempt(group, holder=HOLDER)["results"]
    assert result["status"] == "compacted" and result["rows"] == 2
    assert os.listdir(outside) == ["precious.parquet"]


@pytest.mark.parametrize("edit", [
    lambda plan_file, group: open(plan_file, "w").write('{"run_id": "../x"}'),
    lambda plan_file, group: open(plan_file, "w").write("{not json"),
    lambda plan_file, group: os.unlink(plan_file),
    lambda plan_file, group: group.update(indices=[0, 7]),
])
def test_a_refused_plan_fails_the_airflow_task_at_once(planned, monkeypatch, edit):
    """No retry reads a tampered plan (or a group that is not the plan's) differently: the mapped
    `compact` task fails at once with the error line, instead of being retried twice."""
    from airflow.sdk.exceptions import AirflowFailException

    from seedance_tasks.compaction import airflow_tasks

    lake, outside, group, _ = planned
    monkeypatch.setattr(airflow_tasks, "airflow_lease_holder", lambda: HOLDER)
    group = dict(group)
    edit(group["plan_uri"], group)
    with pytest.raises(AirflowFailException, match=r"^error: (plan|compact task input)") as failed:
        airflow_tasks.compact_group_task(group)
    assert "hint:" in str(failed.value)
    assert sorted(os.listdir(lake / "p=1")) == ["a.parquet", "b.parquet"]
