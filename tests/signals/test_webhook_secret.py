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
    with pytest.raises(ConfigError, match=r"'compaction.target_file_size'.*'huge'"):
        load_section("compaction")


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/services/T000/B000/s3cr3t-token x",
                                 "http://127.0.0.1:port/services/T000/B000/s3cr3t-token"])
def test_a_malformed_webhook_url_is_refused_without_echoing_it(monkeypatch, url):
    """A space or a bad port in the URL kept in the environment: http.client's InvalidURL quotes the
    URL's path (the secret part of a Slack webhook); the error names the reference only."""
    from seedance_tasks.errors import UnavailableError
    from seedance_tasks.notifiers import send_webhook

    monkeypatch.setenv("SEEDANCE__SIGNALS__WEBHOOK_ENV", "FINDINGS_HOOK")
    monkeypatch.setenv("FINDINGS_HOOK", url)
    with pytest.raises(UnavailableError) as info:
        send_webhook(load_section("signals").webhook, "subject", "text")
    assert "$FINDINGS_HOOK" in info.value.message
    assert "s3cr3t-token" not in str(info.value)
