"""A job's fetch batch whose task failed for good: its ``link_error`` hands the lease back at once.

``vcrawl.fetch_batch`` takes no Celery retries (a URL's retries go through the frontier), so an
error escaping it (storage trouble while a page is written, a bug) ends the task with its lease
still held: its host stays busy and its URLs out of the queue until the lease runs out. The
errback (``tasks.batches.fetch_batch_failed``) gives the lease back now, with the failed attempt
counted on every URL: a URL fetched ``retries + 1`` times fails with ``fetch_task_failed``, so a
batch that fails every time cannot loop.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from engine.crawl_env import CrawlEnv
from frontier import Batch, BatchRelease
from vcrawl import names

__all__ = ["give_back_failed_fetch"]

logger = logging.getLogger(__name__)


def give_back_failed_fetch(env: CrawlEnv, job_id: str, batch: Batch, error: str) -> bool | None:
    """Release ``batch``'s lease after its fetch task failed for good: requeue its URLs with one more
    attempt, fail those out of attempts; the host waits its pause. Returns ``FrontierQueue.release``'s
    answer (None: the lease was gone already, and nothing is counted)."""
    runtime = env.runtimes.get(job_id, batch.cycle)
    assert runtime.limits.retries is not None, "a runtime's limits are resolved"
    most_attempts = runtime.limits.retries + 1
    counted = [replace(entry, attempt=entry.attempt + 1) for entry in batch.entries]  # the one that failed
    again = tuple(entry for entry in counted if entry.attempt < most_attempts)
    spent = [entry for entry in counted if entry.attempt >= most_attempts]
    now = round(env.clock(), 3)
    pause_ms = runtime.politeness.pause_s() * 1000
    release = BatchRelease(
        pause_ms=pause_ms,
        host_delay_ms=pause_ms,
        done=len(spent),
        host_done=len(spent),
        requeue=again,
        counters={f"{names.PREFIX_FAILED}{names.REASON_FETCH_TASK_FAILED}": len(spent)} if spent else {},
        failures=tuple({"url": e.url, "reason": names.REASON_FETCH_TASK_FAILED, "at": now} for e in spent),
        fetched=False,
    )
    released = env.frontier.queue.release(job_id, batch, release)
    logger.error("job %s: fetch batch %s of %s failed for good (%s): %d URL(s) queued again, %d failed",
                 job_id, batch.batch_id, batch.host, error, len(again), len(spent))  # fmt: skip
    if released and env.on_completed is not None:
        env.on_completed(job_id, batch.cycle)
    return released
