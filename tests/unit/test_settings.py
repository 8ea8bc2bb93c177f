"""Settings come from VCRAWL_* variables; bad values fail at start-up naming the variable."""

from __future__ import annotations

import pytest

from vcrawl.errors import ConfigError
from vcrawl.settings import DEFAULT_USER_AGENTS, Settings, celery_redis_url
from vcrawl.targets.redis import parse_cluster


def test_defaults_without_environment() -> None:
    settings = Settings.from_env({})
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.data == "./crawl-data"
    assert settings.user_agents == DEFAULT_USER_AGENTS and len(settings.user_agents) >= 5
    assert settings.fetch_retries == 2 and settings.analysis_retries == 3 and settings.batch_analysis_retries == 10


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("VCRAWL_MIN_INTERVAL_S", "0.25", ("min_interval_s", 0.25)),
        ("VCRAWL_MAX_BODY_BYTES", "1024", ("max_body_bytes", 1024)),
        ("VCRAWL_TASK_EVENTS", "off", ("task_events", False)),
        ("VCRAWL_USER_AGENTS", '["a/1", "b/2"]', ("user_agents", ("a/1", "b/2"))),
        (
            "VCRAWL_USER_AGENTS",
            "Mozilla/5.0 (X11; Linux, x86_64)\nbot/2\n",
            ("user_agents", ("Mozilla/5.0 (X11; Linux, x86_64)", "bot/2")),
        ),
        ("VCRAWL_PROXIES", "http://127.0.0.1:3128", ("proxies", ("http://127.0.0.1:3128",))),
        ("VCRAWL_SMTP_HOST", "mail.test", ("smtp_host", "mail.test")),
        ("VCRAWL_BATCH_ANALYSIS_RETRIES", "2", ("batch_analysis_retries", 2)),
    ],
)
def test_variables_are_parsed(variable: str, value: str, expected: tuple[str, object]) -> None:
    name, parsed = expected
    assert getattr(Settings.from_env({variable: value}), name) == parsed


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"VCRAWL_READ_TIMEOUT_S": "soon"}, "VCRAWL_READ_TIMEOUT_S"),
        ({"VCRAWL_READ_TIMEOUT_S": "-1"}, "VCRAWL_READ_TIMEOUT_S"),
        ({"VCRAWL_READ_TIMEOUT_S": "nan"}, "VCRAWL_READ_TIMEOUT_S"),
        ({"VCRAWL_FETCH_RETRIES": "2.5"}, "VCRAWL_FETCH_RETRIES"),
        ({"VCRAWL_TASK_EVENTS": "maybe"}, "VCRAWL_TASK_EVENTS"),
        ({"VCRAWL_REDIS_URL": "localhost:6379"}, "VCRAWL_REDIS_URL"),
        ({"VCRAWL_FRONTIER_URL": "http://127.0.0.1:6379"}, "VCRAWL_FRONTIER_URL"),
        ({"VCRAWL_FRONTIER_URL": "sentinel://127.0.0.1:26379"}, "VCRAWL_FRONTIER_URL"),
        ({"VCRAWL_FRONTIER_URL": "redis-cluster://"}, "VCRAWL_FRONTIER_URL"),
        ({"VCRAWL_FRONTIER_URL": "redis-cluster://10.0.0.1"}, "VCRAWL_FRONTIER_URL"),
        ({"VCRAWL_FRONTIER_URL": "redis-cluster://u:pw@10.0.0.1:7000"}, "VCRAWL_FRONTIER_URL"),
        ({"VCRAWL_FRONTIER_URL": "redis-cluster://10.0.0.1:7000/2"}, "VCRAWL_FRONTIER_URL"),
        ({"VCRAWL_PROXIES": "socks5://127.0.0.1:1080"}, "VCRAWL_PROXIES"),
        ({"VCRAWL_USER_AGENTS": "[1, 2]"}, "VCRAWL_USER_AGENTS"),
        ({"VCRAWL_USER_AGENTS": "[broken"}, "VCRAWL_USER_AGENTS"),
        ({"VCRAWL_ALERT_WEBHOOK_URL": "ftp://x"}, "VCRAWL_ALERT_WEBHOOK_URL"),
        ({"VCRAWL_ALERT_EMAIL_TO": "ops@x.test"}, "VCRAWL_SMTP_HOST"),
        ({"VCRAWL_VISIBILITY_TIMEOUT_S": "60"}, "VCRAWL_VISIBILITY_TIMEOUT_S"),
        ({"VCRAWL_BATCH_ANALYSIS_RETRIES": "51"}, "VCRAWL_BATCH_ANALYSIS_RETRIES"),
    ],
)
def test_bad_values_name_the_variable(environ: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Settings.from_env(environ)


def test_settings_survive_the_trip_through_a_child_environment() -> None:
    settings = Settings(user_agents=("a, b; c",), referers=(), min_interval_s=0.1, smtp_host="mail.test")
    assert Settings.from_env(settings.to_env()) == settings


def test_unix_socket_urls_are_spelled_for_celery() -> None:
    assert celery_redis_url("unix:///run/redis.sock?db=3") == "redis+socket:///run/redis.sock?virtual_host=3"


def test_the_frontier_shares_the_brokers_redis_unless_it_is_given_its_own() -> None:
    shared = Settings(redis_url="redis://broker:6379/0")
    assert shared.frontier_target() is shared
    frontier = "redis://frontier:6380/2"
    own = Settings.from_env({"VCRAWL_REDIS_URL": "sentinel://s1:26379/0", "VCRAWL_REDIS_SENTINEL_MASTER": "m",
                             "VCRAWL_FRONTIER_URL": frontier, "VCRAWL_REDIS_PASSWORD": "pw"})  # fmt: skip
    target = own.frontier_target()
    assert (target.redis_url, target.redis_sentinel_master, target.redis_password) == (frontier, "", "pw")
    assert Settings.from_env(own.to_env()) == own


def test_a_redis_cluster_url_lists_the_nodes_to_start_from() -> None:
    settings = Settings.from_env({"VCRAWL_FRONTIER_URL": "redis-cluster://10.0.0.1:7000,10.0.0.2:7001"})
    assert parse_cluster(settings.frontier_url or "") == (("10.0.0.1", 7000), ("10.0.0.2", 7001))
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"VCRAWL_FRONTIER_URL": "redis-cluster://u:secret@10.0.0.1:7000"})
    assert "secret" not in str(refused.value)
