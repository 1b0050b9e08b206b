"""`seedance ckpt thaw` of a checkpoint that needs none, and of a store that is not there."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from seedance_tasks.cli import app

from .conftest import make_store


def _thaw(store, *extra):
    return CliRunner().invoke(app, ["ckpt", "thaw", "--store", str(store), "--run", "r", *extra])


def test_thaw_of_a_hot_checkpoint_requests_nothing_and_says_it_is_ready(tmp_path):
    store = tmp_path / "s"
    make_store(store, steps=[0, 10], keyframe_every=4)
    result = _thaw(store, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ready"] is True and report["requested"] == 0 and report["missing"] == 0
    assert {row["action"] for row in report["files"]} == {"none"}


def test_thaw_of_a_store_that_is_not_there_names_the_store_not_a_missing_run(tmp_path):
    """It said "no committed checkpoint of run 'r'", sending the user to look for the run."""
    result = _thaw(tmp_path / "nope")
    assert result.exit_code == 2
    assert "checkpoint store" in result.output and "does not exist" in result.output
    assert "no committed checkpoint" not in result.output
