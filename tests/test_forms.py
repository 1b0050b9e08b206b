"""Trigger forms: the size/duration patterns of `dag_support` accept exactly what `units` parses.

The UI validates a field with its Param's JSON schema (jsonschema's `pattern`, a regex search),
the task parses the value with `units.parse_size` / `parse_duration`: a value the form accepts
must parse, and a value that parses must not be refused by the form. Empty ("") is accepted by
the form and means "from config".
"""

from __future__ import annotations

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedance_tasks import dag_support, units
from seedance_tasks.errors import UsageError

SIZE_SCHEMA = {"type": ["null", "string"], "pattern": dag_support.SIZE_PATTERN}
DURATION_SCHEMA = {"type": ["null", "string"], "pattern": dag_support.DURATION_PATTERN}


def _form_accepts(schema: dict, value) -> bool:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


def _parses(parse, value: str) -> bool:
    """Whether `parse` takes `value`'s shape; a magnitude past the cap (which a pattern cannot express)
    is still the right shape, and the run refuses it with its own error."""
    try:
        parse(value)
    except UsageError as error:
        return "too large" in error.message
    return True


CASES = [
    "512M", "512mib", "512MiB", "512 MiB", " 512MiB ", "1.5GiB", "1048576", "0", "64mb", "64MB", "8kb", "1T",
    "2tib", "10b", "7B", "1.", ".5M", "1,5M", "-1M", "512 M B", "512MiBs", "big", "1e6", "M", "12 ", "\t3k\n",
    "1h", "30m", "90s", "7d", "2w", "5min", "5MIN", "1.5h", "0s", "1y", "3 h", "h1", "1hh", "٥M", "٣h", "1\u00a0M",
    "1\n", "\n1", "1m\n\n", "0x10", "+1", "1_000",
]


@pytest.mark.parametrize("value", CASES)
def test_size_pattern_matches_the_parser(value):
    assert _form_accepts(SIZE_SCHEMA, value) == _parses(units.parse_size, value), value


@pytest.mark.parametrize("value", CASES)
def test_duration_pattern_matches_the_parser(value):
    assert _form_accepts(DURATION_SCHEMA, value) == _parses(units.parse_duration, value), value


def test_the_examples_of_the_issue_are_accepted_and_nonsense_refused():
    for value in ("512M", "512mib", "512MiB", "256 MB", "1GiB"):
        assert _form_accepts(SIZE_SCHEMA, value), value
    for value in ("0", "30m", "1h", "7d", "90s"):
        assert _form_accepts(DURATION_SCHEMA, value), value
    for value in ("big", "1y", "-1h", "1e3"):
        assert not _form_accepts(SIZE_SCHEMA, value) and not _form_accepts(DURATION_SCHEMA, value), value


def test_empty_and_none_mean_from_config():
    for schema in (SIZE_SCHEMA, DURATION_SCHEMA):
        assert _form_accepts(schema, None) and _form_accepts(schema, "")
        assert not _form_accepts(schema, "   ") and not _form_accepts(schema, "\n")  # blank is not empty


_ALPHABET = st.sampled_from(list("0123456789.  \t\nbBkKmMgGtTiIsShHdDwWnNxe-+,_") + ["٥", "\u00a0", "\u2003"])
_TEXT = st.text(_ALPHABET, max_size=12)
_UNIT = st.sampled_from(sorted({*units._SIZE_UNITS, *units._DURATION_UNITS, "min", "sec", "ib", "y"}))
_GRAMMATICAL = st.builds(
    lambda pre, number, frac, mid, unit, upper, post: f"{pre}{number}{frac}{mid}{unit.upper() if upper else unit}{post}",
    st.sampled_from(["", " ", "\t"]), st.integers(0, 10**9).map(str), st.sampled_from(["", ".5", ".25", "."]),
    st.sampled_from(["", " "]), _UNIT, st.booleans(), st.sampled_from(["", " ", "\n", "x"]),
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_TEXT, _GRAMMATICAL))
def test_patterns_and_parsers_agree_on_generated_strings(value):
    """Both ways: what the form accepts parses, and what parses the form accepts (or it is "")."""
    for schema, parse in ((SIZE_SCHEMA, units.parse_size), (DURATION_SCHEMA, units.parse_duration)):
        assert _form_accepts(schema, value) == (value == "" or _parses(parse, value)), (value, schema["pattern"])


def test_size_and_duration_params_use_the_patterns_and_say_what_empty_means():
    size = dag_support.size_param("Target", "Size of the files.", empty=dag_support.from_config("compaction.x"))
    duration = dag_support.duration_param("Age", "Leave younger files.", empty="never")
    assert size.value is None and duration.value is None
    assert size.schema["pattern"] == dag_support.SIZE_PATTERN
    assert duration.schema["pattern"] == dag_support.DURATION_PATTERN
    assert size.schema["type"] == ["null", "string"]
    assert "Empty: `compaction.x` from config" in size.schema["description_md"]
    assert "Empty: never." in duration.schema["description_md"]
    choice = dag_support.optional_param("Codec", "How.", empty="config", enum=["a", "b"])
    assert choice.schema["enum"] == ["a", "b", None]
    jsonschema.validate(None, choice.schema)
