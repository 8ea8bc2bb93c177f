"""Where vcrawl's Redis is: one server, or the current primary of a set that Sentinel watches.

``VCRAWL_REDIS_URL`` is either one server (``redis://``, ``rediss://``, ``unix://``) or a list of
Sentinels, ``sentinel://host1:26379;sentinel://host2:26379;sentinel://host3:26379/0`` (the
database at the end of any of them, 0 when none), with the primary's name in
``VCRAWL_REDIS_SENTINEL_MASTER``. Passwords never go in the URL: ``VCRAWL_REDIS_PASSWORD`` (the
Redis servers') and ``VCRAWL_REDIS_SENTINEL_PASSWORD`` (the Sentinels'), from the environment.
Every client vcrawl makes is built from this: Celery's broker and results, RedBeat, the
frontier's client, Flower.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, quote, urlsplit

__all__ = [
    "CLUSTER_SCHEME",
    "SENTINEL_SCHEME",
    "SentinelSet",
    "celery_redis_url",
    "check_frontier_url",
    "is_cluster",
    "is_sentinel",
    "parse_cluster",
    "parse_sentinels",
]

SENTINEL_SCHEME = "sentinel"
CLUSTER_SCHEME = "redis-cluster"
_SEPARATOR = ";"


@dataclass(frozen=True)
class SentinelSet:
    """The Sentinels to ask, and the database on the primary they name."""

    sentinels: tuple[tuple[str, int], ...]
    db: int = 0


def is_sentinel(url: str) -> bool:
    """True for a ``sentinel://`` URL (one or more, separated by ``;``)."""
    return url.strip().lower().startswith(f"{SENTINEL_SCHEME}://")


def is_cluster(url: str) -> bool:
    """True for a ``redis-cluster://`` URL (the frontier on a Redis Cluster)."""
    return url.strip().lower().startswith(f"{CLUSTER_SCHEME}://")


def parse_cluster(url: str) -> tuple[tuple[str, int], ...]:
    """Read ``redis-cluster://h1:p1,h2:p2,...``: the nodes a client starts from (any of the cluster's).

    >>> parse_cluster("redis-cluster://10.0.0.1:7000,10.0.0.2:7001")
    (('10.0.0.1', 7000), ('10.0.0.2', 7001))

    Raises:
        ValueError: no node, a node that is no ``host:port``, a password, a database or a path.
    """
    rest = url.strip()[len(CLUSTER_SCHEME) + 3 :] if is_cluster(url) else ""
    if "@" in rest:
        raise ValueError("passwords go in VCRAWL_REDIS_PASSWORD, not the URL")
    if "/" in rest.rstrip("/") or "?" in rest:
        raise ValueError("a Redis Cluster has one database (0) and takes no options in the URL")
    nodes = []
    for part in filter(None, (piece.strip() for piece in rest.rstrip("/").split(","))):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{part!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise ValueError("no cluster node given: redis-cluster://host:port[,host:port...]")
    return tuple(nodes)


def check_frontier_url(url: str) -> None:
    """Check ``VCRAWL_FRONTIER_URL``: one server (``redis://``, ``rediss://``, ``unix://``) or a Redis Cluster.

    Raises:
        ValueError: anything else, or a malformed cluster URL.
    """
    if is_cluster(url):
        parse_cluster(url)
        return
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix") or not (parts.netloc or parts.path):
        raise ValueError("must be a URL with scheme redis/rediss/unix, or redis-cluster://host:port[,host:port...]")


def parse_sentinels(url: str) -> SentinelSet:
    """Read ``sentinel://h1:p1;sentinel://h2:p2/db``.

    >>> parse_sentinels("sentinel://10.0.0.1:26379;sentinel://10.0.0.2/2")
    SentinelSet(sentinels=(('10.0.0.1', 26379), ('10.0.0.2', 26379)), db=2)

    Raises:
        ValueError: a part that is no ``sentinel://host[:port][/db]``, a password in it, or two databases.
    """
    sentinels: list[tuple[str, int]] = []
    databases: set[int] = set()
    for chunk in filter(None, (part.strip() for part in url.split(_SEPARATOR))):
        parts = urlsplit(chunk)
        if parts.scheme != SENTINEL_SCHEME or not parts.hostname:
            raise ValueError(f"{chunk!r} is not sentinel://host:port")
        if parts.password or parts.username:
            raise ValueError("passwords go in VCRAWL_REDIS_PASSWORD / VCRAWL_REDIS_SENTINEL_PASSWORD, not the URL")
        try:
            port = parts.port or 26379
        except ValueError:
            raise ValueError(f"{chunk!r} has no valid port") from None
        path = parts.path.strip("/")
        if path:
            if not path.isdigit():
                raise ValueError(f"{chunk!r}: the database must be a number, got {path!r}")
            databases.add(int(path))
        sentinels.append((parts.hostname, port))
    if not sentinels:
        raise ValueError("no Sentinel given")
    if len(databases) > 1:
        raise ValueError(f"the parts name different databases: {sorted(databases)}")
    return SentinelSet(tuple(sentinels), databases.pop() if databases else 0)


def celery_redis_url(url: str, password: str = "") -> str:
    """Spell a Redis URL the way kombu and Celery's backend want it.

    A Sentinel list gets the database (and the Redis password, which kombu and Celery read from
    the URL) on each part; the Sentinels' own password goes in the transport options.

    >>> celery_redis_url("unix:///tmp/r.sock?db=2")
    'redis+socket:///tmp/r.sock?virtual_host=2'
    >>> celery_redis_url("redis://127.0.0.1:6379/0")
    'redis://127.0.0.1:6379/0'
    >>> celery_redis_url("sentinel://a:1;sentinel://b:2/3", "p@ss")
    'sentinel://:p%40ss@a:1/3;sentinel://:p%40ss@b:2/3'
    """
    if is_sentinel(url):
        found = parse_sentinels(url)
        auth = f":{quote(password, safe='')}@" if password else ""
        return _SEPARATOR.join(f"{SENTINEL_SCHEME}://{auth}{host}:{port}/{found.db}" for host, port in found.sentinels)
    parts = urlsplit(url)
    if parts.scheme != "unix":
        if password and not parts.password:  # redis://host:port/db -> redis://:password@host:port/db
            return parts._replace(netloc=f":{quote(password, safe='')}@{parts.netloc}").geturl()
        return url
    db = parse_qs(parts.query).get("db", ["0"])[0]
    query = f"virtual_host={db}" + (f"&password={quote(password, safe='')}" if password else "")
    return f"redis+socket://{parts.path}?{query}"
