"""``vcrawl flower``: Flower on the configured broker, behind basic auth, on loopback by default.

Flower 2.2 reads every ``FLOWER_<OPTION>`` variable itself (``flower.command.apply_env_options``;
``FLOWER_BASIC_AUTH=u1:p1,u2:p2`` is split on commas), so credentials reach it through the
environment and never appear on a command line that ``ps`` shows. The broker URL travels the
same way (``CELERY_BROKER_URL``), since it may hold Redis's (or RabbitMQ's) password too.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

from vcrawl.errors import ConfigError
from vcrawl.settings import Settings, celery_redis_url

__all__ = [
    "AUTH_VARIABLE",
    "FlowerOptions",
    "check_basic_auth",
    "exec_flower",
    "flower_command",
    "flower_env",
    "is_loopback",
]

AUTH_VARIABLE = "FLOWER_BASIC_AUTH"
# Celery's CLI turns BROKER_URL / RESULT_BACKEND into the CELERY_* variables, overriding ours.
_CELERY_OVERRIDES = ("BROKER_URL", "RESULT_BACKEND", "CELERY_BROKER_READ_URL", "CELERY_BROKER_WRITE_URL")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FlowerOptions:
    """Where Flower listens, and whether it may run without credentials (loopback only)."""

    address: str = "127.0.0.1"
    port: int = 5555
    insecure_local: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"--port must be in [1, 65535], got {self.port}")
        if self.insecure_local and not is_loopback(self.address):
            raise ConfigError(
                f"--insecure-local is only allowed on a loopback address (127.0.0.1, ::1, localhost), "
                f"not {self.address!r}: set {AUTH_VARIABLE}=user:password instead"
            )


def is_loopback(address: str) -> bool:
    """Return True if ``address`` only listens on this machine (``""`` means every interface).

    >>> [is_loopback(a) for a in ("127.0.0.1", "127.0.0.2", "::1", "localhost", "0.0.0.0", "", "10.0.0.1")]
    [True, True, True, True, False, False, False]
    """
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_basic_auth(value: str) -> list[str]:
    """Check a ``FLOWER_BASIC_AUTH`` value (``user:password``, comma-separated pairs); return the users.

    Messages never include a password.

    Raises:
        ConfigError: the value is empty, or a pair is not ``user:password``.
    """
    if value == "":
        raise ConfigError(f"{AUTH_VARIABLE} is set but empty; use user:password")
    pairs = value.split(",")  # as Flower splits it: a password cannot contain a comma
    users: list[str] = []
    for number, pair in enumerate(pairs, start=1):
        where = f"{AUTH_VARIABLE} pair {number} of {len(pairs)}"
        user, colon, password = pair.partition(":")
        if not colon:
            raise ConfigError(f"{where} has no ':'; use user:password (passwords cannot contain ',')")
        if not user or not password:
            raise ConfigError(f"{where} has an empty user or password; use user:password")
        if pair != pair.strip():  # Flower compares the pair byte for byte with what the browser sends
            raise ConfigError(f"{where} starts or ends with whitespace; remove it")
        users.append(user)
    return users


def flower_command(options: FlowerOptions, python: str = sys.executable) -> list[str]:
    """The ``celery -A tasks flower`` command line for ``options`` (no secrets on it).

    >>> flower_command(FlowerOptions(), python="python")
    ['python', '-m', 'celery', '-A', 'tasks', 'flower', '--address=127.0.0.1', '--port=5555']
    """
    return [python, "-m", "celery", "-A", "tasks", "flower", f"--address={options.address}", f"--port={options.port}"]


def flower_env(environ: Mapping[str, str], settings: Settings, options: FlowerOptions) -> dict[str, str]:
    """Flower's environment: ``environ`` with the broker pinned to ``settings``, credentials checked.

    Raises:
        ConfigError: ``FLOWER_BASIC_AUTH`` is missing (without ``--insecure-local``) or malformed.
    """
    basic_auth = environ.get(AUTH_VARIABLE)
    if basic_auth is not None:
        users = check_basic_auth(basic_auth)
        logger.info("flower: basic auth for %s", ", ".join(users))
    elif options.insecure_local:
        # Flower keeps /api/ closed without credentials unless FLOWER_UNAUTHENTICATED_API is set, which also
        # opens it to cross-origin reads: not ours to turn on.
        logger.warning(
            "flower: no authentication (--insecure-local): the web UI on %s is open to every local user; "
            "/api/ answers 401 unless FLOWER_UNAUTHENTICATED_API=true",
            options.address,
        )
    else:
        raise ConfigError(
            f"{AUTH_VARIABLE} is not set: Flower can revoke tasks and shut workers down, so it needs "
            f"credentials. Set {AUTH_VARIABLE}=user:password (or pairs separated by commas), or pass "
            f"--insecure-local to run without them on a loopback address"
        )
    if not is_loopback(options.address):
        logger.warning(
            "flower: listening on %s over plain HTTP; basic auth sends the password in clear, and /metrics "
            "and /healthcheck answer without it: put a TLS proxy in front",
            options.address,
        )
    env = {name: value for name, value in environ.items() if name not in _CELERY_OVERRIDES}
    url = celery_redis_url(settings.redis_url, settings.redis_password)
    env["CELERY_BROKER_URL"] = settings.broker_url or url  # RabbitMQ's when Celery's messages go through it
    env["CELERY_RESULT_BACKEND"] = url
    return env


def exec_flower(command: list[str], env: Mapping[str, str]) -> NoReturn:
    """Replace this process with Flower: signals reach it directly and its exit code is ours."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, dict(env))
