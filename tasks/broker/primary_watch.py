"""After a failover (or a restart) of Redis: the messages taken before it and held by nobody go back.

A worker that took a message from the old primary notes it in kombu's ``unacked`` hash, and the
replica Sentinel promotes has that note. The worker's connection broke with the old primary,
though: its acknowledgement cannot reach the new one ("Couldn't ack ... ConnectionError"), and
messages it had taken but not started are dropped from its memory when its consumer restarts.
Such a note is an orphan: nothing will acknowledge it, and kombu puts it back only after the
visibility timeout (an hour). Its batch's URLs wait for their lease to run out (minutes).

So every worker watches the primary's identity (``run_id``, which a promoted replica or a
restarted server does not share with the server before it). One worker at a time notes
``run_id`` and the time every second. The first look that finds another ``run_id`` notes the
change and every member's last word on what it holds (``tasks.broker.holdings``); those words came from
the old server and may lack a message taken a moment before it went, which its worker still runs.
Once every live member has said again what it holds (it does with every heartbeat, two seconds
apart), every unacknowledged message taken before the last note on the old server (plus a second)
that no member holds goes back on its queue. A message a worker still runs is left to it: it is
acknowledged on the new connection, or, if that fails, put back by the sweep once it is done,
where it finds its batch released. Put back while it still ran, a fetch would run twice at once,
two requests to one host within its interval.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection
from typing import Any

from celery import Celery

from cluster.holdings import claims_said_since
from cluster.periodic import Periodic
from tasks import deps
from tasks.broker.holdings import BrokerHoldings
from vcrawl import redis_keys
from vcrawl.redis_replies import text

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


def look_at_primary(app: Celery, now: float | None = None) -> int:
    """One look (by one worker at a time): note the primary; after a change, once every live member
    has said again what it holds, put back what was taken from the server before and is held by
    nobody. Returns how many messages went back."""
    client = deps.redis_client()
    if not client.set(redis_keys.primary_watch_lock(), "1", nx=True, px=int(LOOK_EVERY_S * 900)):
        return 0  # another worker looked a moment ago
    now = time.time() if now is None else now
    run_id = str(client.info("server")["run_id"])
    noted: dict[str, Any] = client.hgetall(redis_keys.primary_watch())
    holdings = BrokerHoldings(app)
    look = {"run_id": run_id, "seen_at": repr(now)}
    if noted and noted.get("run_id") != run_id:
        # A change while one is still pending keeps the older messages in: the later cutoff covers them.
        cutoff = max(float(noted.get("seen_at") or 0) + _MARGIN_S, float(noted.get("cutoff") or 0))
        words = {name: holder.at_ms for name, holder in holdings.holders().items()}
        look |= {"cutoff": repr(cutoff), "words": json.dumps(words)}
        logger.warning("Redis primary changed (run_id %s -> %s): messages taken from the old one and held by no "
                       "worker go back once every live worker has said what it holds", noted.get("run_id"),
                       run_id)  # fmt: skip
    client.hset(redis_keys.primary_watch(), mapping=look)
    pending = look if "cutoff" in look else noted
    if not pending.get("cutoff"):
        return 0
    claims = claims_said_since(holdings.holders(), deps.node_registry().membership(), json.loads(pending["words"]))
    if claims is None:
        return 0  # a live worker has not said since the change what it holds: ask again next look
    requeued = requeue_taken_before(app, float(pending["cutoff"]), keep=claims)
    client.hdel(redis_keys.primary_watch(), "cutoff", "words")
    logger.warning("after the Redis primary changed, %d message(s) taken from the old one and held by no worker "
                   "put back", requeued)  # fmt: skip
    return requeued


def primary_watch(app: Celery) -> Periodic:
    """A worker's thread that calls ``look_at_primary`` every ``LOOK_EVERY_S``."""
    return Periodic("vcrawl-primary-watch", LOOK_EVERY_S, lambda: look_at_primary(app))
