"""The crawler clusters one ``vcrawl serve`` watches: ``NAME=URL`` entries, their names, their URLs as shown.

Entries come from ``--cluster NAME=URL`` (repeated) and ``VCRAWL_MONITOR_CLUSTERS``; a URL may hold the
password of its Redis, so nothing here echoes one: errors and listings show ``shown_url``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit

from vcrawl.errors import ConfigError

__all__ = ["CLUSTER_NAME", "DEFAULT_CLUSTER_NAME", "cluster_urls", "parse_cluster_entries", "shown_entry", "shown_url"]

CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,39}")
"""A cluster's name: a path segment of the API's URLs (``/api/clusters/NAME/...``) as it is."""
DEFAULT_CLUSTER_NAME = "default"
"""The name of the monitor's own cluster (its ``VCRAWL_REDIS_URL``) unless ``vcrawl serve --name`` gives one."""
_SCHEMES = ("redis", "rediss", "unix")
# Entries of the variable are separated by commas (or line ends) before the next NAME=: a comma inside a URL
# (none of redis://, rediss://, unix:// has one in practice) is kept.
_NEXT_ENTRY = re.compile(r"[,\n]\s*(?=[A-Za-z0-9][A-Za-z0-9_-]{0,39}=)")
_MAX_CLUSTERS = 64


def parse_cluster_entries(variable: str, raw: str) -> tuple[str, ...]:
    """``VCRAWL_MONITOR_CLUSTERS``: ``name=url,name=url`` (or one per line, or a JSON array of such strings, as
    ``Settings.to_env`` writes it), checked as ``cluster_urls`` checks.

    >>> parse_cluster_entries("V", "eu=redis://10.0.0.1:6379/0, us=redis://:pw@10.0.0.2:6379/0")
    ('eu=redis://10.0.0.1:6379/0', 'us=redis://:pw@10.0.0.2:6379/0')

    Raises:
        ConfigError: naming ``variable`` and the bad entry (its password hidden).
    """
    if raw.strip().startswith("["):
        try:
            items = json.loads(raw)
        except ValueError:
            raise ConfigError(f"{variable} is not a valid JSON array") from None  # no echo: it holds passwords
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise ConfigError(f"{variable} must be a JSON array of NAME=URL strings")
    else:
        items = _NEXT_ENTRY.split(raw.strip())
    entries = tuple(item.strip() for item in items if item.strip())
    cluster_urls(entries, variable)
    return entries


def cluster_urls(entries: Iterable[str], source: str, taken: Iterable[str] = ()) -> dict[str, str]:
    """``NAME=URL`` entries as name -> Redis URL, in their order.

    ``taken``: names already used (the monitor's own cluster's), which no entry may take again.

    >>> cluster_urls(["eu=redis://r1:6379/0", "us=unix:///run/r.sock"], "--cluster")
    {'eu': 'redis://r1:6379/0', 'us': 'unix:///run/r.sock'}
    >>> cluster_urls(["eu=redis://:s3cret@r1:6379/0", "eu=redis://r2"], "--cluster")
    Traceback (most recent call last):
    ...
    vcrawl.errors.ConfigError: --cluster: the name 'eu' is given twice (eu=redis://:***@r1:6379/0, eu=redis://r2)

    Raises:
        ConfigError: an entry without ``=``, a bad name, a URL that is not redis://, rediss:// or unix://,
            a name given twice, or more than 64 clusters; naming ``source``.
    """
    urls: dict[str, str] = {}
    used = set(taken)
    for entry in entries:
        name, sep, url = entry.strip().partition("=")
        name, url = name.strip(), url.strip()
        if not sep or not url:
            raise ConfigError(f"{source}: {shown_entry(entry)!r} must be NAME=URL (a Redis URL)")
        if not CLUSTER_NAME.fullmatch(name):
            raise ConfigError(f"{source}: the name {name[:60]!r} must be 1-40 letters, digits, '-' or '_', "
                              "starting with a letter or digit")  # fmt: skip
        parts = urlsplit(url)
        if parts.scheme not in _SCHEMES or not (parts.netloc or parts.path):
            raise ConfigError(f"{source}: {name}'s URL must be redis://, rediss:// or unix://, got {shown_url(url)!r}")
        if name in urls or name in used:
            earlier = f"{name}={shown_url(urls[name])}" if name in urls else "this server's own cluster (--name)"
            raise ConfigError(f"{source}: the name {name!r} is given twice ({earlier}, {name}={shown_url(url)})")
        urls[name] = url
        if len(urls) > _MAX_CLUSTERS:
            raise ConfigError(f"{source}: at most {_MAX_CLUSTERS} clusters")
    return urls


def shown_url(url: str) -> str:
    """A Redis URL fit to show or log: its password (in the address or a ``password=`` parameter) hidden.

    >>> shown_url("redis://:s3cret@r1:6379/0"), shown_url("redis://u:s3cret@r1/0"), shown_url("redis://r1/0")
    ('redis://:***@r1:6379/0', 'redis://u:***@r1/0', 'redis://r1/0')
    >>> shown_url("unix:///run/r.sock?db=1&password=s3cret")
    'unix:///run/r.sock?db=1&password=%2A%2A%2A'
    """
    try:
        parts = urlsplit(url)
    except ValueError:  # not even a URL: show none of it
        return "(a malformed URL)"
    head, mark, query = url.partition("?")
    if "@" in parts.netloc:
        user, _, address = parts.netloc.rpartition("@")
        name = user.partition(":")[0]
        # redis://:pw@host, redis://user:pw@host; a lone user part may be a password too (redis://pw@host)
        head = head.replace(parts.netloc, f"{name}:***@{address}" if ":" in user else f"***@{address}", 1)
    if "password" in query.lower():
        query = urlencode([(key, "***" if key.lower() == "password" else value) for key, value in parse_qsl(query)])
    return head + mark + query


def shown_entry(entry: str) -> str:
    """A ``NAME=URL`` entry fit to show (its URL's password hidden)."""
    name, sep, url = entry.partition("=")
    return f"{name}{sep}{shown_url(url)}" if sep else shown_url(entry)
