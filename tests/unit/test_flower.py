"""``vcrawl flower``: credentials and addresses are checked before Flower starts; no secret on its command line."""

from __future__ import annotations

import pytest

from cli.flower import FlowerOptions, check_basic_auth, flower_command, flower_env, is_loopback
from cli.main import _parser
from vcrawl.errors import ConfigError
from vcrawl.settings import Settings

SETTINGS = Settings(redis_url="redis://:redispass@10.0.0.5:6379/2")


@pytest.mark.parametrize(
    ("value", "users"),
    [
        ("ops:pw", ["ops"]),
        ("ops:pa:ss", ["ops"]),  # only the user id is bounded by the first ':' (RFC 7617)
        ("ops:pw,alice:other", ["ops", "alice"]),
        ("ünï:pässwörd", ["ünï"]),
    ],
)
def test_good_basic_auth_values_give_their_users(value: str, users: list[str]) -> None:
    assert check_basic_auth(value) == users


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "empty"),
        ("hunter2", "no ':'"),
        ("ops:hunter2,", "pair 2 of 2 has no ':'"),
        ("ops:hun,ter2", "pair 2 of 2 has no ':'"),  # Flower splits on commas: a password cannot hold one
        (":hunter2", "empty user or password"),
        ("ops:", "empty user or password"),
        (" ops:hunter2", "whitespace"),
        ("ops:hunter2 ,alice:x", "pair 1 of 2 starts or ends with whitespace"),
    ],
)
def test_malformed_basic_auth_is_refused_without_echoing_it(value: str, problem: str) -> None:
    with pytest.raises(ConfigError, match="FLOWER_BASIC_AUTH") as caught:
        check_basic_auth(value)
    assert problem in str(caught.value)
    assert not any(secret in str(caught.value) for secret in ("hun", "ter2"))


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("localhost", True),
        ("", False),  # Tornado's "every interface"
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.10", False),
        ("localhost.example.com", False),  # names may resolve to anything
    ],
)
def test_loopback_addresses(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_defaults_are_loopback_port_5555_with_auth_required() -> None:
    args = _parser().parse_args(["flower"])
    assert (args.address, args.port, args.insecure_local) == ("127.0.0.1", 5555, False)
    assert args.run.__name__ == "_cmd_flower"
    assert FlowerOptions() == FlowerOptions(address="127.0.0.1", port=5555, insecure_local=False)


def test_options_from_the_command_line() -> None:
    args = _parser().parse_args(["flower", "--port", "6000", "--address", "::1", "--insecure-local"])
    assert (args.address, args.port, args.insecure_local) == ("::1", 6000, True)


@pytest.mark.parametrize("address", ["0.0.0.0", "", "10.1.2.3", "flower.internal"])
def test_insecure_local_is_refused_off_loopback(address: str) -> None:
    with pytest.raises(ConfigError, match="--insecure-local is only allowed on a loopback address"):
        FlowerOptions(address=address, insecure_local=True)


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_port_out_of_range_is_refused(port: int) -> None:
    with pytest.raises(ConfigError, match="--port"):
        FlowerOptions(port=port)


def test_command_line_runs_celery_flower_with_no_secrets() -> None:
    command = flower_command(FlowerOptions(address="::1", port=6001), python="/venv/bin/python")
    assert command == [
        "/venv/bin/python", "-m", "celery", "-A", "tasks", "flower", "--address=::1", "--port=6001",
    ]  # fmt: skip
    assert not any("auth" in arg or "broker" in arg or "redis" in arg for arg in command)


def test_missing_credentials_refuse_to_start_and_say_how_to_fix_it() -> None:
    with pytest.raises(ConfigError) as caught:
        flower_env({"PATH": "/bin"}, SETTINGS, FlowerOptions())
    message = str(caught.value)
    assert "FLOWER_BASIC_AUTH is not set" in message and "--insecure-local" in message


def test_malformed_credentials_refuse_to_start_even_with_insecure_local() -> None:
    with pytest.raises(ConfigError, match="FLOWER_BASIC_AUTH pair 1 of 1"):
        flower_env({"FLOWER_BASIC_AUTH": "ops"}, SETTINGS, FlowerOptions(insecure_local=True))


def test_insecure_local_starts_without_credentials() -> None:
    env = flower_env({"PATH": "/bin"}, SETTINGS, FlowerOptions(insecure_local=True))
    assert "FLOWER_BASIC_AUTH" not in env and env["PATH"] == "/bin"


def test_environment_keeps_credentials_and_pins_the_configured_broker() -> None:
    environ = {
        "PATH": "/bin",
        "FLOWER_BASIC_AUTH": "ops:pw",
        "BROKER_URL": "redis://elsewhere:6379/0",  # Celery's CLI would turn these into CELERY_* overrides
        "RESULT_BACKEND": "redis://elsewhere:6379/1",
        "CELERY_BROKER_URL": "redis://elsewhere:6379/0",
        "CELERY_BROKER_READ_URL": "redis://elsewhere:6379/0",
    }
    env = flower_env(environ, SETTINGS, FlowerOptions())
    assert env["FLOWER_BASIC_AUTH"] == "ops:pw"  # Flower reads it itself (flower.command.apply_env_options)
    assert env["CELERY_BROKER_URL"] == env["CELERY_RESULT_BACKEND"] == "redis://:redispass@10.0.0.5:6379/2"
    assert not {"BROKER_URL", "RESULT_BACKEND", "CELERY_BROKER_READ_URL"} & set(env)
    assert environ["CELERY_BROKER_URL"] == "redis://elsewhere:6379/0"  # the caller's mapping is left alone


def test_unix_socket_broker_is_spelled_for_kombu() -> None:
    settings = Settings(redis_url="unix:///run/redis/redis.sock?db=3")
    env = flower_env({"FLOWER_BASIC_AUTH": "ops:pw"}, settings, FlowerOptions())
    assert env["CELERY_BROKER_URL"] == "redis+socket:///run/redis/redis.sock?virtual_host=3"
