"""A worker process's copy of its jobs' origin holds, kept current by the hold channel (Redis pub/sub).

A host that answers 429/503 with ``Retry-After`` (or an API whose rate limit is spent) asked for no
request for a while. The batch that got the answer holds the host in the frontier
(``FrontierQueue.hold_host``: nothing of it is leased or started until then) and the script tells
every worker process on the hold channel. Each process notes the holds it hears of here; a batch
already fetching the host looks here before each request (a dictionary lookup, no Redis call) and
hands the rest of its URLs back. The process whose batch got the answer notes it at once, before
it tells the others.

A hold announced while a process's subscription is down (a Redis restart, a failover) is not heard
by it: its batches already fetching may go on until they end, but no batch of the host starts
anywhere during the hold (``start_lease.lua``) and none is leased.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from vcrawl import redis_keys
from vcrawl.redis_replies import text

__all__ = ["OriginHolds"]

logger = logging.getLogger(__name__)

_LISTEN_S = 0.5  # one wait on the subscription: a stop is noticed within it
_SUBSCRIBED_WITHIN_S = 2.0  # start() waits this long at most for Redis to confirm the subscription
_RETRY_MOST_S = 5.0  # a lost subscription is tried again after 0.5 s, doubling up to this


class OriginHolds:
    """(job, host) -> when its hold ends (``clock``), for this process: noted by its own batches, and
    by a thread listening to every other process's announcements."""

    def __init__(self, client: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._clock = clock
        self._lock = threading.Lock()
        self._until: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def left_s(self, job_id: str, host: str) -> float:
        """Seconds left of the hold of ``host`` in ``job_id``; 0 when it is not held."""
        until = self._until.get((job_id, host))
        return 0.0 if until is None else max(0.0, until - self._clock())

    def note(self, job_id: str, host: str, hold_s: float) -> None:
        """Hold ``host`` of ``job_id`` for ``hold_s`` from now, in this process (a longer hold stays)."""
        now = self._clock()
        with self._lock:
            for key in [key for key, until in self._until.items() if until <= now]:
                del self._until[key]
            self._until[(job_id, host)] = max(self._until.get((job_id, host), 0.0), now + hold_s)

    def start(self) -> OriginHolds:
        """Subscribe to the hold channel and listen in a daemon thread (once while running).

        The subscription is confirmed before this returns when Redis answers within 2 s, so a batch
        that starts afterwards hears every hold announced after its start.
        """
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._stop.clear()
            try:
                pubsub = self._subscribe()
            except (redis.RedisError, OSError) as exc:  # the thread tries again
                logger.warning("origin holds: could not subscribe yet: %r", exc)
                pubsub = None
            self._thread = threading.Thread(target=self._run, args=(pubsub,), name="vcrawl-holds", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop listening."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread() and timeout_s > 0:
            thread.join(timeout_s)

    def _subscribe(self) -> Any:
        pubsub = self._client.pubsub()
        try:
            pubsub.subscribe(redis_keys.holds_channel())
            deadline = time.monotonic() + _SUBSCRIBED_WITHIN_S
            while time.monotonic() < deadline:  # the confirmation comes first on the connection
                message = pubsub.get_message(timeout=deadline - time.monotonic())
                if message is not None:
                    self._take(message)
                    if message.get("type") == "subscribe":
                        break
        except BaseException:
            _close(pubsub)
            raise
        return pubsub

    def _run(self, pubsub: Any) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if pubsub is None:
                    pubsub = self._subscribe()
                    logger.info("origin holds: subscribed again")
                self._take(pubsub.get_message(timeout=_LISTEN_S))
                failures = 0
            except (redis.RedisError, OSError) as exc:  # a Redis restart or failover: subscribe again
                log = logger.warning if failures == 0 else logger.debug
                log("origin holds: subscription lost (%r); holds announced meanwhile are not heard here", exc)
                _close(pubsub)
                pubsub = None
                self._stop.wait(min(_RETRY_MOST_S, 0.5 * 2**failures))
                failures += 1
        _close(pubsub)

    def _take(self, message: Any) -> None:
        """Note the hold an announcement carries (other messages are ignored)."""
        if not message or message.get("type") != "message":
            return
        try:
            hold = json.loads(text(message["data"]))
            job_id, host, hold_ms = str(hold["job"]), str(hold["host"]), float(hold["ms"])
        except (ValueError, KeyError, TypeError):
            logger.warning("origin holds: unreadable announcement %r", message)
            return
        self.note(job_id, host, hold_ms / 1000)
        logger.debug("origin holds: %s of job %s held for %.1f s", host, job_id, hold_ms / 1000)


def _close(pubsub: Any) -> None:
    if pubsub is not None:
        try:
            pubsub.close()
        except (redis.RedisError, OSError):  # a broken connection is dropped either way
            logger.debug("closing the hold subscription failed", exc_info=True)
