"""Who holds which broker message: no unacknowledged message stays without a live worker behind it.

kombu's Redis transport notes every message a worker takes in its ``unacked`` hash (and the time
in ``unacked_index``) until the task acknowledges it (``acks_late``). A note nobody will ever
acknowledge looks exactly like a live worker's: a worker SIGKILLed, an acknowledgement lost with
the connection in a Redis restart, a message delivered on a connection that then dropped. kombu
puts such a note back only after the visibility timeout (an hour by default).

So every worker, with each heartbeat of the membership (``cluster.membership.RingKeeper``), writes the
delivery tags it holds, on the Redis clock, in ``vcrawl:holders``: those its task consumer's
channel has not acknowledged yet, and those of every request it still has in memory (a request
taken before a reconnection runs on, and would be acknowledged, on the new connection's QoS it is
not part of). Then

* **the sweep** (one worker at a time, under a lock, with each heartbeat) puts back on its queue
  every unacknowledged message older than ``GRACE_S`` that no member claims, once every live member
  has written its holdings after the message was taken: if one of them held it, it said so;
* **a dead member's** messages go back at once when it is declared down (``NodeWatcher``), since
  they are claimed by nobody alive any more;
* **a worker restarted under its old name** puts back what its dead predecessor held before it
  consumes much (``reclaim_own``).

A message put back runs again: vcrawl's tasks are idempotent (a fetch whose lease is gone fetches
nothing, an admission runs once per batch, a record part is named by its batch).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Collection
from typing import Any

from celery import Celery
from celery.worker import state as worker_state

from cluster.holdings import GRACE_S, HeldMessage, Holder, held_fetch_batches, orphans
from cluster.members import Membership
from tasks import deps
from vcrawl import redis_keys
from vcrawl.redis_replies import text

__all__ = ["BrokerHoldings"]

logger = logging.getLogger(__name__)

_MAX_MESSAGES = 100_000  # bounds one sweep; a broker holds a few per worker thread


class BrokerHoldings:
    """This worker's holdings in Redis, the sweep, and the hand-back of a dead member's messages."""

    def __init__(self, app: Celery, consumer: Any = None, client: Callable[[], Any] | None = None) -> None:
        self._app = app
        self._consumer = consumer  # Celery's Consumer of this worker (None: a process that only sweeps)
        self._client = client or deps.redis_client  # the broker's Redis: vcrawl uses one for both
        options = app.conf.broker_transport_options or {}
        self.unacked_key = str(options.get("unacked_key", "unacked"))
        self.unacked_index_key = str(options.get("unacked_index_key", "unacked_index"))

    # -- what this worker holds -------------------------------------------------------------

    def held_tags(self) -> set[str]:
        """Delivery tags this worker has taken and not acknowledged, and those of its requests."""
        tags: set[str] = set()
        task_consumer = getattr(self._consumer, "task_consumer", None)
        qos = getattr(getattr(task_consumer, "channel", None), "qos", None)
        if qos is not None:
            dirty = set(getattr(qos, "_dirty", ()))
            tags |= {text(tag) for tag in list(getattr(qos, "_delivered", {})) if tag not in dirty}
        requests = [*worker_state.requests.values(), *worker_state.active_requests, *worker_state.reserved_requests]
        for request in requests:
            tag = getattr(getattr(request, "message", None), "delivery_tag", None)
            if tag is not None:
                tags.add(text(tag))
        return tags

    def report(self, name: str, at_ms: int) -> None:
        """Say what this worker holds as of ``at_ms`` (the heartbeat just written, Redis clock)."""
        holder = Holder(name, at_ms, frozenset(self.held_tags()), os.getpid(), socket.gethostname())
        self._client().hset(redis_keys.HOLDERS, name, holder.to_json())

    # -- what everybody holds ---------------------------------------------------------------

    def holders(self) -> dict[str, Holder]:
        raw = self._client().hgetall(redis_keys.HOLDERS)
        found = {}
        for name, value in raw.items():
            try:
                found[text(name)] = Holder.from_json(text(name), value)
            except (ValueError, TypeError):
                continue  # written by a version this one cannot read: it claims nothing here
        return found

    def held_counts(self) -> dict[str, int]:
        """Member name -> messages it holds that are still unacknowledged (for ``vcrawl nodes``)."""
        client = self._client()
        pending = {text(tag) for tag in client.hkeys(self.unacked_key)}
        return {name: len(holder.tags & pending) for name, holder in self.holders().items()}

    def held_by(self, name: str) -> list[HeldMessage]:
        """The unacknowledged messages member ``name`` said it holds."""
        holder = self.holders().get(name)
        if holder is None or not holder.tags:
            return []
        return self.messages(sorted(holder.tags))

    def messages(self, tags: Collection[str]) -> list[HeldMessage]:
        """The unacknowledged messages among ``tags`` (gone ones left out)."""
        if not tags:
            return []
        raw = self._client().hmget(self.unacked_key, list(tags))
        found = []
        for tag, payload in zip(tags, raw, strict=True):
            if payload is None:
                continue
            try:
                message, _exchange, routing_key = json.loads(payload)
                task_id = str((message.get("headers") or {}).get("id") or "")
            except (ValueError, TypeError, AttributeError):
                task_id, routing_key = "", ""
            found.append(HeldMessage(tag, task_id, str(routing_key or "")))
        return found

    def forget(self, name: str) -> None:
        self._client().hdel(redis_keys.HOLDERS, name)

    # -- putting back -----------------------------------------------------------------------

    def restore(self, tags: Collection[str]) -> int:
        """Put the unacknowledged messages ``tags`` back on their queues (kombu's own restore); return how many."""
        if not tags:
            return 0
        restored = 0
        with self._app.connection_for_write() as connection:
            channel = connection.default_channel
            client = channel.client
            for tag in list(tags)[:_MAX_MESSAGES]:
                if client.hexists(self.unacked_key, tag):
                    channel.qos.restore_by_tag(tag, client)
                    restored += 1
        return restored

    def orphans(self, membership: Membership, lock_s: float = 5.0) -> list[HeldMessage]:
        """The unacknowledged messages nobody holds, for one worker at a time (else [])."""
        client = self._client()
        if not client.set(redis_keys.HOLDINGS_SWEEP_LOCK, "1", nx=True, px=int(lock_s * 1000)):
            return []  # another worker swept a moment ago
        cutoff = membership.now_ms / 1000 - GRACE_S
        old = client.zrangebyscore(self.unacked_index_key, "-inf", cutoff, start=0, num=_MAX_MESSAGES,
                                   withscores=True)  # fmt: skip
        if not old:
            return []
        delivered = {text(tag): float(score) for tag, score in old}
        return self.messages(orphans(delivered, self.holders(), membership))

    def reclaim_own(self, name: str, hand_back: Callable[[dict[str, list[str]]], int] | None = None) -> int:
        """At start: put back what a dead worker of the same name on this machine still held.

        The leases of its fetch batches are handed back first (``hand_back``): a batch's message put
        back then finds its lease gone, and its URLs wait in the queue, not for the lease to run out.
        """
        holder = self.holders().get(name)
        if holder is None or holder.pid == os.getpid() or holder.machine != socket.gethostname():
            return 0
        if _pid_alive(holder.pid):
            return 0  # another live worker under the same name: not ours to take
        if hand_back is not None:
            hand_back(held_fetch_batches(self.messages(sorted(holder.tags))))
        restored = self.restore(sorted(holder.tags))
        self.forget(name)
        if restored:
            logger.warning("worker %s restarted: %d message(s) its previous process (pid %d) held put back",
                           name, restored, holder.pid)  # fmt: skip
        return restored


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
