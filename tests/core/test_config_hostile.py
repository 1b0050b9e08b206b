"""Hostile and mistyped settings: a config file or SEEDANCE__* override that YAML or pydantic would
read silently wrong (a key given twice, a comment cut off, an alias bomb) is refused naming where;
a typo'd key is named with the key it probably meant."""

from __future__ import annotations

import time

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from seedance_tasks import storage
from seedance_tasks.config import load_settings, load_yaml
from seedance_tasks.dag_support import run_settings
from seedance_tasks.errors import ConfigError, UsageError


def _config(tmp_path, text: str, encoding: str = "utf-8"):
    path = tmp_path / "seedance.yaml"
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return path


@pytest.mark.parametrize(("text", "unknown", "meant"), [
    ("compaction:\n  target_file_sise: 1GiB\n", "compaction.target_file_sise", "compaction.target_file_size"),
    ("compation: {}\n", "compation", "compaction"),
    ("Storage: {}\n", "Storage", "storage"),
    ("storage:\n  s3:\n    endpiont_url: http://x\n", "storage.s3.endpiont_url", "storage.s3.endpoint_url"),
    ("lifecycle:\n  retention:\n    keeplast: 3\n", "lifecycle.retention.keeplast", "lifecycle.retention.keep_last"),
])
def test_a_typo_names_the_key_and_the_key_it_probably_meant(tmp_path, text, unknown, meant):
    with pytest.raises(ConfigError) as info:
        load_settings(_config(tmp_path, text), environ={})
    assert f"unknown key '{unknown}' (did you mean '{meant}'?)" in info.value.message


def test_a_typo_in_an_environment_override_is_named_with_a_suggestion():
    with pytest.raises(ConfigError) as info:
        load_settings(environ={"SEEDANCE__COMPACTION__MIN_AEG": "1h"})
    assert ("unknown key 'compaction.min_aeg' (from SEEDANCE__COMPACTION__MIN_AEG) "
            "(did you mean 'compaction.min_age'?)") in info.value.message


