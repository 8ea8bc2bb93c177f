"""``vcrawl.crawl``: the public entry. Validates before sending, then sends the fetch."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from celery.result import AsyncResult
from kombu.utils.uuid import uuid

from celeryconfig import DOWNLOAD_QUEUE, DYNAMIC_QUEUE
from engine import single as pipeline
from tasks import deps
from tasks.analyze import analyze
from tasks.app import app
from tasks.failures import record_failure
from tasks.fetch import fetch
from vcrawl.errors import InvalidTask
from vcrawl.payloads import AnalysisJob, DownloadTask

__all__ = ["CrawlTask", "crawl", "dispatch", "validate"]

logger = logging.getLogger(__name__)


def validate(data: Any) -> DownloadTask:
    """Validate a payload in this process (schema, registries, storage confinement).

    Raises:
        InvalidTask: naming the first wrong field.
    """
    return pipeline.validate(data, deps.fetchers(), deps.storage())


def dispatch(task: DownloadTask, trail_id: str, fetch_id: str | None = None) -> AsyncResult:
    """Record ``queued`` and send the fetch, linked to its analysis and the failure handler."""
    deps.trail().queued(trail_id, task)
    on_failure = record_failure.s()
    then_analyze = analyze.s(AnalysisJob.for_task(trail_id, task).to_dict()).set(link_error=[on_failure])
    queue = DYNAMIC_QUEUE if task.page_type == "dynamic" else DOWNLOAD_QUEUE
    return fetch.apply_async(
        (task.to_dict(), trail_id),
        task_id=fetch_id or trail_id,
        link=then_analyze,
        link_error=on_failure,
        queue=queue,
        routing_key=queue,
        exchange=queue,
    )


class CrawlTask(Task):
    """A Task whose ``apply_async`` refuses invalid payloads before any message is sent.

    A valid payload goes straight to the ``download`` queue as ``vcrawl.fetch``: the
    id returned is the id of the fetch and of the status trail.
    """

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any):
        """Validate ``crawl(payload)`` and dispatch its fetch; return its AsyncResult.

        Raises:
            InvalidTask: naming the first wrong field; nothing is sent.
        """
        task = validate(_single_payload(args, kwargs))
        return dispatch(task, trail_id=task_id or uuid())


@app.task(name="vcrawl.crawl", base=CrawlTask, bind=True, ignore_result=True, acks_late=True, throws=(InvalidTask,))
def crawl(self: Task, task: dict) -> str:
    """Crawl one page: the body runs only for messages from other producers (``send_task``)."""
    trail_id = self.request.id
    try:
        validated = validate(task)
    except InvalidTask as exc:
        deps.trail().download_failed(trail_id, exc.reason, str(exc), None, "vcrawl.crawl")
        raise
    # A fixed fetch id: a redelivered crawl message re-sends the same fetch, not a second one.
    dispatch(validated, trail_id=trail_id, fetch_id=f"{trail_id}.fetch")
    return trail_id


def _single_payload(args: Any, kwargs: Any) -> Any:
    args, kwargs = tuple(args or ()), dict(kwargs or {})
    if len(args) == 1 and not kwargs:
        return args[0]
    if not args and set(kwargs) == {"task"}:
        return kwargs["task"]
    raise InvalidTask("task", "crawl takes exactly one argument: the task dict")
