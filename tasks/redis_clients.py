"""vcrawl's own Redis client (frontier, job state, status trail): one server, or the primary Sentinel names.

Behind Sentinel, the client asks the Sentinels for the primary on every new connection. While a
failover runs (the old primary gone, no new one promoted yet: down-after plus the election, a few
seconds), its commands are retried with backoff for up to ``FAILOVER_RETRY_S``, so the pumps,
tasks and the API wait for the new primary instead of failing. A command whose reply was lost is
sent again: vcrawl's scripts are idempotent (admission tokens, leases checked on release).

TLS (``vcrawl.targets.redis_tls``): ``rediss://`` or ``VCRAWL_REDIS_TLS`` for the servers,
``VCRAWL_REDIS_SENTINEL_TLS`` for the Sentinels, verified against ``VCRAWL_REDIS_TLS_CA_FILE``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.cluster import PRIMARY, ClusterNode, ClusterPipeline, RedisCluster
from redis.connection import SSLConnection
from redis.exceptions import ClusterDownError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

from cluster.fence import SentinelFence
from vcrawl.settings import Settings
from vcrawl.targets.redis import is_cluster, is_sentinel, parse_cluster, parse_sentinels
from vcrawl.targets.redis_tls import RedisTls

__all__ = [
    "FAILOVER_RETRY_S",
    "make_fence",
    "make_frontier_client",
    "make_redis_client",
    "probe_redis",
    "sentinel_options",
    "server_options",
]

FAILOVER_RETRY_S = 60.0
"""How long a command waits out a failover: Sentinel's default down-after is 30 s, plus the election."""

_SENTINEL_TIMEOUT_S = 2.0  # an answer from a Sentinel; a dead one is skipped for the next
_COMMAND_TIMEOUT_S = 10.0  # no command of vcrawl's waits longer (its longest BLPOP is the pump's, a second or two)


class _PrimaryFollowingConnection(SentinelManagedConnection):
    """A connection that asks the Sentinels for the primary every time it connects again.

    redis-py (8.1) reconnects a dropped connection inside a command's retries through
    ``connect_check_health``, to the address it had: the old primary, now a replica, that answers
    READONLY for the whole retry budget. Asking first sends the retry to the new primary.
    """

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if self._sock is None and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)


class _PrimaryFollowingSSLConnection(_PrimaryFollowingConnection, SSLConnection):
    """The same over TLS (as redis-py's ``SentinelManagedSSLConnection``)."""


def _failover_retry() -> Retry:
    # Backoff from 0.1 s, capped at 1 s: ~FAILOVER_RETRY_S in all.
    return Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.1), retries=int(FAILOVER_RETRY_S))


def sentinel_options(settings: Settings, tls: RedisTls | None = None) -> dict[str, object]:
    """The keyword arguments for the Sentinels themselves (their password, short timeouts, TLS)."""
    options: dict[str, object] = {"socket_timeout": _SENTINEL_TIMEOUT_S, "socket_connect_timeout": _SENTINEL_TIMEOUT_S}
    if settings.redis_sentinel_password:
        options["password"] = settings.redis_sentinel_password
    options.update((tls or RedisTls.from_settings(settings)).sentinel_options())
    return options


def server_options(settings: Settings) -> dict[str, object]:
    """The keyword arguments for a connection to a Redis server itself, by address (password, TLS)."""
    options: dict[str, object] = {"password": settings.redis_password} if settings.redis_password else {}
    tls = RedisTls.from_settings(settings)
    if tls.servers:
        options.update(ssl=True, **tls.server_options())
    return options


def make_fence(settings: Settings) -> SentinelFence | None:
    """The listener that fences an old primary in a failover; None for a Redis without Sentinel."""
    if not is_sentinel(settings.redis_url):
        return None
    found = parse_sentinels(settings.redis_url)
    return SentinelFence(found.sentinels, settings.redis_sentinel_master, server_options(settings),
                         sentinel_options(settings))  # fmt: skip


def make_redis_client(settings: Settings) -> redis.Redis:
    """A client of the Redis ``settings`` name, decoding replies to str."""
    password = settings.redis_password or None
    tls = RedisTls.from_settings(settings)
    if not is_sentinel(settings.redis_url):
        extra = {"password": password} if password else {}
        # rediss:// makes redis-py's SSLConnection; the options verify it (CA, hostname, client cert).
        # Bounded: a command on a connection to an unreachable Redis (a partition) fails in seconds, so the
        # threads of a worker cut off notice it and reconnect once it heals. Options in the URL win.
        timeouts = {"socket_timeout": _COMMAND_TIMEOUT_S, "socket_connect_timeout": _COMMAND_TIMEOUT_S}
        return redis.Redis.from_url(settings.redis_url, decode_responses=True, **timeouts, **extra,
                                    **tls.server_options())  # fmt: skip
    found = parse_sentinels(settings.redis_url)
    sentinel = Sentinel(list(found.sentinels), sentinel_kwargs=sentinel_options(settings, tls))
    server_tls = tls.server_options() if tls.servers else {}
    return sentinel.master_for(
        settings.redis_sentinel_master,
        db=found.db,
        password=password,
        decode_responses=True,
        connection_class=_PrimaryFollowingSSLConnection if tls.servers else _PrimaryFollowingConnection,
        socket_connect_timeout=_SENTINEL_TIMEOUT_S,
        socket_timeout=_COMMAND_TIMEOUT_S,
        retry=_failover_retry(),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        **server_tls,
    )


