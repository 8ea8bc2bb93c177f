"""Three patches of kombu: a guard around the Redis transport's QoS calls while the broker
connection is torn down, a client reused per channel instead of one built per call, and the
reconnection pace of ``broker_transport_options`` honoured by every reconnection.

When Redis goes away, the consumer resets its connection while pool threads are still
finishing tasks, and while it closes the channel it restores the unacked messages. Such a
call then fails inside kombu with an AttributeError (``self.connection.client`` is None in
``Channel._connparams``) instead of a connection error, and Celery treats it as an
unrecoverable error: the worker exits where it would otherwise reconnect (seen in
``tests/faults``). Turned into a connection error, the failure is logged or ignored as
Celery does for connection errors, and the worker reconnects. The messages stay unacked in
Redis and come back after the visibility timeout; vcrawl's tasks are idempotent on
redelivery (leases, admission tokens).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["guard_redis_qos", "reconnect_at_transport_pace", "reuse_redis_clients"]

_PACE = ("interval_start", "interval_step", "interval_max")

_GUARDED = ("ack", "reject", "restore_unacked")


def guard_redis_qos() -> None:
    """Install the guard once per process (idempotent)."""
    from kombu.transport import redis as transport

    for name in _GUARDED:
        method = getattr(transport.QoS, name)
        if not getattr(method, "_vcrawl_guard", False):
            setattr(transport.QoS, name, _guarded(method))


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    from redis.exceptions import ConnectionError as RedisConnectionError

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except AttributeError as exc:
            if getattr(self.channel.connection, "client", None) is not None:
                raise  # not a torn-down connection: a real bug, let it show
            raise RedisConnectionError(f"broker connection closed during {method.__name__}") from exc

    call._vcrawl_guard = True  # type: ignore[attr-defined]
    return call


def reuse_redis_clients() -> None:
    """Let each kombu Redis channel reuse one client over its connection pool (idempotent).

    kombu builds a new ``redis.Redis`` for every publish and every ack (``_create_client``), and
    redis-py 8 fills ~400 response callbacks in each: 150 us here, several times per task, about
    a tenth of a worker's CPU samples when every page is a task (polite crawls). A client holds
    no connection of its own (each command takes one from the pool), so one per channel serves
    every thread; a channel whose pool is replaced (a reconnect) gets a new one.
    """
    from kombu.transport import redis as transport

    create = transport.Channel._create_client
    if getattr(create, "_vcrawl_reuse", False):
        return

    @functools.wraps(create)
    def reused(self: Any, asynchronous: bool = False) -> Any:
        if asynchronous:
            return create(self, asynchronous=True)
        pool = self.pool
        cached = self.__dict__.get("_vcrawl_client")
        if cached is None or cached.connection_pool is not pool:
            cached = create(self)
            self._vcrawl_client = cached
        return cached

    reused._vcrawl_reuse = True  # type: ignore[attr-defined]
    transport.Channel._create_client = reused


def reconnect_at_transport_pace() -> None:
    """Let ``Connection.ensure_connection`` take its pace from the transport options (idempotent).

    kombu reads ``interval_start/step/max`` from ``broker_transport_options`` when a producer
    connects, but a worker's consumer reconnects through ``ensure_connection`` with kombu's
    defaults (2 s, +2 s, up to 30 s): after a Sentinel failover the workers came back up to
    30 s after the promotion (6 s after a 3.3 s one in the fault tests), and Flower, which asks
    them, with them. Options passed explicitly still win.
    """
    from kombu import connection as kombu_connection

    ensure = kombu_connection.Connection.ensure_connection
    if getattr(ensure, "_vcrawl_pace", False):
        return

    @functools.wraps(ensure)
    def paced(self: Any, *args: Any, **kwargs: Any) -> Any:
        options = self.transport_options or {}
        for name in _PACE:
            if name in options:
                kwargs.setdefault(name, options[name])
        return ensure(self, *args, **kwargs)

    paced._vcrawl_pace = True  # type: ignore[attr-defined]
    kombu_connection.Connection.ensure_connection = paced
