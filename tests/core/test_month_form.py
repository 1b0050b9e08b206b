"""The month fields of the cost DAGs' trigger forms accept exactly the months their tasks take:
ASCII digits only (JSON-schema `\\d` would let ٢٠٢٤-٠٩ through, which `workdays.parse_month`
refuses), and in the actions form, empty for "the event's month"."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import jsonschema
import pytest

from seedance_tasks.cost.workdays import parse_month
from seedance_tasks.errors import UsageError

DAGS = Path(__file__).resolve().parents[2] / "dags"


@functools.cache
def _month_schema(dag_file: str) -> dict:
    spec = importlib.util.spec_from_file_location(f"_form_{dag_file}", DAGS / f"{dag_file}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, dag_file)().params.get_param("month").schema  # the @dag function builds the DAG


def _accepts(schema: dict, value) -> bool:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


def _parses(value: str) -> bool:
    try:
        parse_month(value)
    except UsageError:
        return False
    return True


MONTHS = ["2024-09", "2026-12", "٢٠٢٤-09", "２０２４-09", "२०२४-12", "٢٠٢٤-٠٩", "２０２４-０９", "२०२४-०९", "2024-٠٩",
          "2024-9", "2024-13", "2024-00", "2024-09\n", " 2024-09", "x2024-09", "2024-09-01", "24-09", "\n"]


@pytest.mark.parametrize("value", MONTHS)
def test_the_actions_form_accepts_a_month_exactly_when_the_task_takes_it(value):
    schema = _month_schema("seedance_cost_actions")
    assert _accepts(schema, value) == _parses(value), (value, schema["pattern"])
    assert _accepts(schema, None) and _accepts(schema, "")  # empty: the event's month


@pytest.mark.parametrize("value", MONTHS)
def test_the_recovery_form_accepts_a_month_exactly_when_the_task_takes_it(value):
    schema = _month_schema("seedance_cost_recovery")
    assert _accepts(schema, value) == _parses(value), (value, schema["pattern"])
    assert _accepts(schema, None)  # empty: the month before the run