def test_an_unknown_key_like_no_other_gets_no_guess(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_settings(_config(tmp_path, "compaction:\n  zzzz: 1\n"), environ={})
    assert "unknown key 'compaction.zzzz'" in info.value.message and "did you mean" not in info.value.message


@pytest.mark.parametrize(("text", "key", "line"), [
    ("compaction:\n  min_age: 1h\n  min_age: 2h\n", "min_age", 3),
    ("compaction:\n  min_age: 1h\nstorage: {}\ncompaction:\n  workers: 2\n", "compaction", 4),
])
def test_a_key_given_twice_is_refused_not_silently_last_wins(tmp_path, text, key, line):
    with pytest.raises(ConfigError) as info:
        load_settings(_config(tmp_path, text), environ={})
    assert f"line {line}" in info.value.message and f"key '{key}' is given twice" in info.value.message
    assert info.value.hint


def test_a_merge_key_is_not_a_duplicate():
    data = load_yaml("base: &b {keep_last: 3, keep_every: 10}\nrun: {<<: *b, keep_last: 5}\n")
    assert data["run"] == {"keep_last": 5, "keep_every": 10}


@pytest.mark.parametrize("text", [
    "signals:\n  lakes: &a [*a]\n",
    "cost:\n  notifier_kwargs:\n    a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"    {name}: &{name} [{', '.join([f'*{prev}'] * 10)}]\n" for prev, name in zip("abcdefgh", "bcdefghi", strict=True)),
    "signals:\n  lakes: " + "[" * 5000 + "]" * 5000 + "\n",
])
def test_alias_bombs_recursion_and_deep_nesting_are_refused_quickly(tmp_path, text):
    started = time.monotonic()
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_settings(_config(tmp_path, text), environ={})
    assert time.monotonic() - started < 10 and info.value.hint


def test_python_tags_never_construct_objects(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(_config(tmp_path, "compaction:\n  min_age: !!python/object/apply:os.system ['true']\n"),
                      environ={})
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/name:os.system")


def test_a_config_file_that_is_not_utf8_names_the_file(tmp_path):
    path = _config(tmp_path, "compaction:\n  default_uri: /data/caf\xe9\n", encoding="latin-1")
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert str(path) in info.value.message and "UTF-8" in info.value.message and info.value.hint


def test_a_config_file_that_is_not_a_mapping_says_what_it_holds(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_settings(_config(tmp_path, "- compaction\n- storage\n"), environ={})
    assert "mapping of sections, not a list" in info.value.message and info.value.hint


def test_an_override_cut_by_a_yaml_comment_is_refused():
    with pytest.raises(ConfigError) as info:
        load_settings(environ={"SEEDANCE__COMPACTION__DEFAULT_URI": "/data/run #2"})
    assert "SEEDANCE__COMPACTION__DEFAULT_URI" in info.value.message and "'/data/run'" in info.value.message
    assert info.value.hint
    settings = load_settings(environ={"SEEDANCE__COMPACTION__DEFAULT_URI": "'/data/run #2'",
                                      "SEEDANCE__CHECKPOINT__STORE": "s3://b/p#1"})
    assert settings.compaction.default_uri == "/data/run #2" and settings.checkpoint.store == "s3://b/p#1"


def test_a_huge_form_value_is_not_echoed_whole():
    with pytest.raises(ConfigError) as info:
        run_settings("compaction", {"min_age": "x" * 100_000}, {"min_age": "min_age"})
    assert len(info.value.message) < 400 and "param min_age" in info.value.message


def test_a_message_does_not_repeat_the_value_or_pydantic_prefixes(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_settings(_config(tmp_path, "compaction:\n  min_age: -5m\n"), environ={})
    assert "'compaction.min_age': not a duration: '-5m'" in info.value.message
    assert "Value error" not in info.value.message and info.value.message.count("-5m") == 1


@pytest.mark.parametrize("uri", ["", "   "])
def test_an_empty_uri_is_refused_never_the_current_directory(uri):
    with pytest.raises(UsageError, match="empty path or URI"):
        storage.resolve(uri)


@pytest.mark.parametrize("uri", ["file://", "file://localhost"])
def test_a_file_uri_without_a_path_is_refused_never_the_current_directory(uri, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="no path in"):
        storage.resolve(uri)


@pytest.mark.parametrize("section", [None, "compaction"])
def test_a_bad_override_names_its_variable_and_a_bad_file_value_does_not(tmp_path, section):
    from seedance_tasks.config import load_section

    load = (lambda path, environ: load_section(section, path, environ)) if section else load_settings
    variable = "SEEDANCE__COMPACTION__DEFAULT_URI"
    with pytest.raises(ConfigError) as info:
        load(None, {variable: "0123"})  # YAML reads 0123 as the octal 83
    assert f"'compaction.default_uri' (from {variable}):" in info.value.message
    assert f"unset {variable}" in info.value.hint and "quote" in info.value.hint
    with pytest.raises(ConfigError) as info:
        load(_config(tmp_path, "compaction:\n  default_uri: 0123\n"), {})
    assert "(from " not in info.value.message and "SEEDANCE__" not in info.value.hint


def test_an_override_that_conflicts_with_a_whole_section_names_both():
    with pytest.raises(ConfigError) as info:
        load_settings(environ={"SEEDANCE__STORAGE": "x", "SEEDANCE__STORAGE__S3__REGION": "eu"})
    assert "SEEDANCE__STORAGE__S3__REGION" in info.value.message and "SEEDANCE__STORAGE," in info.value.message
    assert info.value.hint


@pytest.mark.parametrize(("where", "said"), [("/dev/zero", "larger than"), ("dir", "cannot read config file")])
def test_a_config_path_that_is_endless_or_a_folder_is_a_config_error(tmp_path, where, said):
    path = tmp_path if where == "dir" else where
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert said in info.value.message and str(path) in info.value.message and info.value.hint


def test_a_value_refused_by_every_member_of_a_union_is_one_message_at_its_key(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_settings(_config(tmp_path, "training:\n  checkpoint_every: -1\n"), environ={})
    message = info.value.message
    assert "'training.checkpoint_every': " in message and "or input should be 'auto'" in message, message
    assert "literal[" not in message and "constrained-" not in message and message.count("(got -1)") == 1


def test_options_over_a_section_keep_its_other_sizes_and_durations_exactly():
    """`section_with` (CLI options, DAG params) and the JSON a DAG passes between tasks re-read every
    value: 512MB, an odd byte count or 1234567s must come back as they were, not rounded."""
    from seedance_tasks.compaction.settings import CompactionSettings
    from seedance_tasks.config import load_section, section_with

    current = load_section("compaction", environ={"SEEDANCE__COMPACTION__TARGET_FILE_SIZE": "512MB",
                                                  "SEEDANCE__COMPACTION__ROW_GROUP_SIZE": "100000001",
                                                  "SEEDANCE__COMPACTION__MIN_AGE": "1234567"})
    changed = section_with(current, {"workers": 2})
    assert (changed.target_file_size, changed.row_group_size, changed.min_age) == (512_000_000, 100_000_001, 1234567)
    assert CompactionSettings.model_validate(current.model_dump(mode="json")) == current


def test_every_section_survives_its_own_json():
    from seedance_tasks.config import SECTIONS, load_section

    for name in SECTIONS:
        section = load_section(name, environ={})
        assert type(section).model_validate(section.model_dump(mode="json")) == section, name


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**60), st.one_of(st.integers(0, 2**50).map(float),
                                         st.floats(0, 2**50, allow_nan=False, allow_infinity=False)))
def test_sizes_and_durations_read_back_what_they_serialize_to(size, seconds):
    from seedance_tasks.units import exact_size, format_duration, parse_duration, parse_size

    assert parse_size(exact_size(size)) == size
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(("value", "said"), [("2026-02-30", "not a date: '2026-02-30'"),
                                             ("2026-13-01", "not a date: '2026-13-01'"),
                                             ("2026-01-01 25:00:00", "not a date: '2026-01-01 25:00:00'"),
                                             ("9" * 5000, "not an integer: '9999")])
def test_a_value_yaml_cannot_build_is_a_yaml_error_with_its_line(tmp_path, value, said):
    """YAML reads these by their shape and then fails (ValueError): no date 2026-02-30, no int of 5000 digits."""
    path = _config(tmp_path, f"cost:\n  actions:\n    holidays:\n      - 2026-01-01\n      - {value}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert "line 5" in info.value.message and said in info.value.message and len(info.value.message) < 400


@pytest.mark.parametrize("kind", ["int", "negative int", "text"])
def test_a_number_of_thousands_of_digits_is_refused_as_too_large(kind):
    from seedance_tasks.units import parse_duration, parse_size

    value = {"int": 10**5000, "negative int": -(10**5000), "text": "9" * 5000 + "m"}[kind]  # no repr: 4300+ digits
    for parse in (parse_size, parse_duration):
        with pytest.raises(UsageError, match="too large|negative") as info:
            parse(value)
        assert len(info.value.message) < 120


def _number_keys(model, path: list[str]):
    """The dotted keys of every int or float setting (sizes and durations included) under `model`."""
    import inspect

    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        annotation = field.annotation
        if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
            yield from _number_keys(annotation, [*path, name])
        elif annotation in (int, float, int | None, float | None):
            yield ".".join([*path, name])


def _every_number_key() -> list[str]:
    from seedance_tasks.config import SECTIONS, section_model

    return [key for name in SECTIONS for key in _number_keys(section_model(name), [name])]


@pytest.mark.parametrize("word", ["yes", "true", "on", "no"])
def test_a_yaml_boolean_is_refused_by_every_number_setting_naming_the_key(tmp_path, word):
    """pydantic reads True as 1 (`workers: yes` would run one worker): every int, float, size and
    duration of every section refuses a boolean, from the file and from an override."""
    keys = _every_number_key()
    assert len(keys) > 40 and "compaction.workers" in keys and "storage.s3.max_attempts" in keys
    for key in keys:
        *parents, last = key.split(".")
        text = "".join(f"{'  ' * depth}{part}:\n" for depth, part in enumerate(parents))
        with pytest.raises(ConfigError) as info:
            load_settings(_config(tmp_path, text + f"{'  ' * len(parents)}{last}: {word}\n"), environ={})
        assert f"'{key}': must be a number, not a boolean" in info.value.message, (key, info.value.message)
    variable = "SEEDANCE__COMPACTION__WORKERS"
    with pytest.raises(ConfigError) as info:
        load_settings(environ={variable: word})
    assert f"'compaction.workers' (from {variable}): must be a number, not a boolean" in info.value.message


def test_a_boolean_inside_a_list_or_mapping_of_numbers_is_refused_and_booleans_stay_booleans():
    from pydantic import ValidationError

    from seedance_tasks.settings_base import StrictModel

    class Section(StrictModel):
        sizes: list[int] = []
        weights: dict[str, float | None] = {}
        flag: bool = False
        either: int | bool = 0

    for values in ({"sizes": [1, True]}, {"weights": {"a": 1.5, "b": False}}):
        with pytest.raises(ValidationError, match="must be a number, not a boolean"):
            Section.model_validate(values)
    section = Section.model_validate({"sizes": [1, 2], "weights": {"a": None}, "flag": True, "either": True})
    assert section.flag is True and section.either is True and section.sizes == [1, 2]
    with pytest.raises(ValidationError, match="must be a number, not a boolean"):
        section.sizes = [False]  # validated on assignment too


@pytest.mark.parametrize(("text", "said"), [
    ("shards:\n  shard_size: 0\n", "'shards.shard_size': must be at least 4KiB"),
    ("shards:\n  shard_size: 4095\n", "'shards.shard_size': must be at least 4KiB"),
    ("shards:\n  max_member_size: 0\n", "'shards.max_member_size': must be a positive size"),
])
def test_a_shard_size_the_build_cannot_use_is_refused_in_the_config(tmp_path, text, said):
    with pytest.raises(ConfigError) as info:
        load_settings(_config(tmp_path, text), environ={})
    assert said in info.value.message and info.value.hint


def test_the_shard_size_option_and_the_config_share_one_bound():
    from seedance_tasks.config import section_with
    from seedance_tasks.shards.settings import MIN_SHARD_SIZE, ShardSettings

    assert section_with(ShardSettings(), {"shard_size": "4KiB"}).shard_size == MIN_SHARD_SIZE
    with pytest.raises(ConfigError) as info:
        section_with(ShardSettings(), {"shard_size": "0"})
    assert "'shard_size': must be at least 4KiB" in info.value.message


@pytest.mark.parametrize(("codec", "level", "ok"), [
    ("zstd", -99, True), ("zstd", 22, True), ("zstd", 23, False), ("zstd", 999, False), ("zstd", -(10**6), False),
    ("gzip", 9, True), ("gzip", 10, False), ("gzip", -99, False), ("lz4", 12, True), ("lz4", 13, False),
    ("snappy", 1, False), ("none", 1, False), ("snappy", None, True), ("none", None, True),
])
def test_a_compression_level_is_bounded_by_what_its_codec_takes(tmp_path, codec, level, ok):
    """Parquet's writer fails late (gzip 10, snappy with any level) or clamps silently (zstd 999):
    a level outside pyarrow's range for the codec is refused when the settings are read."""
    import pyarrow as pa

    from seedance_tasks.compaction.settings import codec_level_problem

    text = f"compaction:\n  compression: {codec}\n  compression_level: {'null' if level is None else level}\n"
    if ok:
        assert load_settings(_config(tmp_path, text), environ={}).compaction.compression_level == level
        return
    with pytest.raises(ConfigError) as info:
        load_settings(_config(tmp_path, text), environ={})
    assert f"compression_level {level}: compression '{codec}' takes" in info.value.message, info.value.message
    if codec != "none" and pa.Codec.supports_compression_level(codec):
        low, high = pa.Codec.minimum_compression_level(codec), pa.Codec.maximum_compression_level(codec)
        assert f"from {low} to {high}" in info.value.message and codec_level_problem(codec, low) is None


@pytest.mark.parametrize(("key", "value"), [
    ("workers", "9" * 4000), ("workers", "1025"), ("workers", "-1"),
    ("s3_get_price_per_1000", "NaN"), ("s3_get_price_per_1000", ".nan"), ("s3_get_price_per_1000", ".inf"),
    ("s3_get_price_per_1000", "'-0.01'"), ("s3_get_price_per_1000", "abc"), ("s3_get_price_per_1000", "1e30"),
    ("s3_requests_per_file_per_month", "9" * 100),
])
def test_compaction_counts_and_prices_are_bounded_and_finite(tmp_path, key, value):
    with pytest.raises(ConfigError) as info:
        load_settings(_config(tmp_path, f"compaction:\n  {key}: {value}\n"), environ={})
    assert f"'compaction.{key}'" in info.value.message and len(info.value.message) < 400, info.value.message


def test_the_get_price_is_exact_from_text_or_a_yaml_number(tmp_path):
    from decimal import Decimal

    for text in ("0.0004", "'0.0004'", "0"):
        price = load_settings(_config(tmp_path, f"compaction:\n  s3_get_price_per_1000: {text}\n"),
                              environ={}).compaction.s3_get_price_per_1000
        assert price == Decimal(text.strip("'")) and str(price) == text.strip("'")


def test_a_lease_ttl_past_what_lease_records_accept_is_refused_at_load_naming_the_key():
    from seedance_tasks.lease import MAX_TTL_S

    with pytest.raises(ConfigError) as info:
        load_settings(None, environ={"SEEDANCE__STORAGE__LEASE_TTL": "30d"})
    assert "storage.lease_ttl" in info.value.message
    assert load_settings(None, environ={"SEEDANCE__STORAGE__LEASE_TTL": "7d"}).storage.lease_ttl == MAX_TTL_S


def test_a_target_file_size_s3_cannot_publish_is_refused_at_load_naming_the_key():
    with pytest.raises(ConfigError) as info:
        load_settings(None, environ={"SEEDANCE__COMPACTION__TARGET_FILE_SIZE": "6GiB"})
    assert "compaction.target_file_size" in info.value.message and "5GiB" in info.value.message
    assert load_settings(None, environ={"SEEDANCE__COMPACTION__TARGET_FILE_SIZE": "5GiB"}).compaction.target_file_size \
        == 5 * 1024**3
