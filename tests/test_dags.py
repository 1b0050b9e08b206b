"""Every DAG file: imports cleanly, is well-formed, and stays cheap to parse."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parent.parent / "dags"
DAG_FILES = sorted(p for p in DAGS.glob("*.py") if not p.name.startswith("_"))
HEAVY = ["torch", "pyarrow", "duckdb", "polars", "pandas", "boto3", "numpy", "webdataset"]


def test_there_are_dags():
    assert DAG_FILES


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert {Path(d.fileloc).name for d in dagbag.dags.values()} == {p.name for p in DAG_FILES}


def test_dag_ids_follow_the_convention(dagbag):
    for dag_id in dagbag.dags:
        assert dag_id.startswith("seedance_"), dag_id


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda p: p.stem)
def test_dag_is_well_formed(dagbag, dag_file):
    dags = [d for d in dagbag.dags.values() if Path(d.fileloc) == dag_file]
    assert dags, f"{dag_file.name} defines no DAG"
    for dag in dags:
        assert "seedance" in dag.tags and len(dag.tags) >= 2, dag.tags
        assert dag.doc_md, f"{dag.dag_id} has no doc_md"
        for task in dag.tasks:
            assert task.owner == "seedance", (dag.dag_id, task.task_id, task.owner)
            assert task.retries >= 1, (dag.dag_id, task.task_id)
        _assert_acyclic(dag)
        for name, param in dag.params.items():
            assert param.description or param.schema.get("description_md"), f"{dag.dag_id}: param {name} undocumented"


def _form_problems(dag) -> list[str]:
    """What would leave a field of the trigger form invalid with its default (the form validates
    each field with its Param's JSON schema, and shows `""` in a string field as a missing value,
    which disables the Trigger button), or leave its help silent on what empty means."""
    import jsonschema

    problems = []
    for name, param in dag.params.items():
        schema, value = param.schema, param.value
        try:
            jsonschema.validate(value, schema)
        except jsonschema.ValidationError as exc:
            problems.append(f"{dag.dag_id}: param {name}: default {value!r} is invalid: {exc.message}")
        if value == "":
            problems.append(f"{dag.dag_id}: param {name}: default '' blocks the form; use None with type null")
        types = schema.get("type")
        nullable = "null" in types if isinstance(types, list) else types == "null"
        text = (schema.get("description_md") or param.description or "").lower()
        if nullable and "empty" not in text:
            problems.append(f"{dag.dag_id}: param {name}: its help does not say what empty means")
    return problems


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda p: p.stem)
def test_every_param_default_leaves_the_form_valid(dagbag, dag_file):
    dags = [d for d in dagbag.dags.values() if Path(d.fileloc) == dag_file]
    assert dags
    assert [problem for dag in dags for problem in _form_problems(dag)] == []


def test_the_form_check_catches_a_blocking_default():
    """The check above fails on the defaults that blocked the forms (not only on ours)."""
    from airflow.sdk import DAG, Param

    dag = DAG("seedance_form_probe", schedule=None, params={
        "empty_string": Param("", type="string", description="Empty: config."),
        "bad_size": Param("big", type="string", pattern=r"^\d+$", description="A size."),
        "nullable_silent": Param(None, type=["null", "string"], description="A path."),
        "null_not_allowed": Param(None, type="integer", description="A count."),
    })
    problems = "\n".join(_form_problems(dag))
    for name in ("empty_string", "bad_size", "nullable_silent", "null_not_allowed"):
        assert f"param {name}:" in problems, problems


def _assert_acyclic(dag):
    state = {}

    def visit(task_id):
        if state.get(task_id) == "open":
            raise AssertionError(f"cycle through {task_id} in {dag.dag_id}")
        if state.get(task_id) == "done":
            return
        state[task_id] = "open"
        for downstream in dag.task_dict[task_id].downstream_task_ids:
            visit(downstream)
        state[task_id] = "done"

    for task_id in dag.task_dict:
        visit(task_id)


PROBE = """
import json, runpy, sys
from airflow.providers_manager import ProvidersManager
ProvidersManager().initialize_providers_asset_uri_resources()  # the DAG processor has these loaded
before = set(sys.modules)
runpy.run_path(sys.argv[1])
heavy = sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules and m not in before)
print(json.dumps(heavy))
"""


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda p: p.stem)
def test_parsing_imports_nothing_heavy(dag_file):
    """Airflow re-parses DAG files all the time: their top level must not import heavy libraries."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(dag_file), json.dumps(HEAVY)],
        capture_output=True, text=True, check=True, timeout=120,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
