"""vcrawl's queues on RabbitMQ (``VCRAWL_BROKER_URL=amqp://...``): how many messages wait, and a dead ring
node's queue moved onto the shared one.

On RabbitMQ none of the Redis broker's keepers is needed (``tasks.broker.holdings``, ``primary_watch``,
``lost_fetches``, ``lost_analyses``, the batch-analysis watchdog): the broker itself hands a consumer's
unacknowledged messages back the moment its connection closes, and a message is never off its queue
and unnoted, as kombu's Redis transport leaves one between its BRPOP and its ``unacked`` note.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from amqp.exceptions import NotFound
from celery import Celery

from celeryconfig import ANALYSIS_QUEUE, DOWNLOAD_QUEUE, DYNAMIC_QUEUE

__all__ = ["amqp_move_queue", "amqp_queue_lengths"]

logger = logging.getLogger(__name__)


_QUEUES = (DOWNLOAD_QUEUE, DYNAMIC_QUEUE, ANALYSIS_QUEUE)


def amqp_queue_lengths(app: Celery, names: Iterable[str] = _QUEUES) -> dict[str, int]:
    """Messages ready on each queue (not those delivered and unacknowledged); 0 for a queue not declared yet."""
    counts: dict[str, int] = {}
    with app.connection_for_read() as connection:
        for name in names:
            channel = connection.channel()
            try:  # a passive declare of a missing queue closes its channel: one channel per queue
                counts[name] = int(channel.queue_declare(name, passive=True).message_count)
            except NotFound:
                counts[name] = 0
            finally:
                _close_quietly(channel)
    return counts


def amqp_move_queue(app: Celery, source: str, target: str, limit: int = 100_000) -> int:
    """Move the messages ready on queue ``source`` to queue ``target``, oldest first, with their properties
    (priority, headers); return how many (at most ``limit``).

    Each is published to ``target`` and confirmed by the broker before it is acknowledged on ``source``:
    a move cut short leaves a message on both queues, never on neither (a task run twice is harmless,
    as with any redelivery; a lost one is not).
    """
    moved = 0
    with app.connection_for_write() as connection:
        channel = connection.channel()  # confirm_publish (broker_transport_options): basic_publish waits
        try:
            while moved < limit:
                message = channel.basic_get(source, no_ack=False)
                if message is None:
                    break
                channel.basic_publish(message, exchange="", routing_key=target)
                channel.basic_ack(message.delivery_tag)
                moved += 1
        except NotFound:  # the node never declared its queue: nothing of it waits
            return moved
        finally:
            _close_quietly(channel)
    if moved:
        logger.info("%d message(s) moved from queue %s to %s", moved, source, target)
    return moved


def _close_quietly(channel: Any) -> None:
    try:
        channel.close()
    except Exception:  # already closed by the broker (a passive declare that failed)
        pass
