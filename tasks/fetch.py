"""``vcrawl.fetch``: download one page on the ``download`` queue."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from celery import Task

from engine import single as pipeline
from tasks import deps
from tasks.app import app
from vcrawl.errors import AttemptsExhausted, FetchFailed, VcrawlError

__all__ = ["fetch"]


# max_retries=None: the attempt budget is counted in the status trail (it survives
# redelivery), and waiting for a busy host is not an attempt.
@app.task(name="vcrawl.fetch", bind=True, acks_late=True, max_retries=None, ignore_result=True, throws=(VcrawlError,))
def fetch(self: Task, task: dict, trail_id: str, reserved_ms: int | None = None) -> dict:
    """Fetch and store one page; return the FetchedPage for the linked analysis."""
    job = pipeline.validate(task, deps.fetchers(), deps.storage())
    host = urlsplit(job.url).hostname or ""
    gate = deps.host_gate()
    if (slot_ms := gate.reserve(host, reserved_ms)) > 0:
        # Come back exactly at the reserved slot; waiting is not an attempt.
        countdown = max(0.0, slot_ms / 1000 - time.time())
        raise self.retry(args=(task, trail_id), kwargs={"reserved_ms": slot_ms}, countdown=countdown)
    trail = deps.trail()
    attempt = trail.downloading(trail_id)
    if attempt > deps.fetch_retry().retries + 1:
        gate.release(host)
        # Redelivered after killing its worker again and again: stop, do not loop for ever.
        raise AttemptsExhausted("download", attempt)
    try:
        page = pipeline.download(
            job, deps.fetchers().get(job.page_type), deps.identities(), deps.storage(), deps.proxy_health()
        )
    except FetchFailed as exc:
        delay_s = deps.fetch_retry().delay_for(attempt, exc.retry_after_s)
        if delay_s is None:
            raise
        trail.will_retry(trail_id, "download", str(exc), delay_s)
        raise self.retry(exc=exc, countdown=delay_s) from exc
    finally:
        gate.release(host)
    trail.downloaded(trail_id, page, stored_at=pipeline.stored_at(deps.storage(), page.save_path))
    return page.to_dict()
