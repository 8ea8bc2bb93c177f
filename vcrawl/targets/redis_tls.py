"""TLS to vcrawl's Redis servers and to their Sentinels, from the environment.

One server names TLS in its URL (``rediss://host:port/0``). Behind Sentinel, the URL names the
Sentinels, so two switches say which connections speak TLS: ``VCRAWL_REDIS_TLS=true`` those to
the Redis servers (the primary Sentinel names), ``VCRAWL_REDIS_SENTINEL_TLS=true`` those to the
Sentinels themselves (their ``tls-port``). Both use the same files: ``VCRAWL_REDIS_TLS_CA_FILE``
(the CA bundle that signed the servers' certificates; the system's CAs without it) and, for
servers with ``tls-auth-clients yes``, ``VCRAWL_REDIS_TLS_CERT_FILE`` + ``VCRAWL_REDIS_TLS_KEY_FILE``.
The server's certificate is always verified, hostname included (the address Sentinel announces
must be in it), unless ``VCRAWL_REDIS_TLS_VERIFY=false``, which every client built logs as a warning.

The options are redis-py's ``ssl_*`` keywords: kombu's ``broker_use_ssl``, Celery's
``redis_backend_use_ssl``, RedBeat's ``redbeat_redis_use_ssl`` and Flower (which reads
``broker_use_ssl``) hand them to redis-py as they are.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from vcrawl.errors import ConfigError
from vcrawl.targets.redis import is_sentinel

__all__ = ["RedisTls", "TlsSettings", "check_redis_tls"]

logger = logging.getLogger(__name__)

_FILES = ("redis_tls_ca_file", "redis_tls_cert_file", "redis_tls_key_file")


class TlsSettings(Protocol):
    """The settings TLS reads (``vcrawl.settings.Settings`` has them; a Protocol keeps the import one way)."""

    redis_url: str
    redis_tls: bool
    redis_sentinel_tls: bool
    redis_tls_ca_file: str | None
    redis_tls_cert_file: str | None
    redis_tls_key_file: str | None
    redis_tls_verify: bool


def _variable(field: str) -> str:
    return f"VCRAWL_{field.upper()}"


@dataclass(frozen=True)
class RedisTls:
    """Which of vcrawl's Redis connections speak TLS, and with which files."""

    servers: bool = False  # to the Redis servers
    sentinels: bool = False  # to the Sentinels
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True

    @classmethod
    def from_settings(cls, settings: TlsSettings) -> RedisTls:
        """What ``settings`` ask for; logs a warning when TLS is used without verification."""
        sentinel = is_sentinel(settings.redis_url)
        tls = cls(
            servers=urlsplit(settings.redis_url).scheme == "rediss" or (sentinel and settings.redis_tls),
            sentinels=sentinel and settings.redis_sentinel_tls,
            ca_file=settings.redis_tls_ca_file,
            cert_file=settings.redis_tls_cert_file,
            key_file=settings.redis_tls_key_file,
            verify=settings.redis_tls_verify,
        )
        if not tls.verify and (tls.servers or tls.sentinels):
            logger.warning(
                "VCRAWL_REDIS_TLS_VERIFY=false: the Redis servers' certificates are NOT verified; anyone "
                "between vcrawl and Redis can read and change every message, password included"
            )
        return tls

    def ssl_options(self) -> dict[str, Any]:
        """redis-py's ``ssl_*`` keywords for a TLS connection (whether one is used or not).

        >>> RedisTls(servers=True, ca_file="/etc/ca.pem").ssl_options()["ssl_ca_certs"]
        '/etc/ca.pem'
        """
        options: dict[str, Any] = {
            "ssl_cert_reqs": ssl.CERT_REQUIRED if self.verify else ssl.CERT_NONE,
            "ssl_check_hostname": self.verify,
        }
        for key, path in (("ssl_ca_certs", self.ca_file), ("ssl_certfile", self.cert_file),
                          ("ssl_keyfile", self.key_file)):  # fmt: skip
            if path is not None:
                options[key] = path
        return options

    def server_options(self) -> dict[str, Any]:
        """The ``ssl_*`` keywords for connections to the Redis servers; empty when they are plain."""
        return self.ssl_options() if self.servers else {}

    def sentinel_options(self) -> dict[str, Any]:
        """Keywords for ``redis.Redis`` to a Sentinel (``ssl=True`` and the files); empty when plain."""
        return {"ssl": True, **self.ssl_options()} if self.sentinels else {}


def check_redis_tls(settings: TlsSettings) -> None:
    """Refuse TLS settings that cannot work or would be ignored.

    Raises:
        ConfigError: a file that does not exist, a key without a certificate, TLS options with a
            unix socket or with no TLS connection, a switch that does not fit the URL.
    """
    url = settings.redis_url
    scheme = "sentinel" if is_sentinel(url) else urlsplit(url).scheme
    given = [_variable(name) for name in _FILES if getattr(settings, name) is not None]
    given += [_variable(name) for name in ("redis_tls", "redis_sentinel_tls") if getattr(settings, name)]
    given += ["VCRAWL_REDIS_TLS_VERIFY=false"] if not settings.redis_tls_verify else []
    if scheme == "unix" and given:  # the URL is not echoed: it may hold a password
        raise ConfigError(f"{', '.join(given)} set, but VCRAWL_REDIS_URL is a unix socket: TLS is for "
                          "rediss:// or sentinel:// URLs")  # fmt: skip
    if settings.redis_tls and scheme == "redis":
        raise ConfigError("VCRAWL_REDIS_TLS=true with a redis:// URL: one server names TLS with rediss://")
    if settings.redis_sentinel_tls and scheme != "sentinel":
        raise ConfigError("VCRAWL_REDIS_SENTINEL_TLS=true, but VCRAWL_REDIS_URL names no Sentinels (sentinel://)")
    uses_tls = scheme == "rediss" or settings.redis_tls or settings.redis_sentinel_tls
    if given and not uses_tls:
        raise ConfigError(f"{', '.join(given)} set, but no connection to Redis uses TLS: use rediss://, or "
                          "VCRAWL_REDIS_TLS / VCRAWL_REDIS_SENTINEL_TLS with sentinel://")  # fmt: skip
    for name in _FILES:
        path = getattr(settings, name)
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"{_variable(name)}: no such file: {path!r}")
    if settings.redis_tls_key_file is not None and settings.redis_tls_cert_file is None:
        raise ConfigError(
            "VCRAWL_REDIS_TLS_KEY_FILE is set without VCRAWL_REDIS_TLS_CERT_FILE (the client certificate)"
        )
