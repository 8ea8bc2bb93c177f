"""VCRAWL_REDIS_URL as one server or a set of Sentinels, and what Celery, RedBeat and vcrawl's client get."""

from __future__ import annotations

import pytest

from celeryconfig import celery_settings
from vcrawl.errors import ConfigError
from vcrawl.settings import Settings
from vcrawl.targets.redis import SentinelSet, celery_redis_url, parse_sentinels

SENTINELS = "sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26380;sentinel://10.0.0.3/2"


def test_a_sentinel_list_names_each_sentinel_and_one_database() -> None:
    assert parse_sentinels(SENTINELS) == SentinelSet((("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379)), 2)
    assert parse_sentinels("sentinel://h:1").db == 0


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sentinel://h:1/1;sentinel://h:2/2", "different databases"),
        ("sentinel://:secret@h:1", "passwords go in"),
        ("sentinel://h:1;redis://h:2", "is not sentinel://"),
        ("sentinel://h:1/x", "must be a number"),
        ("sentinel://h:99999", "no valid port"),
    ],
)
def test_a_malformed_sentinel_list_is_refused_and_no_password_is_echoed(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings(redis_url=url, redis_sentinel_master="m")
    assert problem in str(caught.value) and "secret" not in str(caught.value)


def test_sentinels_need_the_primarys_name_and_a_plain_url_refuses_one() -> None:
    with pytest.raises(ConfigError, match="VCRAWL_REDIS_SENTINEL_MASTER"):
        Settings(redis_url=SENTINELS)
    with pytest.raises(ConfigError, match="not a sentinel:// URL"):
        Settings(redis_url="redis://h:6379/0", redis_sentinel_master="m")


def test_passwords_come_from_the_environment_and_stay_out_of_repr() -> None:
    env = {"VCRAWL_REDIS_URL": SENTINELS, "VCRAWL_REDIS_SENTINEL_MASTER": "vm",
           "VCRAWL_REDIS_PASSWORD": "r-secret", "VCRAWL_REDIS_SENTINEL_PASSWORD": "s-secret"}  # fmt: skip
    settings = Settings.from_env(env)
    assert "secret" not in repr(settings)
    assert Settings.from_env(settings.to_env()) == settings  # a child process gets the same


def test_celery_and_redbeat_ask_the_same_sentinels_for_the_primary() -> None:
    settings = Settings(redis_url=SENTINELS, redis_sentinel_master="vm", redis_password="p@ss",
                        redis_sentinel_password="s")  # fmt: skip
    conf = celery_settings(settings)
    assert (
        conf["broker_url"]
        == conf["result_backend"]
        == (
            "sentinel://:p%40ss@10.0.0.1:26379/2;sentinel://:p%40ss@10.0.0.2:26380/2;sentinel://:p%40ss@10.0.0.3:26379/2"
        )
    )
    for options in (conf["broker_transport_options"], conf["result_backend_transport_options"]):
        assert options["master_name"] == "vm" and options["sentinel_kwargs"]["password"] == "s"
    assert conf["broker_transport_options"]["visibility_timeout"] == settings.visibility_timeout_s
    assert conf["redbeat_redis_url"] == "redis-sentinel://10.0.0.1:26379/2"
    redbeat = conf["redbeat_redis_options"]
    assert (redbeat["service_name"], redbeat["db"], redbeat["password"]) == ("vm", 2, "p@ss")
    assert redbeat["sentinels"] == [["10.0.0.1", 26379], ["10.0.0.2", 26380], ["10.0.0.3", 26379]]


def test_a_plain_url_gets_the_password_from_the_environment() -> None:
    assert celery_redis_url("redis://h:6379/0", "pw") == "redis://:pw@h:6379/0"
    assert celery_redis_url("redis://:own@h:6379/0", "pw") == "redis://:own@h:6379/0"  # the URL's wins
    conf = celery_settings(Settings(redis_url="redis://h:6379/1", redis_password="pw"))
    assert conf["broker_url"] == conf["redbeat_redis_url"] == "redis://:pw@h:6379/1"
    assert "master_name" not in conf["broker_transport_options"]
