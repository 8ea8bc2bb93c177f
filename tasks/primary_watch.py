"""After a failover (or a restart) of Redis: the messages taken before it go back on their queues at once.

A worker that took a message from the old primary notes it in kombu's ``unacked`` hash, and the
replica Sentinel promotes has that note. The worker's connection broke with the old primary,
though: its acknowledgement cannot reach the new one ("Couldn't ack ... ConnectionError"), and
messages it had taken but not started are dropped from its memory when its consumer restarts.
Such a note is an orphan: nothing will acknowledge it, and kombu puts it back only after the
visibility timeout (an hour). Its batch's URLs wait for their lease to run out (minutes).

So every worker watches the primary's identity (``run_id``, which a promoted replica or a
restarted server does not share with the server before it). One worker at a time notes
``run_id`` and the time every second; the first look that finds another ``run_id`` puts back
every unacknowledged message taken before the last note made on the old server (plus a second):
those were taken from it. A message taken after the failover, by a worker already reconnected, is
younger and left alone, and so is one a live worker said it holds (``tasks.holdings``): it runs
on and is acknowledged on the new connection. One that was only slow runs again, which vcrawl's
tasks allow (an admission runs once, a stale lease fetches nothing).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import Any

from celery import Celery

from engine.periodic import Periodic
from frontier.scripts import text
from tasks import deps
from tasks.holdings import BrokerHoldings
from vcrawl import redis_keys

__all__ = ["LOOK_EVERY_S", "look_at_primary", "primary_watch", "requeue_taken_before"]

logger = logging.getLogger(__name__)

LOOK_EVERY_S = 1.0
_MARGIN_S = 1.0  # a note is at most this old when the old server goes (notes come every second)
_MAX_MESSAGES = 100_000


def requeue_taken_before(app: Celery, cutoff_s: float, keep: Collection[str] = ()) -> int:
    """Put back on their queues the unacknowledged messages taken before ``cutoff_s`` (epoch seconds),
    but those in ``keep`` (their workers said they still hold them)."""
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        client = channel.client
        tags = client.zrangebyscore(channel.unacked_index_key, "-inf", cutoff_s, start=0, num=_MAX_MESSAGES)
        tags = [tag for tag in tags if text(tag) not in keep]
        for tag in tags:
            channel.qos.restore_by_tag(tag, client)
    return len(tags)


def claimed_by_members(app: Celery) -> set[str]:
    """Delivery tags the members not declared down said they hold: a worker that still runs one
    acknowledges it on its new connection; one whose acknowledgement fails leaves it to the sweep."""
    down = set(deps.node_registry().down_records())
    return {tag for name, holder in BrokerHoldings(app).holders().items() if name not in down for tag in holder.tags}


def look_at_primary(app: Celery, now: float | None = None) -> int:
    """One look (by one worker at a time): note the primary; after a change, requeue what was taken
    from the server before. Returns how many messages went back."""
    client = deps.redis_client()
    if not client.set(redis_keys.primary_watch_lock(), "1", nx=True, px=int(LOOK_EVERY_S * 900)):
        return 0  # another worker looked a moment ago
    now = time.time() if now is None else now
    run_id = str(client.info("server")["run_id"])
    noted: dict[str, Any] = client.hgetall(redis_keys.primary_watch())
    client.hset(redis_keys.primary_watch(), mapping={"run_id": run_id, "seen_at": repr(now)})
    if not noted or noted.get("run_id") == run_id:
        return 0
    cutoff = float(noted.get("seen_at") or 0) + _MARGIN_S
    requeued = requeue_taken_before(app, cutoff, keep=claimed_by_members(app))
    logger.warning("Redis primary changed (run_id %s -> %s): %d message(s) taken from the old one put back",
                   noted.get("run_id"), run_id, requeued)  # fmt: skip
    return requeued


def primary_watch(app: Celery) -> Periodic:
    """A worker's thread that calls ``look_at_primary`` every ``LOOK_EVERY_S``."""
    return Periodic("vcrawl-primary-watch", LOOK_EVERY_S, lambda: look_at_primary(app))
