"""``vcrawl.fetch``: download one page of a single task on the ``download`` queue.

The page goes through the crawl's one fetch step, robots.txt and the host's pause included
(``engine.single.run_single_fetch``). Waiting for the host is a re-queue at the reserved time, not
an attempt; the attempt budget is counted in the status trail, so it survives redelivery.
"""

from __future__ import annotations

import time

from celery import Task

from engine import single
from engine.outcomes import Failed, Retry, RobotsBlocked, RobotsFetched, Stored
from tasks import deps
from tasks.app import app
from vcrawl.errors import FetchFailed, VcrawlError

__all__ = ["fetch"]


@app.task(name="vcrawl.fetch", bind=True, acks_late=True, max_retries=None, ignore_result=True, throws=(VcrawlError,))
def fetch(self: Task, task: dict, trail_id: str, reserved_ms: int | None = None) -> dict:
    """Fetch and store one page; return the FetchedPage for the linked analysis."""
    job = single.validate(task, deps.fetchers(), deps.storage())
    outcome = single.run_single_fetch(deps.single_env(), job, trail_id, reserved_ms)
    match outcome:
        case single.ComeBack(slot_ms=slot_ms):
            countdown = 0.0 if slot_ms is None else max(0.0, slot_ms / 1000 - time.time())
            raise self.retry(args=(task, trail_id), kwargs={"reserved_ms": slot_ms}, countdown=countdown)
        case Stored(page=page):
            deps.trail().downloaded(trail_id, page, stored_at=single.stored_at(deps.storage(), page.save_path))
            return page.to_dict()
        case RobotsFetched():  # the robots.txt cache expired meanwhile: the page goes in the host's next slot
            deps.trail().will_retry(trail_id, "download", "robots.txt read first", 0.0)
            raise self.retry(args=(task, trail_id), countdown=0)
        case Retry():
            exc = FetchFailed(job.url, outcome.reason, outcome.http_status)
            deps.trail().will_retry(trail_id, "download", str(exc), outcome.delay_s)
            raise self.retry(exc=exc, countdown=outcome.delay_s)
        case Failed() | RobotsBlocked():
            raise single.outcome_error(outcome)
    # Unchanged: only jobs keep history; Redirected: a single task's fetcher follows redirects itself.
    raise AssertionError(f"fetch outcome not handled: {outcome!r}")
