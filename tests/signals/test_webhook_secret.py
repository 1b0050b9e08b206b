"""The findings' webhook URL is a secret: config names it by reference only, and a URL written into
config is refused without being echoed back."""

import pytest

from seedance_tasks.config import load_section
from seedance_tasks.errors import ConfigError


def test_a_webhook_url_in_config_is_refused_without_echoing_it(monkeypatch):
    monkeypatch.setenv("SEEDANCE__SIGNALS__WEBHOOK_URL", "https://hooks.example/T000/B000/s3cr3t-token")
    with pytest.raises(ConfigError) as info:
        load_section("signals")
    assert "webhook_url" in info.value.message and "webhook_env" in info.value.message
    assert "s3cr3t-token" not in str(info.value) and "s3cr3t-token" not in (info.value.hint or "")


def test_the_webhook_is_named_by_its_environment_variable(monkeypatch):
    monkeypatch.setenv("SEEDANCE__SIGNALS__WEBHOOK_ENV", "FINDINGS_HOOK")
    settings = load_section("signals")
    assert settings.webhook.has_webhook and settings.webhook.webhook_name == "$FINDINGS_HOOK"


def test_a_scalar_config_error_still_shows_what_was_given(monkeypatch):
    monkeypatch.setenv("SEEDANCE__COMPACTION__TARGET_FILE_SIZE", "huge")
    with pytest.raises(ConfigError, match=r"got 'huge'"):
        load_section("compaction")
