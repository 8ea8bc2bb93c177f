"""Analyses of released fetch batches whose message was lost: found and sent again.

kombu's Redis transport takes a message off its queue (BRPOP) before it notes it as
unacknowledged; a worker killed between the two loses the message for good, and the visibility
timeout cannot bring back what was never noted. For a fetch batch that is harmless (its lease runs
out and its URLs are queued again), but a lost analysis left its batch's URLs pending for ever: the
job never completed. What a released batch hands to its analysis stays in the job's ``released``
hash until that analysis admits it, and every analysis message carries a task id made of the job
and the batch (``analysis_task_id``). So a watchdog (one worker at a time) checks each batch
released a while ago: if no message of its analysis waits on the analysis queue or is
unacknowledged, it sends one. A message that was only late costs a repeat analysis, which admits
nothing twice (``engine.jobs.admit_links``).
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from celeryconfig import ANALYSIS_QUEUE, queue_lists
from engine.analyze_batch import analysis_task_id
from engine.fetch_batch import BUNDLE_SEPARATOR
from frontier import Frontier
from tasks import deps
from tasks.batches import send_analysis
from vcrawl import redis_keys
from vcrawl.redis_replies import text

__all__ = ["FIRST_LOOK_S", "analysis_ids_present", "analysis_task_id", "ids_present", "watch_analyses", "with_joined"]

logger = logging.getLogger(__name__)

FIRST_LOOK_S = 10.0  # a batch released this long ago with no analysis message anywhere: lost
LONGEST_LOOK_S = 300.0  # a batch whose analysis waits its turn is looked at again less and less often
_UNACKED = "unacked"  # kombu's Redis transport: delivery tag -> message, until acknowledged
# A message's own id in its headers (kombu writes JSON with ", " and ": "), not a child's parent_id.
_ID_PATTERN = re.compile(r'"id": "(vcrawl-analysis:[^"]+)"')


def ids_present(client: Any, lists: list[str], pattern: re.Pattern[str]) -> set[str]:
    """The task ids ``pattern`` finds in every message on ``lists`` or unacknowledged.

    One pass over the lists and kombu's unacked hash, read in slices. Payloads come as str from
    vcrawl's client (it decodes replies) or as bytes from a raw one: both are read.
    """
    found: set[str] = set()
    for key in lists:
        for start in range(0, client.llen(key), 1000):
            for payload in client.lrange(key, start, start + 999):
                found.update(pattern.findall(text(payload)))
    cursor = 0
    while True:
        cursor, entries = client.hscan(_UNACKED, cursor, count=1000)
        for payload in entries.values():
            found.update(pattern.findall(text(payload)))
        if not cursor:
            return found


def with_joined(found: set[str]) -> set[str]:
    """``found``, and the id of each batch a task id joins (``BUNDLE_SEPARATOR``: a bundle's fetch,
    gathered batches' analysis): each of them is present."""
    joined = set()
    for task_id in found:
        head, _, batch_ids = task_id.rpartition(":")
        if BUNDLE_SEPARATOR in batch_ids:
            joined.update(f"{head}:{batch_id}" for batch_id in batch_ids.split(BUNDLE_SEPARATOR))
    return found | joined


def analysis_ids_present(client: Any) -> set[str]:
    """The analysis task ids of every message on the analysis queue (any priority) or unacknowledged."""
    return with_joined(ids_present(client, queue_lists(ANALYSIS_QUEUE), _ID_PATTERN))


def watch_analyses(now: float | None = None, lock_s: float = 5.0) -> int:
    """One look at every running job's released batches (one worker at a time); return how many
    analyses were sent again."""
    client = deps.redis_client()
    if not client.set(redis_keys.lost_analyses_lock(), "1", nx=True, px=int(lock_s * 1000)):
        return 0  # another worker looked a moment ago
    now = time.time() if now is None else now
    watched = redis_keys.lost_analyses_watch()
    looks = {text(field): json.loads(value) for field, value in client.hgetall(watched).items()}
    keep: dict[str, dict[str, float]] = {}
    due: list[tuple[str, str]] = []
    frontier = deps.frontier()  # the released batches are the frontier's; the queues and the watch, the broker's
    for job_id in frontier.jobs.running_jobs():
        for batch_id in frontier.queue.released_batches(job_id):
            field = f"{job_id} {batch_id}"
            look = looks.get(field) or {"at": now + FIRST_LOOK_S, "every": FIRST_LOOK_S}
            keep[field] = look
            if look["at"] <= now:
                due.append((job_id, batch_id))
    sent = 0
    if due:
        present = analysis_ids_present(client)
        for job_id, batch_id in due:
            field = f"{job_id} {batch_id}"
            if analysis_task_id(job_id, batch_id) in present:  # waiting its turn: look again later
                every = min(LONGEST_LOOK_S, keep[field]["every"] * 2)
                keep[field] = {"at": now + every, "every": every}
                continue
            sent += _send_again(frontier, job_id, batch_id)
            keep[field] = {"at": now + FIRST_LOOK_S, "every": FIRST_LOOK_S}
    gone = [field for field in looks if field not in keep]
    pipe = client.pipeline(transaction=False)
    if gone:
        pipe.hdel(watched, *gone)
    if keep:
        pipe.hset(watched, mapping={field: json.dumps(look) for field, look in keep.items()})
    pipe.execute()
    return sent


def _send_again(frontier: Frontier, job_id: str, batch_id: str) -> int:
    handed = frontier.queue.handed_on(job_id, batch_id)
    if handed is None:  # analysed meanwhile
        return 0
    send_analysis(handed)
    logger.warning("job %s: the analysis message of batch %s was lost; sent again", job_id, batch_id)
    return 1
