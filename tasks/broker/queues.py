"""How many messages wait on each of vcrawl's queues in the broker (for the API and dashboard)."""

from __future__ import annotations

from typing import Any

from celeryconfig import ANALYSIS_QUEUE, DOWNLOAD_QUEUE, DYNAMIC_QUEUE, queue_lists

__all__ = ["move_queue", "queue_lengths"]


def queue_lengths(client: Any) -> dict[str, int]:
    """Messages waiting per queue (all priority steps), read with one pipeline over ``client``."""
    pipe = client.pipeline(transaction=False)
    names = (DOWNLOAD_QUEUE, DYNAMIC_QUEUE, ANALYSIS_QUEUE)
    for name in names:
        for key in queue_lists(name):
            pipe.llen(key)
    counts = pipe.execute()
    steps = len(queue_lists(DOWNLOAD_QUEUE))
    return {name: sum(counts[i * steps : (i + 1) * steps]) for i, name in enumerate(names)}


def move_queue(client: Any, source: str, target: str, limit: int = 100_000) -> int:
    """Move the messages waiting on queue ``source`` to queue ``target``, oldest first, each to the
    same priority step, to be taken next; return how many (at most ``limit``)."""
    moved = 0
    for source_list, target_list in zip(queue_lists(source), queue_lists(target), strict=True):
        # kombu publishes with LPUSH and consumes from the right. Newest first onto the target's right
        # end: the oldest ends up rightmost, taken first, and all of them before the target's own.
        while moved < limit and client.lmove(source_list, target_list, "LEFT", "RIGHT") is not None:
            moved += 1
    return moved
