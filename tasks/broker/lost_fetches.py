"""Leased fetch batches whose message was lost: their URLs handed back at once, not after the lease.

The pump leases a batch in Redis, then publishes its fetch message. A message can be lost on the
way to a worker: kombu takes it off its queue before it notes it as unacknowledged (a worker
SIGKILLed in between), or a Redis failover promotes a replica that has the lease but not the
message, or its worker's connection broke with the old primary. The lease then holds its host
busy and its URLs out of the queue until it runs out (the job's lease time: minutes). Every fetch
message carries a task id made of the job and the batch (``engine.fetch_batch.fetch_task_id``), so a
watchdog (one worker at a time) looks at each lease: once it has been seen for ``FIRST_LOOK_S``
with no message of its fetch on any download queue and none unacknowledged, its URLs go back to
the frontier (no attempt counted, the host waits its interval: ``FrontierQueue.hand_over``). A
message that was only slow finds its lease gone and fetches nothing.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from celeryconfig import DOWNLOAD_QUEUE, DYNAMIC_QUEUE, queue_lists
from cluster.membership import NODE_QUEUE_PREFIX
from engine.fetch_batch import fetch_task_id
from tasks import deps
from tasks.broker.lost_analyses import ids_present, with_joined
from vcrawl import redis_keys
from vcrawl.errors import VcrawlError
from vcrawl.redis_replies import text

__all__ = ["FIRST_LOOK_S", "fetch_ids_present", "watch_fetches"]

logger = logging.getLogger(__name__)

FIRST_LOOK_S = 10.0  # a lease seen this long with no fetch message anywhere: lost
_ID_PATTERN = re.compile(r'"id": "(vcrawl-fetch:[^"]+)"')


def fetch_ids_present(client: Any) -> set[str]:
    """The fetch task ids of every message on a download queue (shared, browser, ring nodes') or
    unacknowledged."""
    lists = queue_lists(DOWNLOAD_QUEUE) + queue_lists(DYNAMIC_QUEUE)
    node_queues = {text(key) for key in client.scan_iter(match=f"{NODE_QUEUE_PREFIX}*", count=1000)}
    return with_joined(ids_present(client, lists + sorted(node_queues), _ID_PATTERN))


def watch_fetches(now: float | None = None, lock_s: float = 5.0) -> int:
    """One look at every running job's leases (one worker at a time); return how many batches whose
    message was lost were handed back."""
    client = deps.redis_client()
    if not client.set(redis_keys.lost_fetches_lock(), "1", nx=True, px=int(lock_s * 1000)):
        return 0  # another worker looked a moment ago
    now = time.time() if now is None else now
    watched = redis_keys.lost_fetches_watch()
    first_seen = {text(field): float(value) for field, value in client.hgetall(watched).items()}
    frontier = deps.frontier()
    keep: dict[str, float] = {}
    due: dict[str, list[str]] = {}
    for job_id in frontier.jobs.running_jobs():
        for batch_id in frontier.queue.leased_hosts(job_id):
            field = f"{job_id} {batch_id}"
            keep[field] = first_seen.get(field, now)
            if now - keep[field] >= FIRST_LOOK_S:
                due.setdefault(job_id, []).append(batch_id)
    handed = 0
    if due:
        present = fetch_ids_present(client)
        for job_id, batch_ids in due.items():
            lost = [batch_id for batch_id in batch_ids if fetch_task_id(job_id, batch_id) not in present]
            if lost:
                urls = frontier.queue.hand_over(job_id, lost, _interval_ms(job_id))
                handed += len(lost)
                logger.warning("job %s: the fetch message of %d leased batch(es) was lost (%s); %d URL(s) "
                               "handed back", job_id, len(lost), ", ".join(lost[:5]), urls)  # fmt: skip
                for batch_id in lost:
                    keep.pop(f"{job_id} {batch_id}", None)
    gone = [field for field in first_seen if field not in keep]
    pipe = client.pipeline(transaction=False)
    if gone:
        pipe.hdel(watched, *gone)
    new = {field: at for field, at in keep.items() if field not in first_seen}
    if new:
        pipe.hset(watched, mapping={field: repr(at) for field, at in new.items()})
    pipe.execute()
    return handed


def _interval_ms(job_id: str) -> float:
    try:
        runtime = deps.runtimes().get(job_id, deps.frontier().jobs.cycle(job_id))
    except VcrawlError:
        return 0.0  # the host still waits its Crawl-delay, if it has one
    return runtime.spec.politeness.min_interval_s * 1000
