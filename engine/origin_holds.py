"""Holding a job's host at every worker at once: it asked for no request for a while (a 429/503 with
``Retry-After``, an API's spent rate limit).

The batch that got the answer notes the hold in its own process (``frontier.OriginHolds``: its other
batches there look before each request), then in the frontier, which leases and starts no batch of
the host until it ends and tells every other worker process at once (``FrontierQueue.hold_host``).
A request another batch already sent cannot be recalled: each batch of the host in flight elsewhere
may have one on the wire, sent before it heard of the hold (docs/jobs.md, "What a 429 or 503 makes
wait").
"""

from __future__ import annotations

import logging
from functools import partial

from engine.crawl_env import CrawlEnv
from engine.redis_wait import ride_out

__all__ = ["hold_origin"]

logger = logging.getLogger(__name__)


def hold_origin(env: CrawlEnv, job_id: str, host: str, hold_s: float) -> None:
    """Hold ``host`` of ``job_id`` for ``hold_s`` from now: in this process at once, then in the
    frontier and every other worker process."""
    if env.holds is not None:
        env.holds.note(job_id, host, hold_s)
    ride_out(partial(env.frontier.queue.hold_host, job_id, host, hold_s), f"hold of {host}")
    logger.info("job %s: %s asked for no request for %.1f s: held at every worker", job_id, host, hold_s)
