"""The Celery task graph: ``crawl`` -> ``fetch`` (download queue) -> ``analyze`` (analysis queue).

Use ``from tasks import crawl; crawl.delay({"url": ...})``; ``status(id)`` reads the trail.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from celery.signals import worker_init, worker_process_init, worker_process_shutdown, worker_ready, worker_shutdown

from analyzers import load_plugins
from engine import jobs as _jobs
from engine.trail import STATES, TERMINAL_STATES
from tasks import deps
from tasks.analyze import analyze
from tasks.app import app
from tasks.batches import analyze_batch, dispatch_batch, fetch_batch
from tasks.broker_guard import guard_redis_qos, reuse_redis_clients
from tasks.crawl import crawl
from tasks.failures import record_failure
from tasks.fetch import fetch
from tasks.scheduled import start_cycle
from vcrawl.errors import ConfigError, InvalidTask
from vcrawl.jobs import JobSpec
from vcrawl.redis_check import check_redis_persistence
from vcrawl.settings import Settings

__all__ = [
    "STATES",
    "TERMINAL_STATES",
    "InvalidTask",
    "JobSpec",
    "analyze",
    "analyze_batch",
    "app",
    "cancel_job",
    "configure",
    "crawl",
    "fetch",
    "fetch_batch",
    "job_status",
    "pause_job",
    "reconfigure_job",
    "record_failure",
    "resume_job",
    "start_cycle",
    "start_job",
    "status",
]


def status(task_id: str) -> dict[str, Any] | None:
    """Return the status trail of a task submitted with ``crawl.delay()`` (None if unknown).

    Keys always present: ``id``, ``state``, ``http_status``, ``save_path``, ``result_path``,
    ``attempts``, ``analysis_attempts``, ``error``; plus ``<state>_at`` timestamps and more.
    """
    return deps.trail().get(task_id)


def start_job(job: JobSpec | Mapping[str, Any]) -> str:
    """Start a crawl job (a JobSpec, or a dict as in a job file); return its id.

    Raises:
        InvalidTask: ``field`` is the path of the bad key.
    """
    spec = job if isinstance(job, JobSpec) else JobSpec.from_dict(job)
    return _jobs.start(spec, deps.frontier(), deps.runtimes(), deps.fetchers())


def job_status(job_id: str) -> dict[str, Any] | None:
    """State and counters of a job (None if unknown): as ``vcrawl status JOB --json`` prints."""
    return _jobs.job_status(deps.frontier(), job_id)


def cancel_job(job_id: str) -> bool:
    """Stop dispatching a job at once (in-flight fetches finish and are counted); False if not running."""
    return deps.frontier().jobs.cancel(job_id, time.time())


def pause_job(job_id: str) -> bool:
    """Stop dispatching a job until ``resume_job`` (in-flight fetches finish); False if not running."""
    return deps.frontier().jobs.pause(job_id, time.time())


def resume_job(job_id: str) -> str | None:
    """Dispatch a paused job again; returns its state (``running`` or ``completed``), None if not paused."""
    return deps.frontier().jobs.resume(job_id)


def reconfigure_job(job_id: str, changes: Mapping[str, Any]) -> JobSpec:
    """Change a running job's politeness, header pools or proxies; workers apply it within seconds.

    Raises:
        InvalidTask: naming the bad key, e.g. ``politeness.per_host``.
    """
    return _jobs.reconfigure(deps.frontier(), job_id, changes)


def configure(settings: Settings) -> None:
    """Point this process's app and clients at ``settings`` (before anything is sent)."""
    from celeryconfig import celery_settings

    app.conf.update(celery_settings(settings))
    # Connections made for an earlier broker URL would still be handed out (Celery drops them
    # after a fork, the same way).
    app._pool = None
    app.amqp._producer_pool = None
    deps.reset(settings)


guard_redis_qos()  # workers must survive a Redis restart (see tasks/broker_guard.py)
reuse_redis_clients()  # one kombu client per channel, not one per publish and ack


@worker_init.connect
def _check_configuration(**_: Any) -> None:
    # Fail at start-up, naming the variable or plugin, rather than on the first task.
    # Celery logs and swallows exceptions from signal handlers, but not SystemExit.
    try:
        deps.settings()
        load_plugins()
        check_redis_persistence(deps.redis_client())  # warns loudly; a worker still starts
    except ConfigError as exc:
        logging.getLogger("vcrawl").critical("vcrawl cannot start: %s", exc)
        raise SystemExit(f"vcrawl: configuration error: {exc}") from exc


@worker_process_init.connect
def _fresh_clients_after_fork(**_: Any) -> None:
    # A pool child must not share the parent's sockets.
    deps.reset(deps.settings())


@worker_ready.connect
def _start_pump(**_: Any) -> None:
    # Every worker pumps the frontier; the scripts keep concurrent pumps exact.
    if deps.settings().pump:
        deps.pump(dispatch_batch).start()
    try:  # records and WARC files a killed worker on this machine spooled but never shipped
        deps.recover_spools()
    except Exception:
        logging.getLogger("vcrawl").exception("could not ship the spools of stopped workers")


@worker_shutdown.connect
def _stop_pump(**_: Any) -> None:
    if deps.settings().pump:
        deps.pump(dispatch_batch).stop()
    _release_process_resources()


@worker_process_shutdown.connect
def _quit_browser(**_: Any) -> None:
    # A prefork child (recycled by max_tasks_per_child, or at shutdown) quits its own browser
    # and ships its records and WARC files.
    _release_process_resources()


def _release_process_resources() -> None:
    # Each step on its own: a store that fails must not keep the browser alive or the WARC unshipped.
    for step in (deps.fetchers().close, deps.flush_records, deps.close_warc):
        try:
            step()
        except Exception:
            logging.getLogger("vcrawl").exception("shutdown step %s failed", step.__name__)
