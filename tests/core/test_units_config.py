import pytest

from seedance_tasks.config import load_settings, settings_with
from seedance_tasks.errors import ConfigError, UsageError
from seedance_tasks.units import format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512MiB", 512 * 1024**2), ("8MB", 8_000_000), ("1.5GiB", int(1.5 * 1024**3)), ("1024", 1024), (0, 0)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "12XB", "-1MiB", "MiB", "1 2"])
def test_parse_size_rejects_garbage_with_a_hint(text):
    with pytest.raises(UsageError) as info:
        parse_size(text)
    assert "not a size" in info.value.message or "negative" in info.value.message


@pytest.mark.parametrize("value", ["9" * 400 + "MiB", 10**400, float("inf"), float("nan"), -1.5, "99999999999TiB"])
def test_absurd_numbers_are_usage_errors_not_crashes(value):
    for parse in (parse_size, parse_duration):
        with pytest.raises(UsageError) as info:
            parse(value)
        assert info.value.hint


@pytest.mark.parametrize(("text", "seconds"), [("0", 0), ("90s", 90), ("30m", 1800), ("1h", 3600), ("7d", 604800)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_parse_duration_rejects_unknown_unit():
    with pytest.raises(UsageError, match="not a duration"):
        parse_duration("3y")


def test_format_size_round_trips_roughly():
    assert format_size(512 * 1024**2) == "512 MiB"
    assert format_size(1536) == "1.5 KiB"


def test_repository_config_loads_with_defaults():
    settings = load_settings()
    assert settings.compaction.target_file_size == 512 * 1024**2
    assert settings.compaction.effective_small_file_size == 384 * 1024**2


def test_unknown_key_names_the_key(tmp_path):
    path = tmp_path / "seedance.yaml"
    path.write_text("compaction:\n  target_file_sise: 1GiB\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert "compaction.target_file_sise" in info.value.message


def test_unknown_section_is_an_error(tmp_path):
    path = tmp_path / "seedance.yaml"
    path.write_text("compction: {}\n")
    with pytest.raises(ConfigError, match="unknown key 'compction'"):
        load_settings(path, environ={})


def test_environment_overrides_file(tmp_path):
    path = tmp_path / "seedance.yaml"
    path.write_text("compaction:\n  target_file_size: 1GiB\n  min_age: 2h\n")
    settings = load_settings(path, environ={"SEEDANCE__COMPACTION__MIN_AGE": "0"})
    assert settings.compaction.target_file_size == 1024**3
    assert settings.compaction.min_age == 0


def test_environment_override_with_unknown_key_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="compaction.nope"):
        load_settings(environ={"SEEDANCE__COMPACTION__NOPE": "1"})


def test_malformed_value_names_key_and_value(tmp_path):
    path = tmp_path / "seedance.yaml"
    path.write_text("compaction:\n  min_age: soon\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert "compaction.min_age" in info.value.message and "soon" in info.value.message


def test_small_file_size_above_target_is_refused():
    with pytest.raises(ConfigError, match="small_file_size"):
        settings_with(load_settings(environ={}), "compaction", target_file_size="64MiB", small_file_size="1GiB")


def test_missing_explicit_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.yaml", environ={})


@pytest.mark.parametrize("raw", ["[1,", "{a: 1", "key: [unclosed", "'open quote", "@reserved"])
def test_malformed_yaml_in_an_env_override_names_the_variable(raw):
    with pytest.raises(ConfigError) as info:
        load_settings(environ={"SEEDANCE__COMPACTION__TARGET_FILE_SIZE": raw})
    assert "SEEDANCE__COMPACTION__TARGET_FILE_SIZE" in info.value.message
    assert "YAML" in info.value.message and info.value.hint


def test_s3_timeouts_and_attempts_have_defaults_and_overrides():
    s3 = load_settings(environ={}).storage.s3
    assert (s3.connect_timeout, s3.request_timeout, s3.max_attempts) == (5, 30, 4)
    s3 = load_settings(environ={"SEEDANCE__STORAGE__S3__REQUEST_TIMEOUT": "2m",
                                "SEEDANCE__STORAGE__S3__MAX_ATTEMPTS": "2"}).storage.s3
    assert (s3.request_timeout, s3.max_attempts) == (120, 2)
    with pytest.raises(ConfigError, match="max_attempts"):
        load_settings(environ={"SEEDANCE__STORAGE__S3__MAX_ATTEMPTS": "0"})
