"""What a log line is about: the job, task and URL being worked on, and the node that logs it.

The crawl steps set the job and URL (``log_context``) around their work, the Celery shell sets the
task id around each task; ``ContextFilter`` copies them onto every record a handler sees, so a line
logged anywhere below (a fetcher, the frontier, Celery's own loggers) says which job and URL it
belongs to. Context variables, not thread-locals: a thread pool's threads each carry their own, and
a value set for one task is gone when the task ends.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime

__all__ = ["CONTEXT_FIELDS", "ContextFilter", "JsonFormatter", "current_context", "log_context", "set_task"]

# The record attributes ContextFilter sets (None when unknown), also the keys of a JSON line.
CONTEXT_FIELDS = ("job", "task_id", "url")

_job: ContextVar[str | None] = ContextVar("vcrawl_log_job", default=None)
_task_id: ContextVar[str | None] = ContextVar("vcrawl_log_task_id", default=None)
_url: ContextVar[str | None] = ContextVar("vcrawl_log_url", default=None)
_VARS = {"job": _job, "task_id": _task_id, "url": _url}


@contextmanager
def log_context(*, job: str | None = None, url: str | None = None) -> Iterator[None]:
    """Lines logged inside are about ``job`` and ``url`` (those given; the others stay as they are)."""
    tokens = [(_VARS[name], _VARS[name].set(value)) for name, value in (("job", job), ("url", url)) if value]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def set_task(task_id: str | None, job: str | None = None, url: str | None = None) -> None:
    """The task this thread runs from now (None: none). Called by the Celery shell before and after each task."""
    _task_id.set(task_id)
    _job.set(job)
    _url.set(url)


def current_context() -> dict[str, str | None]:
    """The job, task id and URL lines logged here now are about."""
    return {name: var.get() for name, var in _VARS.items()}


class ContextFilter(logging.Filter):
    """Adds ``node``, ``job``, ``task_id`` and ``url`` to every record it sees (never drops one)."""

    def __init__(self, node: str | None = None) -> None:
        super().__init__()
        self.node = node or socket.gethostname()

    def filter(self, record: logging.LogRecord) -> bool:
        record.node = self.node
        for name, var in _VARS.items():
            if getattr(record, name, None) in (None, "???"):  # Celery's TaskFormatter puts "???" outside a task
                setattr(record, name, var.get())
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, node, and job, task id, URL where known.

    >>> record = logging.LogRecord("engine.fetch_batch", logging.WARNING, __file__, 1, "job %s: %s", ("j1", "x"), None)
    >>> record.created, record.node, record.job, record.url = 0.0, "w1@box", "j1", None
    >>> print(JsonFormatter().format(record))
    {"time": "1970-01-01T00:00:00.000Z", "level": "WARNING", "logger": "engine.fetch_batch", "message": "job j1: x", \
"node": "w1@box", "job": "j1"}
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": iso_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "node": getattr(record, "node", None) or socket.gethostname(),
        }
        for name in CONTEXT_FIELDS:
            if (value := getattr(record, name, None)) not in (None, "", "???"):
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        return json.dumps(line, default=str)


def iso_time(epoch_s: float) -> str:
    """UTC time with milliseconds, as in log lines.

    >>> iso_time(1.5)
    '1970-01-01T00:00:01.500Z'
    """
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
