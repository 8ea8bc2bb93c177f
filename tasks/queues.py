"""How many messages wait on each of vcrawl's queues in the broker (for the API and dashboard)."""

from __future__ import annotations

from typing import Any

from celeryconfig import ANALYSIS_QUEUE, DOWNLOAD_QUEUE, DYNAMIC_QUEUE, queue_lists

__all__ = ["purge_queue", "queue_lengths"]


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


def purge_queue(client: Any, name: str) -> int:
    """Drop every message waiting on queue ``name`` (all priority steps); return how many."""
    pipe = client.pipeline(transaction=True)
    for key in queue_lists(name):
        pipe.llen(key)
    for key in queue_lists(name):
        pipe.delete(key)
    counts = pipe.execute()
    return sum(counts[: len(queue_lists(name))])
