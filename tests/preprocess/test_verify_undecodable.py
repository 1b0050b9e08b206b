"""Images that do not decode, with check_decode on: `shards verify` and the DAG's verify task
fail saying what is wrong and what to do (fix or drop the samples, or leave them to preprocessing
with check_decode off), list every problem, and the DAG task fails at once: re-reading the same
bytes cannot fix them, so Airflow's retries would only delay the failure."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from seedance_tasks.cli import app
from seedance_tasks.errors import IntegrityError
from seedance_tasks.shards.build import build
from seedance_tasks.shards.sample import make_sample_files
from seedance_tasks.shards.settings import ShardSettings
from seedance_tasks.shards.verify import raise_for_problems, verify


@pytest.fixture
def undecodable(tmp_path):
    keys = make_sample_files(tmp_path / "src", 6, corrupt=(1, 4))
    build(str(tmp_path / "src"), str(tmp_path / "shards"), settings=ShardSettings(max_samples=3, check_decode=False))
    return tmp_path / "shards", [keys[1], keys[4]]


def test_the_dag_verify_task_fails_at_once_listing_each_image(undecodable, monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from seedance_tasks.preprocess import airflow_tasks

    shards, bad = undecodable
    lines: list[str] = []
    monkeypatch.setattr(airflow_tasks, "log", SimpleNamespace(error=lambda text, *args: lines.append(text % args)))
    with pytest.raises(AirflowFailException) as failed:
        airflow_tasks.verify_task({"shards": str(shards)}, {"check_decode": True})
    text = str(failed.value)
    assert "2 problem(s)" in text and "2 undecodable" in text and f"{bad[0]}.jpg" in text
    assert "check_decode" in text and "failed sample" in text  # what to do, both ways
    assert [line.startswith("error:") and f"{key}.jpg" in line for key, line in zip(bad, lines, strict=True)] == [True] * 2
    # told not to decode, the same shards pass: preprocessing reports those samples as failed
    assert airflow_tasks.verify_task({"shards": str(shards)}, {"check_decode": False})["ok"]


def test_the_cli_says_what_to_do_about_undecodable_images(undecodable):
    shards, bad = undecodable
    result = CliRunner().invoke(app, ["shards", "verify", str(shards)], env={"COLUMNS": "400"})
    assert result.exit_code == 4 and "Traceback" not in result.output
    assert "hint:" in result.output and "--no-check-decode" in result.output


def test_a_checksum_unlike_the_index_stays_retryable(undecodable):
    """A shard being replaced reads differently a moment later: that one is still retried."""
    shards, _bad = undecodable
    report = verify(str(shards), check_decode=False)
    report = {**report, "ok": False, "problems": [
        {"shard": str(shards / "shard-000000.tar"), "key": None, "kind": "checksum", "problem": "sha256 differs"}]}
    with pytest.raises(IntegrityError) as raised:
        raise_for_problems(report)
    assert raised.value.retryable and raised.value.exit_code == 4
