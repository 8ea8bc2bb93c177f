"""The Celery task graph: ``crawl`` -> ``fetch`` (download queue) -> ``analyze`` (analysis queue).

Use ``from tasks import crawl; crawl.delay({"url": ...})``; ``status(id)`` reads the trail.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_init, worker_process_init

from analyzers import load_plugins
from tasks import deps
from tasks.analyze import analyze
from tasks.app import app
from tasks.crawl import crawl
from tasks.failures import record_failure
from tasks.fetch import fetch
from tasks.trail import STATES, TERMINAL_STATES
from vcrawl.errors import ConfigError, InvalidTask
from vcrawl.settings import Settings

__all__ = [
    "STATES",
    "TERMINAL_STATES",
    "InvalidTask",
    "analyze",
    "app",
    "configure",
    "crawl",
    "fetch",
    "record_failure",
    "status",
]


def status(task_id: str) -> dict[str, Any] | None:
    """Return the status trail of a task submitted with ``crawl.delay()`` (None if unknown).

    Keys always present: ``id``, ``state``, ``http_status``, ``save_path``, ``result_path``,
    ``attempts``, ``analysis_attempts``, ``error``; plus ``<state>_at`` timestamps and more.
    """
    return deps.trail().get(task_id)


def configure(settings: Settings) -> None:
    """Point this process's app and clients at ``settings`` (before anything is sent)."""
    from celeryconfig import celery_settings

    app.conf.update(celery_settings(settings))
    deps.reset(settings)


@worker_init.connect
def _check_configuration(**_: Any) -> None:
    # Fail at start-up, naming the variable or plugin, rather than on the first task.
    # Celery logs and swallows exceptions from signal handlers, but not SystemExit.
    try:
        deps.settings()
        load_plugins()
    except ConfigError as exc:
        logging.getLogger("vcrawl").critical("vcrawl cannot start: %s", exc)
        raise SystemExit(f"vcrawl: configuration error: {exc}") from exc


@worker_process_init.connect
def _fresh_clients_after_fork(**_: Any) -> None:
    # A pool child must not share the parent's sockets.
    deps.reset(deps.settings())
