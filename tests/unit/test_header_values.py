"""Values sent as HTTP header values are refused when given with CR, LF or another control character."""

from __future__ import annotations

import doctest
import json
from typing import Any

import pytest

import vcrawl.header_values
from vcrawl.errors import ConfigError, InvalidTask
from vcrawl.jobs import JobSpec
from vcrawl.settings import Settings

SEEDS = ["http://x.test/"]
PROBLEM = "must not hold CR, LF or other control characters (it is sent as an HTTP header)"


def test_header_value_doctests_pass() -> None:
    results = doctest.testmod(vcrawl.header_values)
    assert results.attempted > 0 and results.failed == 0


@pytest.mark.parametrize(
    ("pool", "values", "field"),
    [
        ("user_agents", ["vcrawl/1", "vcrawl/2\r\nX-Injected: 1"], "user_agents[1]"),
        ("user_agents", ["a\nb"], "user_agents[0]"),
        ("user_agents", ["a\x00b"], "user_agents[0]"),
        ("user_agents", ["tab\tinside"], "user_agents[0]"),
        ("user_agents", ["del\x7f"], "user_agents[0]"),
        ("referers", ["https://ok.test/", "https://r.test/\rX: 1"], "referers[1]"),
        ("proxies", ["http://u:p@127.0.0.1:3128/\r\nX: 1"], "proxies[0]"),
        ("user_agents", ["bot \u2713"], "user_agents[0]"),  # not Latin-1: requests could not send it
        ("referers", ["https://\u4f8b\u3048.test/"], "referers[0]"),
    ],
)
def test_a_job_refuses_control_characters_in_its_header_pools(pool: str, values: list[str], field: str) -> None:
    with pytest.raises(InvalidTask) as refused:
        JobSpec.from_dict({"seeds": SEEDS, pool: values})
    assert refused.value.field == field
    assert refused.value.problem.startswith(PROBLEM if values[-1].isascii() else "must be Latin-1 text")
    assert "p@127" not in str(refused.value)  # the value is not repeated: a proxy URL may hold a password


def test_a_job_keeps_header_values_without_control_characters() -> None:
    spec = JobSpec.from_dict({"seeds": SEEDS, "user_agents": ["Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101"],
                              "referers": ["https://www.example.test/?q=a%0D%0A"]})  # fmt: skip
    assert spec.user_agents == ("Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101",)
    assert spec.referers == ("https://www.example.test/?q=a%0D%0A",)  # percent-encoded: no control character


def test_a_line_end_at_either_end_of_a_value_is_refused_too() -> None:
    # Checked as given, before spaces around a value are trimmed: a CR/LF anywhere is a mistake to show.
    for value in ("Mozilla/5.0 (X11)\r\n", "\nMozilla/5.0 (X11)"):
        with pytest.raises(InvalidTask, match=r"^user_agents\[0\]: must not hold CR, LF"):
            JobSpec.from_dict({"seeds": SEEDS, "user_agents": [value]})
    assert JobSpec.from_dict({"seeds": SEEDS, "user_agents": ["  spaced/1 "]}).user_agents == ("spaced/1",)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"user_agents": ("ok/1", "bad/2\r\nX-Injected: 1")}, "VCRAWL_USER_AGENTS[1]"),
        ({"referers": ("https://r.test/\n",)}, "VCRAWL_REFERERS[0]"),
        ({"proxies": ("http://u:s3cret@127.0.0.1:3128/\x01",)}, "VCRAWL_PROXIES[0]"),
        ({"api_auth": {"ACME": "Bearer abc\r\nX-Injected: 1"}}, "VCRAWL_API_AUTH_ACME"),
    ],
)
def test_settings_refuse_control_characters_in_header_values(settings: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings(**settings)
    assert str(refused.value).startswith(f"{named} {PROBLEM}")
    assert "s3cret" not in str(refused.value) and "abc" not in str(refused.value)


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"VCRAWL_USER_AGENTS": json.dumps(["ok/1", "bad/2\r\nX-Injected: 1"])}, "VCRAWL_USER_AGENTS[1]"),
        ({"VCRAWL_USER_AGENTS": "ok/1\nbad\x01/2"}, "VCRAWL_USER_AGENTS[1]"),
        ({"VCRAWL_REFERERS": json.dumps(["https://r.test/\rX: 1"])}, "VCRAWL_REFERERS[0]"),
        ({"VCRAWL_REFERERS": json.dumps(["https://r.test/\n"])}, "VCRAWL_REFERERS[0]"),
        ({"VCRAWL_PROXIES": json.dumps(["http://u:s3cret@127.0.0.1:3128/\r\nX: 1"])}, "VCRAWL_PROXIES[0]"),
        ({"VCRAWL_API_AUTH_ACME": "X-Api-Key: k\n1"}, "VCRAWL_API_AUTH_ACME"),
    ],
)
def test_header_variables_with_control_characters_fail_at_start_up(environ: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env(environ)
    assert str(refused.value).startswith(f"{named} {PROBLEM}")


def test_line_ends_between_items_and_after_a_secret_are_not_part_of_a_value() -> None:
    # One item per line: the line ends separate them. A secret read from a file often ends in a
    # newline; the header is sent without it (engine.api_pages.auth_header trims it).
    settings = Settings.from_env({"VCRAWL_USER_AGENTS": "a/1\r\nb/2\n", "VCRAWL_API_AUTH_ACME": "Bearer t\n"})
    assert settings.user_agents == ("a/1", "b/2") and settings.api_auth == {"ACME": "Bearer t\n"}
    assert Settings.from_env(settings.to_env()) == settings