class _SlotlessPrimaries:
    """Primaries that serve no slot yet, met by ASK: a slot moving onto a node just added.

    redis-py (8.1) knows only the nodes ``CLUSTER SLOTS`` lists, so it looks such a node up, finds
    nothing and fails the command with an AttributeError (redis-py issue 4015): mid-batch, a fetch
    lost that way had its pages fetched twice. Each is known here by address, a few at most.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, ClusterNode] = {}

    def named(self, node_name: str) -> ClusterNode | None:
        address, _, number = node_name.rpartition(":")
        if not address or not number.isdigit():
            return None
        with self._lock:
            return self._nodes.setdefault(node_name, ClusterNode(address, int(number), PRIMARY))

    def close(self) -> None:
        with self._lock:
            nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            if node.redis_connection is not None:
                node.redis_connection.close()


class _FollowsAskToSlotless:
    """``get_node`` for a cluster client and its pipelines: redis-py's ASK path asks by name alone
    (redis/cluster.py), for a node it may not know."""

    slotless: _SlotlessPrimaries

    def get_node(self, host: str | None = None, port: int | None = None, node_name: str | None = None) -> Any:
        node = super().get_node(host, port, node_name)  # type: ignore[misc]
        if node is None and node_name and not host and not port:
            return self.slotless.named(node_name)
        return node


class _Pipeline(_FollowsAskToSlotless, ClusterPipeline):
    pass


class _FailoverWaitingCluster(_FollowsAskToSlotless, RedisCluster):
    """A Redis Cluster client whose commands wait out a shard's failover, and which follows an ASK
    to a primary that serves no slot yet (``_SlotlessPrimaries``).

    redis-py (8.1) retries a command that met a dead primary at once, as many times as its retry
    allows, with no pause: all spent in a moment, long before the replica is promoted
    (``cluster-node-timeout`` plus an election). Here a command that met a connection error or a
    cluster that says it is down is tried again with backoff (0.1 s up to 1 s) for up to
    ``FAILOVER_RETRY_S``, as the Sentinel client does.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.slotless = _SlotlessPrimaries()  # before redis-py's own: a failed start still closes
        super().__init__(*args, **kwargs)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        pipe = super().pipeline(transaction, shard_hint)
        pipe.__class__ = _Pipeline  # redis-py builds the pipeline with its many options; only get_node differs
        pipe.slotless = self.slotless  # type: ignore[attr-defined]
        return pipe

    def close(self) -> None:
        super().close()
        self.slotless.close()

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + FAILOVER_RETRY_S
        pause = 0.1
        while True:
            try:
                return super().execute_command(*args, **kwargs)
            except (RedisConnectionError, RedisTimeoutError, ClusterDownError):
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(1.0, pause * 2)


def make_frontier_client(settings: Settings) -> redis.Redis | RedisCluster:
    """A client of the frontier's Redis: ``VCRAWL_FRONTIER_URL`` (one server, or a Redis Cluster), else
    the Redis of ``VCRAWL_REDIS_URL``.

    A Redis Cluster client follows MOVED and ASK (slots moved to another primary) and, when a
    primary is down, asks the nodes again for the slots' owners until its replica is promoted
    (``cluster-node-timeout`` plus the election): commands are retried for up to ``FAILOVER_RETRY_S``.
    """
    if settings.frontier_url is None or not is_cluster(settings.frontier_url):
        return make_redis_client(settings.frontier_target())
    tls = RedisTls.from_settings(settings)
    extra: dict[str, object] = {"password": settings.redis_password} if settings.redis_password else {}
    if tls.servers:
        extra.update(ssl=True, **tls.server_options())
    nodes = [ClusterNode(host, port) for host, port in parse_cluster(settings.frontier_url)]
    return _FailoverWaitingCluster(
        startup_nodes=nodes,
        decode_responses=True,
        socket_timeout=_COMMAND_TIMEOUT_S,
        socket_connect_timeout=_COMMAND_TIMEOUT_S,
        retry=_failover_retry(),
        **extra,
    )


def probe_redis(settings: Settings, timeout_s: float) -> str | None:
    """Why the Redis of ``settings`` does not answer PING (one try, each socket step within ``timeout_s``); None
    when it does. The client is its own, closed after: a cached client's retries would wait much longer."""
    once = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s, "retry": Retry(NoBackoff(), 0)}
    tls = RedisTls.from_settings(settings)
    try:
        if is_sentinel(settings.redis_url):
            found = parse_sentinels(settings.redis_url)
            sentinel = Sentinel(list(found.sentinels), sentinel_kwargs=sentinel_options(settings, tls))
            client = sentinel.master_for(settings.redis_sentinel_master, db=found.db, **once,
                                         **server_options(settings))  # fmt: skip
        else:
            extra = {"password": settings.redis_password} if settings.redis_password else {}
            client = redis.Redis.from_url(settings.redis_url, **once, **extra, **tls.server_options())
        with client:
            client.ping()
    except (RedisError, OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
