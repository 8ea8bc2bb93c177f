"""How ``VCRAWL_*`` values are read: one parser per field type, a few per field, and the URL and
network checks ``Settings`` shares with them. Errors name the variable; values that may hold a
password are not echoed."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from vcrawl.errors import ConfigError, InvalidTask
from vcrawl.header_values import header_value_problem
from vcrawl.proxy_sources import ProxySource, load_proxy_sources
from vcrawl.targets.clusters import parse_cluster_entries

__all__ = ["FIELD_PARSERS", "TYPE_PARSERS", "check_network", "check_url"]


def check_url(name: str, value: str, schemes: tuple[str, ...]) -> None:
    """Raise ``ConfigError`` naming ``name`` unless ``value`` is a URL with one of ``schemes``."""
    parts = urlsplit(value)
    if parts.scheme not in schemes or not (parts.netloc or parts.path):
        raise ConfigError(f"{name} must be a URL with scheme {'/'.join(schemes)}, got {value!r}")


def _parse_str(name: str, raw: str) -> str:
    return raw


def _parse_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{name} must not be negative, got {raw!r}")
    return value


def _parse_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"{name} must be a finite number >= 0, got {raw!r}")
    return value


def _parse_bool(name: str, raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def _parse_list(name: str, raw: str) -> tuple[str, ...]:
    """A JSON array of strings, or one item per line (User-Agents contain commas)."""
    return tuple(item.strip() for item in _list_items(name, raw))


def _list_items(name: str, raw: str) -> list[str]:
    """The non-blank items of a list variable as given (not stripped)."""
    if raw.startswith("["):
        try:
            items = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name} is not a valid JSON array: {exc}") from None
        if not all(isinstance(item, str) for item in items):
            raise ConfigError(f"{name} must be a JSON array of strings, got {raw!r}")
    else:
        items = raw.splitlines()
    return [item for item in items if item.strip()]


def _parse_header_list(name: str, raw: str) -> tuple[str, ...]:
    """A list whose values are sent as HTTP header values: as ``_parse_list``, each item checked as given.

    Line ends separate the items of the one-per-line form; a JSON item holding one is refused.
    """
    items = _list_items(name, raw)
    for index, item in enumerate(items):
        if (problem := header_value_problem(item)) is not None:
            raise ConfigError(f"{name}[{index}] {problem}")  # no echo: a proxy URL may hold a password
    return tuple(item.strip() for item in items)


def _parse_networks(name: str, raw: str) -> tuple[str, ...]:
    """CIDRs separated by commas (or whitespace), or a JSON array as ``to_env`` writes it.

    >>> _parse_networks("VCRAWL_ALLOWED_NETWORKS", "127.0.0.0/8, ::1/128")
    ('127.0.0.0/8', '::1/128')
    """
    items = _parse_list(name, raw) if raw.startswith("[") else tuple(raw.replace(",", " ").split())
    for item in items:
        check_network(name, item)
    return items


def check_network(name: str, value: str) -> None:
    """Raise ``ConfigError`` naming ``name`` unless ``value`` is a CIDR network."""
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ConfigError(f"{name} must list CIDR networks (like 10.0.0.0/8), got {value!r}") from None


def _parse_proxy_sources(name: str, raw: str) -> tuple[ProxySource, ...]:
    """A JSON array of proxy sources, or the path of a JSON/YAML file of them (vcrawl.proxy_sources)."""
    try:
        return load_proxy_sources(raw)
    except InvalidTask as exc:
        raise ConfigError(f"{name}: {exc}") from None


# Fields whose variables read differently from other fields of their type.
FIELD_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "allowed_networks": _parse_networks,
    "user_agents": _parse_header_list,
    "referers": _parse_header_list,
    "proxies": _parse_header_list,
    "proxy_sources": _parse_proxy_sources,
    "monitor_clusters": parse_cluster_entries,
    "log_format": lambda name, raw: raw.lower(),
    "log_stream_level": lambda name, raw: raw.upper(),
}

TYPE_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "str": _parse_str,
    "str | None": _parse_str,
    "int": _parse_int,
    "int | None": _parse_int,
    "float": _parse_float,
    "bool": _parse_bool,
    "tuple[str, ...]": _parse_list,
}
