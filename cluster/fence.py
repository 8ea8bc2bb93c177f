"""Fence the old primary in a Sentinel failover, so that no write lands on a server about to be wiped.

When Sentinel fails over while the old primary is still up (``SENTINEL FAILOVER``, a primary
judged down that was only slow), the old server stays a writable primary until Sentinel notices
it, about ten seconds later, and makes it a replica of the new one. Clients still connected to it
keep writing there all that time, and everything they write is thrown away when it resyncs: tasks
acknowledged, batches released, URLs admitted, all gone (measured: 4303 of 6904 acknowledged
writes in one run of the test cluster). Every vcrawl worker therefore listens to the Sentinels
(like ioredis's ``failoverDetector``) and acts on what they announce:

- ``+try-failover`` (a Sentinel starts a failover) and ``+selected-slave`` (the leading Sentinel
  picked the replica to promote): the old primary stops taking writes at once (``CLIENT PAUSE …
  WRITE``). Writes are held, not refused: a client waits. Sentinel sends the replica ``REPLICAOF NO
  ONE`` one tick of its timer (50-100 ms) after ``+selected-slave`` but two or three after
  ``+try-failover``: a write the old primary takes after the replica is promoted is lost, so the
  pause comes at the first sign, with that margin for a busy worker's listener.
- ``+switch-master`` (the new primary is in place): the old one's clients are dropped (``CLIENT
  KILL TYPE normal|pubsub``), it is made a replica of the new one (``REPLICAOF``) and the pause is
  lifted. The held writes are never run there; their clients reconnect through the Sentinels to the
  new primary and try again. This is what Sentinel itself does ~10 s later, done first, clients
  first: ``REPLICAOF`` ends a blocked ``BRPOP`` with an ``UNBLOCKED`` error, and a Celery worker
  exits on that error (a dropped connection it survives). The new primary is unpaused too.
- ``-failover-abort-*``: the pause is lifted (the old primary stays the primary).

Every step is idempotent, so every worker may do it; a dead old primary (SIGKILL, a lost machine)
simply does not answer. The pause runs out by itself after ``FENCE_MS`` if nothing lifts it.
What fencing cannot cover: a primary cut off from the Sentinels and from vcrawl's workers alike but
not from some client (a network partition); ``min-replicas-to-write`` on the servers is the guard
for that (docs/cluster.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from vcrawl.redis_replies import text

__all__ = ["FENCE_MS", "Address", "FailoverEvent", "SentinelFence", "demote", "pause_writes", "read_event"]

logger = logging.getLogger(__name__)

FENCE_MS = 15_000
"""How long a pause holds if nothing lifts it: a promotion takes well under a second once chosen."""

_CHANNELS = ("+try-failover", "+selected-slave", "+switch-master")
_ABORTS = "-failover-abort-*"
_LISTEN_POLL_S = 1.0  # how often a listener looks whether it should stop
_RECONNECT_S = 1.0  # after a Sentinel stopped answering


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class FailoverEvent:
    """What a Sentinel announced about our primary: the old one, and the new one once known."""

    kind: str  # "trying" | "selected" | "switched" | "aborted"
    old: Address
    new: Address | None = None


def read_event(channel: str, data: str, master_name: str) -> FailoverEvent | None:
    """Decode a Sentinel event about ``master_name`` (None for other primaries and other events).

    >>> read_event("+switch-master", "m 10.0.0.1 6379 10.0.0.2 6380", "m")
    FailoverEvent(kind='switched', old=Address(host='10.0.0.1', port=6379), new=Address(host='10.0.0.2', port=6380))
    >>> read_event("+selected-slave", "slave 10.0.0.2:6380 10.0.0.2 6380 @ m 10.0.0.1 6379", "m").kind
    'selected'
    >>> read_event("+try-failover", "master m 10.0.0.1 6379", "m").kind
    'trying'
    """
    words = data.split()
    try:
        if channel == "+switch-master" and len(words) == 5 and words[0] == master_name:
            return FailoverEvent("switched", Address(words[1], int(words[2])), Address(words[3], int(words[4])))
        if channel == "+selected-slave" and len(words) == 8 and words[4] == "@" and words[5] == master_name:
            return FailoverEvent("selected", Address(words[6], int(words[7])))
        if len(words) == 4 and words[:2] == ["master", master_name]:
            if channel == "+try-failover":
                return FailoverEvent("trying", Address(words[2], int(words[3])))
            if channel.startswith("-failover-abort"):
                return FailoverEvent("aborted", Address(words[2], int(words[3])))
    except ValueError:  # a port that is no number: not an event of ours
        return None
    return None


def pause_writes(client: redis.Redis, fence_ms: int = FENCE_MS) -> bool:
    """Hold every write on the server ``client`` talks to; False when it does not answer."""
    try:
        client.execute_command("CLIENT", "PAUSE", fence_ms, "WRITE")
    except redis.RedisError:
        return False
    return True


def unpause(client: redis.Redis) -> bool:
    try:
        client.execute_command("CLIENT", "UNPAUSE")
    except redis.RedisError:
        return False
    return True


def demote(old: redis.Redis, new: Address, primary_now: Callable[[], Address | None]) -> bool:
    """Drop the old primary's clients, make it a replica of ``new``, lift the pause.

    Only when the Sentinels still name ``new`` (an event read late must not undo a later failover)
    and the old server still says it is a primary. True when it was demoted here.
    """
    if primary_now() != new:
        return False
    try:
        role = old.execute_command("ROLE")
        if not role or text(role[0]) != "master":
            return False  # Sentinel, or another worker, got there first
        # Clients first: REPLICAOF answers a blocked BRPOP with an UNBLOCKED error, which a Celery
        # worker takes for unrecoverable and exits on; a dropped connection it reconnects, through
        # the Sentinels, to ``new``. Held writes die with their clients.
        _drop_clients(old)
        old.execute_command("REPLICAOF", new.host, new.port)
        _drop_clients(old)  # any that connected in between
    except redis.RedisError:
        return False  # gone (SIGKILL, a lost machine): nothing to fence
    finally:
        unpause(old)
    return True


def _drop_clients(server: redis.Redis) -> None:
    server.execute_command("CLIENT", "KILL", "TYPE", "normal")  # not this connection (SKIPME yes)
    server.execute_command("CLIENT", "KILL", "TYPE", "pubsub")


class SentinelFence:
    """Listen to every Sentinel (a thread each) and fence the old primary of ``master_name``.

    ``server_options`` are the keyword arguments for a connection to a Redis server (password,
    TLS), ``sentinel_options`` those for a Sentinel.
    """

    def __init__(
        self,
        sentinels: Sequence[tuple[str, int]],
        master_name: str,
        server_options: dict[str, Any] | None = None,
        sentinel_options: dict[str, Any] | None = None,
        fence_ms: int = FENCE_MS,
    ) -> None:
        self.sentinels = [Address(host, port) for host, port in sentinels]
        self.master_name = master_name
        self.fence_ms = fence_ms
        self._server_options = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0, **(server_options or {})}
        self._sentinel_options = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0, **(sentinel_options or {})}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.fenced: list[tuple[float, FailoverEvent]] = []  # what this process did, for logs and tests

    def start(self) -> SentinelFence:
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._listen, args=(sentinel,), name=f"vcrawl-fence-{sentinel}", daemon=True)
            for sentinel in self.sentinels
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)

    def handle(self, event: FailoverEvent) -> None:
        """Act on one event (every listener calls this; the steps are idempotent)."""
        pausing = event.kind in ("trying", "selected")
        if pausing and self.primary_now() != event.old:
            return  # an event about a server that is no longer the primary: leave it alone
        with redis.Redis(host=event.old.host, port=event.old.port, **self._server_options) as old:
            if pausing:
                done = pause_writes(old, self.fence_ms)
            elif event.kind == "switched" and event.new is not None:
                pause_writes(old, self.fence_ms)  # an event missed, or a listener that just connected
                done = demote(old, event.new, self.primary_now)
            elif not self.failover_running():  # a Sentinel that lost the election may abort mid-failover
                done = unpause(old)
            else:
                done = False
        if event.new is not None:  # the new primary takes writes, whatever paused it before
            with redis.Redis(host=event.new.host, port=event.new.port, **self._server_options) as new:
                unpause(new)
        if done:
            with self._lock:
                self.fenced.append((time.time(), event))
            done_what = {"switched": f"made a replica of {event.new}", "aborted": "unpaused"}
            logger.warning("Sentinel failover of %s: old primary %s %s (%s)", self.master_name, event.old,
                           done_what.get(event.kind, "paused for writes"), event.kind)  # fmt: skip

    def primary_now(self) -> Address | None:
        """The primary the first Sentinel that answers names."""
        for sentinel in self.sentinels:
            try:
                with redis.Redis(host=sentinel.host, port=sentinel.port, **self._sentinel_options) as client:
                    reply = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
            except redis.RedisError:
                continue
            if reply:
                host, port = map(text, reply)
                return Address(host, int(port))
        return None

    def failover_running(self) -> bool:
        """True when a Sentinel that answers runs a failover of our primary (its ``failover_in_progress`` flag)."""
        for sentinel in self.sentinels:
            try:
                with redis.Redis(host=sentinel.host, port=sentinel.port, **self._sentinel_options) as client:
                    state = client.sentinel_master(self.master_name)  # redis-py parses it into a dict
            except redis.RedisError:
                continue
            if "failover_in_progress" in text(state.get("flags", "")).split(","):
                return True
        return False

    def _listen(self, sentinel: Address) -> None:
        while not self._stop.is_set():
            try:
                with redis.Redis(host=sentinel.host, port=sentinel.port, decode_responses=True,
                                 **{**self._sentinel_options, "socket_timeout": None}) as client:  # fmt: skip
                    pubsub = client.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(*_CHANNELS)
                    pubsub.psubscribe(_ABORTS)
                    while not self._stop.is_set():
                        message = pubsub.get_message(timeout=_LISTEN_POLL_S)
                        if message is None:
                            continue
                        event = read_event(str(message["channel"]), str(message["data"]), self.master_name)
                        if event is not None:
                            self.handle(event)
                    pubsub.close()
            except (redis.RedisError, OSError):
                self._stop.wait(_RECONNECT_S)  # this Sentinel is away; the others still listen
