"""Hand back at once the messages that stopped workers took and never acknowledged.

kombu's Redis transport keeps a message a worker has taken in its ``unacked`` hash until the
task is acknowledged (``acks_late``). A worker killed mid-task leaves it there, and kombu only
puts it back once it is older than the visibility timeout (an hour by default). When no worker
runs at all, as when ``vcrawl resume`` restarts a private Redis, every such message is an
orphan, so it can go back to its queue before the new workers start.
"""

from __future__ import annotations

import logging

from celery import Celery

__all__ = ["requeue_unacked"]

logger = logging.getLogger(__name__)

_MAX_MESSAGES = 100_000  # bounds the loop; a private Redis holds a few per worker thread


def requeue_unacked(app: Celery) -> int:
    """Put every unacknowledged message back on its queue; return how many.

    Only call this while no worker consumes from the broker: a running worker's messages
    would run twice.
    """
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        client = channel.client
        tags = client.hkeys(channel.unacked_key)[:_MAX_MESSAGES]
        for tag in tags:
            channel.qos.restore_by_tag(tag, client)
    if tags:
        logger.info("%d unacknowledged message(s) of stopped workers put back on their queues", len(tags))
    return len(tags)
