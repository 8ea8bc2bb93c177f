"""TLS to Redis and to the Sentinels: the settings that ask for it, what is refused, and the options
each client gets (vcrawl's own, kombu, Celery's backend, RedBeat, Flower). No sockets: clients are
built, never connected."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from flower.utils.broker import Broker
from redis.sentinel import SentinelManagedConnection

from celeryconfig import celery_settings
from tasks.redis_clients import make_redis_client
from vcrawl.errors import ConfigError
from vcrawl.settings import Settings
from vcrawl.targets.redis_tls import RedisTls

SENTINELS = "sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26380/2"
TLS_KEYS = ("broker_use_ssl", "redis_backend_use_ssl", "redbeat_redis_use_ssl")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """Three files that exist (their content is read only when a connection is made)."""
    paths = {}
    for name in ("ca", "cert", "key"):
        (tmp_path / f"{name}.pem").write_text("not read here\n")
        paths[name] = str(tmp_path / f"{name}.pem")
    return paths


def tls_settings(files: dict[str, str], **values: Any) -> Settings:
    return Settings(redis_tls_ca_file=files["ca"], redis_tls_cert_file=files["cert"], redis_tls_key_file=files["key"],
                    **values)  # fmt: skip


def flower_broker(conf: dict[str, Any]) -> Any:
    """The client Flower builds for /api/queues/length (flower.views.BaseHandler.get_broker)."""
    with Celery(broker=conf["broker_url"]).connection() as connection:
        url = connection.as_uri(include_password=True)  # Flower's app.broker_uri_with_password
    return Broker(url, broker_use_ssl=conf.get("broker_use_ssl"), broker_options=conf["broker_transport_options"])


def expected(files: dict[str, str]) -> dict[str, Any]:
    return {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_check_hostname": True, "ssl_ca_certs": files["ca"],
            "ssl_certfile": files["cert"], "ssl_keyfile": files["key"]}  # fmt: skip


# ---- plain: nothing changes ---------------------------------------------------------------------


@pytest.mark.parametrize("url", ["redis://h:6379/0", "unix:///run/r.sock?db=1", SENTINELS])
def test_plain_connections_get_no_tls_options(url: str) -> None:
    settings = Settings(redis_url=url, redis_sentinel_master="vm" if url.startswith("sentinel") else "")
    conf = celery_settings(settings)
    assert not set(TLS_KEYS) & set(conf)
    for options in (conf["broker_transport_options"], conf["result_backend_transport_options"]):
        assert not any(key.startswith("ssl") for key in options.get("sentinel_kwargs", {}))


# ---- one server: rediss:// ------------------------------------------------------------------------


def test_rediss_gives_every_client_verified_tls_with_the_files(files: dict[str, str]) -> None:
    settings = tls_settings(files, redis_url="rediss://redis.example:6380/1", redis_password="p@ss")
    conf = celery_settings(settings)
    assert (
        conf["broker_url"]
        == conf["result_backend"]
        == conf["redbeat_redis_url"]
        == ("rediss://:p%40ss@redis.example:6380/1")
    )
    for key in TLS_KEYS:  # without broker_use_ssl, kombu would take rediss:// with CERT_NONE
        assert conf[key] == expected(files), key
    client = make_redis_client(settings)
    pool = client.connection_pool
    assert pool.connection_class is redis.SSLConnection
    assert {key: pool.connection_kwargs[key] for key in expected(files)} == expected(files)


def test_rediss_without_files_verifies_against_the_system_cas() -> None:
    conf = celery_settings(Settings(redis_url="rediss://redis.example:6380/0"))
    assert conf["broker_use_ssl"] == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_check_hostname": True}


def test_flower_builds_its_tls_client_from_celerys_config(files: dict[str, str]) -> None:
    conf = celery_settings(tls_settings(files, redis_url="rediss://redis.example:6380/0"))
    kwargs = flower_broker(conf).redis.connection_pool.connection_kwargs
    assert kwargs["ssl_ca_certs"] == files["ca"] and kwargs["ssl_cert_reqs"] == ssl.CERT_REQUIRED


# ---- Sentinel: the servers, the Sentinels, or both ---------------------------------------------------


@pytest.mark.parametrize(("servers", "sentinels"), [(True, False), (False, True), (True, True)])
def test_sentinel_tls_reaches_each_client(files: dict[str, str], servers: bool, sentinels: bool) -> None:
    settings = tls_settings(files, redis_url=SENTINELS, redis_sentinel_master="vm", redis_tls=servers,
                            redis_sentinel_tls=sentinels, redis_sentinel_password="s")  # fmt: skip
    conf = celery_settings(settings)
    to_sentinels = {"ssl": True, **expected(files)} if sentinels else {}
    for options in (conf["broker_transport_options"], conf["result_backend_transport_options"],
                    conf["redbeat_redis_options"]):  # fmt: skip
        kwargs = options["sentinel_kwargs"]
        assert {key: value for key, value in kwargs.items() if key == "ssl" or key.startswith("ssl_")} == to_sentinels
        assert kwargs["password"] == "s"
    for key in TLS_KEYS:
        assert conf.get(key) == (expected(files) if servers else None), key

    client = make_redis_client(settings)
    pool = client.connection_pool
    assert issubclass(pool.connection_class, SentinelManagedConnection)  # follows the primary
    assert issubclass(pool.connection_class, redis.SSLConnection) == servers
    if servers:
        assert {key: pool.connection_kwargs[key] for key in expected(files)} == expected(files)
    for sentinel in pool.sentinel_manager.sentinels:
        assert (sentinel.connection_pool.connection_class is redis.SSLConnection) == sentinels

    flower_pool = flower_broker(conf).redis.connection_pool
    assert ("SSL" in flower_pool.connection_class.__name__) == servers
    for sentinel in flower_pool.sentinel_manager.sentinels:
        assert ("SSL" in sentinel.connection_pool.connection_class.__name__) == sentinels


def test_the_switches_come_from_the_environment_and_go_to_child_processes(files: dict[str, str]) -> None:
    env = {"VCRAWL_REDIS_URL": SENTINELS, "VCRAWL_REDIS_SENTINEL_MASTER": "vm", "VCRAWL_REDIS_TLS": "true",
           "VCRAWL_REDIS_SENTINEL_TLS": "yes", "VCRAWL_REDIS_TLS_CA_FILE": files["ca"],
           "VCRAWL_REDIS_TLS_CERT_FILE": files["cert"], "VCRAWL_REDIS_TLS_KEY_FILE": files["key"]}  # fmt: skip
    settings = Settings.from_env(env)
    assert RedisTls.from_settings(settings) == RedisTls(True, True, files["ca"], files["cert"], files["key"])
    assert Settings.from_env(settings.to_env()) == settings


# ---- verification off: said out loud ------------------------------------------------------------------


def test_turning_verification_off_is_logged_by_every_client_built(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(redis_url="rediss://redis.example:6380/0", redis_tls_verify=False)
    with caplog.at_level(logging.WARNING, logger="vcrawl.targets.redis_tls"):
        conf = celery_settings(settings)
        make_redis_client(settings)
    assert conf["broker_use_ssl"] == {"ssl_cert_reqs": ssl.CERT_NONE, "ssl_check_hostname": False}
    warnings = [record for record in caplog.records if "NOT verified" in record.getMessage()]
    assert len(warnings) == 2


def test_verified_tls_logs_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="vcrawl.targets.redis_tls"):
        celery_settings(Settings(redis_url="rediss://redis.example:6380/0"))
    assert not caplog.records


# ---- refused at start, naming the setting ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"redis_url": "rediss://h:1/0", "redis_tls_ca_file": "/nonexistent/ca.pem"},
         "VCRAWL_REDIS_TLS_CA_FILE: no such file: '/nonexistent/ca.pem'"),
        ({"redis_url": "rediss://h:1/0", "redis_tls_cert_file": "/nonexistent/c.pem"},
         "VCRAWL_REDIS_TLS_CERT_FILE: no such file"),
        ({"redis_url": "rediss://h:1/0", "redis_tls_key_file": "KEY"}, "KEY_FILE is set without VCRAWL_REDIS_TLS_CERT"),
        ({"redis_url": "unix:///run/r.sock", "redis_tls_ca_file": "CA"}, "VCRAWL_REDIS_URL is a unix socket"),
        ({"redis_url": "unix://:secret@/run/r.sock", "redis_tls_verify": False}, "VCRAWL_REDIS_TLS_VERIFY=false set"),
        ({"redis_url": "redis://:secret@h:1/0", "redis_tls": True}, "one server names TLS with rediss://"),
        ({"redis_url": "rediss://h:1/0", "redis_sentinel_tls": True}, "VCRAWL_REDIS_SENTINEL_TLS=true, but"),
        ({"redis_url": "redis://h:1/0", "redis_tls_ca_file": "CA"}, "no connection to Redis uses TLS"),
        ({"redis_url": SENTINELS, "redis_sentinel_master": "vm", "redis_tls_ca_file": "CA"},
         "VCRAWL_REDIS_TLS_CA_FILE set, but no connection to Redis uses TLS"),
    ],
)  # fmt: skip
def test_bad_tls_settings_are_refused_naming_the_setting(
    files: dict[str, str], values: dict[str, Any], problem: str
) -> None:
    for name, placeholder in (("CA", "ca"), ("KEY", "key")):  # files that exist, so the check under test is reached
        values = {key: files[placeholder] if value == name else value for key, value in values.items()}
    with pytest.raises(ConfigError) as caught:
        Settings(**values)
    assert problem in str(caught.value) and "secret" not in str(caught.value)


def test_a_certificate_file_may_hold_its_key(files: dict[str, str]) -> None:
    settings = Settings(redis_url="rediss://h:1/0", redis_tls_cert_file=files["cert"])
    assert "ssl_keyfile" not in celery_settings(settings)["broker_use_ssl"]
