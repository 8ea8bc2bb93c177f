"""Which settings may change live, how a value set live is checked, and how the listing shows it."""

from __future__ import annotations

import dataclasses

import pytest

from vcrawl.errors import InvalidTask
from vcrawl.live_settings import LIVE_SETTINGS, apply_overrides, describe, live_value, not_live_reason
from vcrawl.settings import Settings


def test_every_live_setting_is_a_setting_and_every_other_has_a_reason() -> None:
    names = {spec.name for spec in dataclasses.fields(Settings)} - {"given", "api_auth"}
    assert set(LIVE_SETTINGS) <= names
    assert all(not_live_reason(name) for name in names - set(LIVE_SETTINGS))


def test_a_value_is_checked_with_the_other_settings() -> None:
    base = Settings(proxy_cooloff_s=60.0)
    assert live_value("VCRAWL_READ_TIMEOUT_S", "3", base) == ("read_timeout_s", 3.0)
    with pytest.raises(InvalidTask) as refused:
        live_value("alert_email_to", "ops@example.org", base)  # needs VCRAWL_SMTP_HOST, as at start
    assert "VCRAWL_SMTP_HOST" in refused.value.problem


def test_values_this_process_cannot_take_are_left_out_not_fatal() -> None:
    settings, skipped = apply_overrides(Settings(), {"read_timeout_s": "2", "interval_jitter": "99", "data": "/x"})
    assert settings.read_timeout_s == 2.0 and settings.interval_jitter == Settings().interval_jitter
    assert set(skipped) == {"interval_jitter", "data"}
    assert settings.is_given("read_timeout_s")


def test_the_listing_hides_secrets_and_a_webhooks_token() -> None:
    base = Settings(smtp_password="hunter2", proxies=("http://user:pw@127.0.0.1:3128",))
    rows = {r["name"]: r for r in describe(base, {"alert_webhook_url": "https://hooks.example/services/T0/SECRET"})}
    assert rows["VCRAWL_SMTP_PASSWORD"]["value"] == "(set)"
    assert rows["VCRAWL_ALERT_WEBHOOK_URL"] == {"name": "VCRAWL_ALERT_WEBHOOK_URL", "value": "https://hooks.example/…",
                                                "source": "cluster", "live": True}  # fmt: skip
    assert rows["VCRAWL_PROXIES"]["value"] == ["http://user:***@127.0.0.1:3128"]
    assert "hunter2" not in repr(rows) and "SECRET" not in repr(rows) and ":pw@" not in repr(rows)
