"""A worker's logging: JSON lines (``VCRAWL_LOG_FORMAT=json``), context on every line, the cluster log stream.

Hooked on Celery's own logging set-up (``after_setup_logger`` for the root logger,
``after_setup_task_logger`` for ``celery.task``, which does not propagate), so Celery's lines get the
same treatment as vcrawl's. Each handler Celery made keeps the worker's ``-l`` level on the handler
itself: the stream may lower a logger's level to ship its INFO lines, and the console must not print
them. ``task_prerun``/``task_postrun`` set the task id (and what the message names of the job or URL)
for the lines logged while a task runs; the engine adds the job and URL where it works on them.
"""

from __future__ import annotations

import logging
from logging.handlers import WatchedFileHandler
from typing import Any

from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    celeryd_after_setup,
    task_postrun,
    task_prerun,
    worker_process_init,
)

from tasks import deps
from tasks.redis_clients import make_redis_client
from telemetry.log_context import ContextFilter, JsonFormatter, set_task
from telemetry.log_stream import StreamShipper, level_of
from vcrawl.settings import Settings

__all__ = ["install", "shipper"]

# The handlers Celery's set-up makes (a stream, or a file with ``--logfile``), by exact type.
_CELERY_HANDLERS = (logging.StreamHandler, WatchedFileHandler)
_installed: dict[str, Any] = {}  # this process's context filter and shipper, once installed


def shipper() -> StreamShipper | None:
    """This process's log stream handler (None: not installed, or the stream is off)."""
    return _installed.get("shipper")


def install(target: logging.Logger, local_level: int, settings: Settings) -> None:
    """Give ``target``'s handlers the context filter (and the JSON format), and add the stream handler.

    Idempotent per logger: Celery may set up the same logger again.
    """
    if "context" not in _installed:
        _installed["context"] = ContextFilter()
    context = _installed["context"]
    stream = shipper()
    if stream is None and settings.log_stream:
        # A client of its own: the shipping thread's connection never waits behind a task's commands.
        stream = _installed["shipper"] = StreamShipper(
            lambda: make_redis_client(settings),
            maxlen=settings.log_maxlen,
            queue_size=settings.log_queue_size,
            default_level=level_of(settings.log_stream_level),
            poll_s=settings.log_levels_poll_s,
        )
        stream.addFilter(context)
        # VCRAWL_LOG_STREAM_LEVEL may be set live (vcrawl config set): the stream's default follows.
        deps.on_settings_change(lambda current: setattr(stream, "default_level", level_of(current.log_stream_level)))
    for handler in target.handlers:
        if type(handler) not in _CELERY_HANDLERS:  # only Celery's own: not the stream, not a test's capture
            continue
        if local_level:
            handler.setLevel(local_level)
        if context not in handler.filters:
            handler.addFilter(context)
        if settings.log_format == "json":
            handler.setFormatter(JsonFormatter())
    if stream is not None and stream not in target.handlers:
        target.addHandler(stream)
        # Started now, not on a first line: levels set while nothing was logged must reach this process.
        stream.start()


@after_setup_logger.connect
@after_setup_task_logger.connect
def _logger_set_up(logger: logging.Logger, loglevel: int | None = None, **_: Any) -> None:
    install(logger, int(loglevel or 0), deps.settings())


@celeryd_after_setup.connect
def _name_node(sender: str, **_: Any) -> None:
    # The worker's node name (Celery's -n, like w1@box) is known only now; lines logged before say the host.
    if (context := _installed.get("context")) is not None:
        context.node = str(sender)


@worker_process_init.connect
def _ship_from_child(**_: Any) -> None:
    # A prefork child inherits the handler, not the thread: it starts its own (and its own Redis client).
    if (stream := shipper()) is not None:
        stream.start()


@task_prerun.connect
def _task_started(task_id: str, task: Any = None, args: Any = None, **_: Any) -> None:
    set_task(task_id, *_job_and_url(getattr(task, "name", ""), args or ()))


@task_postrun.connect
def _task_ended(**_: Any) -> None:
    set_task(None)


def _job_and_url(name: str, args: Any) -> tuple[str | None, str | None]:
    """What a task's message says of the job or URL (the engine narrows it to the URL at hand)."""
    first = args[0] if args else None
    if name == "vcrawl.fetch_batch" and isinstance(first, str):
        return first, None
    if name == "vcrawl.analyze_batch" and isinstance(first, dict):
        return str(first.get("job") or "") or None, None
    if name == "vcrawl.analyze_batches" and isinstance(first, list) and first and isinstance(first[0], dict):
        return str(first[0].get("job") or "") or None, None
    if name in ("vcrawl.fetch", "vcrawl.crawl") and isinstance(first, dict):
        return None, str(first.get("url") or "") or None
    return None, None
