"""The Celery task graph and its façade: ``crawl`` -> ``fetch`` (download queue) -> ``analyze`` (analysis queue).

Use ``from tasks import crawl; crawl.delay({"url": ...})``; ``status(id)`` reads the trail.
The functions here are the façade the command line and the API use to reach the cluster;
they never reach into ``tasks.deps`` or the other modules of this package. Each acts on this process's
cluster, or, called through a ``ClusterClient`` (``tasks.clusters``), on that client's cluster. Importing it wires
nothing: a worker's signals are in ``tasks.boot``, which only a starting worker imports.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, TextIO

from cluster.membership import nodes_listing
from engine import jobs as _jobs
from engine.api_pages import check_secrets
from engine.trail import STATES, TERMINAL_STATES
from fetchers.proxy_pool import read_pool as _read_proxy_pool
from storage import Storage, job_records_location
from storage import records as _records
from tasks import deps
from tasks.analysis_facade import (
    analysis_run,
    analysis_runs,
    analyze_job,
    analyzers,
    reanalyze_job,
    start_analysis,
)
from tasks.analyze import analyze
from tasks.app import app
from tasks.batch_analysis import batch_map, batch_reduce, start_batch_analysis
from tasks.batches import analyze_batch, fetch_batch
from tasks.broker import queues as _queues
from tasks.broker.amqp import amqp_queue_lengths
from tasks.broker.holdings import BrokerHoldings
from tasks.broker.redelivery import requeue_unacked as _requeue_unacked
from tasks.clusters import ClusterClient
from tasks.crawl import crawl
from tasks.cycles import start_cycle
from tasks.failures import record_failure
from tasks.fetch import fetch
from tasks.proxy_harvest import harvest_proxies
from telemetry import log_stream as _log_stream
from vcrawl import names
from vcrawl.errors import ConfigError, InvalidTask
from vcrawl.jobs import JobSpec
from vcrawl.schedules import ScheduleStore
from vcrawl.settings import Settings
from views import daily as _daily
from views import status as _status

__all__ = [
    "STATES",
    "TERMINAL_STATES",
    "ClusterClient",
    "InvalidTask",
    "JobSpec",
    "analysis_run",
    "analysis_runs",
    "analyze",
    "analyze_batch",
    "analyze_job",
    "analyzers",
    "app",
    "batch_map",
    "batch_reduce",
    "cancel_job",
    "check_job",
    "check_job_secrets",
    "check_settings",
    "cluster_settings",
    "configure",
    "crawl",
    "export_records",
    "fetch",
    "fetch_batch",
    "forget_node",
    "harvest_proxies",
    "harvest_proxies_now",
    "host_stats",
    "job_daily",
    "job_failures",
    "job_spec",
    "job_state",
    "job_stats",
    "job_status",
    "list_jobs",
    "log_levels",
    "pause_job",
    "ping_workers",
    "proxy_pool",
    "queue_lengths",
    "read_logs",
    "read_new_logs",
    "reanalyze_job",
    "reconfigure_job",
    "record_failure",
    "redis_info",
    "requeue_unacked",
    "resize_node",
    "resume_job",
    "ring_nodes",
    "schedule_store",
    "set_cluster_setting",
    "set_log_level",
    "settings",
    "start_analysis",
    "start_batch_analysis",
    "start_cycle",
    "start_job",
    "status",
    "unset_cluster_setting",
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
        ConfigError: this process's settings cannot run a crawl (checked before anything is written).
    """
    spec = job if isinstance(job, JobSpec) else JobSpec.from_dict(job)
    check_settings()
    return _jobs.start(spec, deps.frontier(), deps.runtimes(), deps.fetchers())


def job_status(job_id: str, with_outputs: bool = True) -> dict[str, Any] | None:
    """State and counters of a job (None if unknown): as ``vcrawl status JOB --json`` prints.

    ``outputs`` lists its files in storage (left empty without ``with_outputs``: listing the
    store costs requests, e.g. on HDFS); ``outputs_pending`` counts the worker processes that
    still hold output of it not shipped (it drops to 0 within seconds of the job's completion).
    """
    store = None
    if with_outputs:
        try:
            store = deps.storage()
        except ConfigError:  # this process cannot reach the store: the job's status still shows
            store = None
    return _status.job_status(deps.frontier(), job_id, store, deps.output_ledger())


def cancel_job(job_id: str) -> bool:
    """Stop dispatching a job at once (in-flight fetches finish and are counted); False if not running."""
    return deps.frontier().jobs.cancel(job_id, time.time())


def pause_job(job_id: str) -> bool:
    """Stop dispatching a job until ``resume_job`` (in-flight fetches finish); False if not running."""
    return deps.frontier().jobs.pause(job_id, time.time())


def resume_job(job_id: str) -> str | None:
    """Dispatch a paused job again; returns its state (``running`` or ``completed``), None if not paused."""
    state = deps.frontier().jobs.resume(job_id)
    if state == names.STATE_COMPLETED:  # nothing was left: the workers ship its output now (their poll would, in 2 s)
        deps.output_ledger().announce(job_id, deps.frontier().jobs.cycle(job_id))
    return state


def reconfigure_job(job_id: str, changes: Mapping[str, Any]) -> JobSpec:
    """Change a running job's politeness, header pools or proxies; workers apply it within seconds.

    Raises:
        InvalidTask: naming the bad key, e.g. ``politeness.per_host``.
    """
    return _jobs.reconfigure(deps.frontier(), job_id, changes)


def job_spec(job_id: str) -> JobSpec | None:
    """A job's spec with its live changes (what ``reconfigure_job`` changed); None if unknown."""
    return _jobs.current_spec(deps.frontier(), job_id)


def configure(settings: Settings) -> None:
    """Point this process's app and clients at ``settings`` (before anything is sent)."""
    from celeryconfig import celery_settings

    app.conf.update(celery_settings(settings))
    # Connections made for an earlier broker URL would still be handed out (Celery drops them
    # after a fork, the same way).
    app._pool = None
    app.amqp._producer_pool = None
    deps.reset(settings)


def settings() -> Settings:
    """This process's settings (as given to ``configure``, else read from the environment)."""
    return deps.settings()


def check_settings(current: Settings | None = None) -> None:
    """Check what a run needs of ``current`` (default: this process's settings), connecting to nothing.

    Raises:
        ConfigError: naming the variable, e.g. ``VCRAWL_HDFS_USER`` for an ``hdfs://`` data root.
    """
    Storage.check_settings(deps.settings() if current is None else current)


def check_job(spec: JobSpec) -> None:
    """Check a job's analyzers and selectors as starting it would, without starting it.

    Raises:
        InvalidTask: naming the bad key.
    """
    _jobs.check_job(spec, deps.fetchers())


def check_job_secrets(spec: JobSpec, current: Settings | None = None) -> None:
    """Check that ``current`` (default: this process's settings) holds every api secret the job names:
    for a run whose workers get these settings (``vcrawl crawl``).

    Raises:
        InvalidTask: naming ``rules[<i>].auth`` and its ``VCRAWL_API_AUTH_*`` variable.
    """
    check_secrets(spec.rules, (deps.settings() if current is None else current).api_auth)


def list_jobs(limit: int = 100) -> list[str]:
    """Job ids, newest first."""
    return deps.frontier().jobs.jobs(limit)


def job_state(job_id: str) -> str | None:
    """A job's state alone (``running``, ``paused``, ...; None if unknown), cheaper than ``job_status``."""
    return deps.frontier().jobs.raw_state(job_id).get("state")


def job_failures(job_id: str, limit: int = 50) -> list[dict[str, object]]:
    """A job's most recent final failures, newest first."""
    return deps.frontier().stats.failures(job_id, limit)


def host_stats(job_id: str) -> dict[str, dict[str, int]]:
    """Per host of a job: responses (``fetched``), URLs finished (``done``) and final failures (``failed``)."""
    return deps.frontier().stats.host_stats(job_id)


def job_stats(job_id: str, minutes: int, now: float) -> list[tuple[int, dict[str, int]]]:
    """A job's per-minute counters over the last ``minutes`` minutes, oldest first."""
    return deps.frontier().stats.stats(job_id, minutes, now)


def job_daily(job_id: str, days: int, now: float | None = None, host: str | None = None) -> dict[str, Any] | None:
    """A job's last ``days`` UTC days (None if unknown), as ``vcrawl stats JOB --by day --json`` prints them."""
    return _daily.job_daily(deps.frontier(), job_id, days, time.time() if now is None else now, host)


def read_logs(job: str | None = None, node: str | None = None, level: str = "DEBUG",
              limit: int = 100) -> list[tuple[str, dict[str, str]]]:  # fmt: skip
    """The cluster log stream's last ``limit`` lines of ``job`` / ``node`` from ``level`` on, oldest first,
    as (stream id, fields: t, level, levelno, logger, msg, node, job, task, url).

    Raises:
        ValueError: ``level`` is not a level name.
    """
    query = _log_stream.LogQuery(job, node, _log_stream.level_of(level))
    return _log_stream.read_entries(deps.redis_client(), query, limit)


def read_new_logs(after: str, job: str | None = None, node: str | None = None, level: str = "DEBUG",
                  block_ms: int = 1000) -> tuple[list[tuple[str, dict[str, str]]], str]:  # fmt: skip
    """The log stream's lines after id ``after`` (``$``: from now), waiting up to ``block_ms``; and the next id."""
    query = _log_stream.LogQuery(job, node, _log_stream.level_of(level))
    return _log_stream.read_new_entries(deps.redis_client(), query, after, block_ms)


def set_log_level(logger: str, level: str | None) -> None:
    """Ship ``logger``'s lines (``root``: every logger's) to the log stream from ``level`` on; None: the default.

    Every worker applies it within ``VCRAWL_LOG_LEVELS_POLL_S``.

    Raises:
        ValueError: ``level`` is not a level name.
    """
    _log_stream.set_stream_level(deps.redis_client(), logger, level)


def log_levels() -> dict[str, str]:
    """The log stream's levels set in Redis, by logger (``root``: every logger not named).

    Only what is set: a logger none of them covers ships from each worker's own
    ``VCRAWL_LOG_STREAM_LEVEL``, which this process's setting need not be.
    """
    return {name: str(logging.getLevelName(level)) for name, level in _log_stream.stream_levels(
        deps.redis_client()).items()}  # fmt: skip


def set_cluster_setting(name: str, value: str) -> str:
    """Set a ``VCRAWL_*`` setting for the whole cluster, live; return its variable name.

    Every worker takes it up within seconds (``cluster.live_settings``); settings that cannot change
    without a restart are refused (``vcrawl.live_settings``).

    Raises:
        InvalidTask: not a live setting (``.problem`` says why), or a bad value (naming the variable).
    """
    return deps.live_settings().set(name, value)


def unset_cluster_setting(name: str) -> bool:
    """Drop the cluster's live value of ``name``: each node's environment or default applies again."""
    return deps.live_settings().unset(name)


def cluster_settings() -> list[dict[str, Any]]:
    """Every setting with its value as this process sees it, its source (default, environment, cluster),
    and whether it can be set live (and why not)."""
    return deps.live_settings().listing()


def queue_lengths() -> dict[str, int]:
    """Messages waiting on each queue (``download``, ``download.dynamic``, ``analysis``)."""
    if deps.settings().amqp_broker:
        return amqp_queue_lengths(deps.celery_app())
    return _queues.queue_lengths(deps.redis_client())


def redis_info() -> dict[str, Any]:
    """Redis's ``INFO`` (all default sections) for this process's Redis."""
    return deps.redis_client().info()


def ping_workers(names: list[str], timeout_s: float = 0.5) -> set[str]:
    """Names of the workers among ``names`` that answer a ping within ``timeout_s`` (at once when all do)."""
    replies = deps.celery_app().control.ping(destination=names, timeout=timeout_s, limit=len(names))
    return {name for reply in replies for name in reply}


def ring_nodes(with_hosts: bool = True) -> dict[str, Any]:
    """The members (ring nodes and plain workers, alive or down), the hosts each ring node owns now, their
    pages/s, the broker messages each holds, what was taken over from the down ones, and each one's fetch
    statistics (``cluster.node_stats``: requests, successes, failures, hosts, bytes, bandwidth, rates)."""
    registry = deps.node_registry()
    membership = registry.membership()
    stats = deps.node_stats().read([node.name for node in membership.nodes], membership.now_ms)
    return nodes_listing(membership, deps.frontier(), with_hosts, held=BrokerHoldings(deps.celery_app()).held_counts(),
                         taken_over=registry.down_records(), stats=stats)  # fmt: skip


def resize_node(name: str, concurrency: int, timeout_s: float = 5.0) -> dict[str, Any]:
    """Set worker ``name``'s pool to ``concurrency`` slots while it runs (``tasks.pool.vcrawl_resize``).

    Returns its answer: ``{"ok": ..., "before": N, "concurrency": M}`` or ``{"error": ...}``; when no
    worker of that name answered within ``timeout_s``, ``{"error": ..., "answered": False}``.
    """
    control = deps.celery_app().control
    replies = control.broadcast("vcrawl_resize", arguments={"n": int(concurrency)}, destination=[name], reply=True,
                                timeout=timeout_s, limit=1)  # fmt: skip
    for reply in replies:
        if name in reply:
            return dict(reply[name])
    return {"error": f"no worker {name!r} answered within {timeout_s:g} s (vcrawl nodes lists them)", "answered": False}


def forget_node(name: str) -> bool:
    """Drop a node that is down from the listing; False if it is alive or unknown."""
    return deps.node_registry().forget(name)


def requeue_unacked() -> int:
    """Put every message that stopped workers took and never acknowledged back on its queue; return how many.

    Only while no worker consumes from this broker: a running worker's messages would run twice. On
    RabbitMQ there are none to put back: it did so itself when their connections closed.
    """
    if deps.settings().amqp_broker:
        return 0
    return _requeue_unacked(deps.celery_app())


def proxy_pool() -> dict[str, Any]:
    """The harvested proxies (fastest first, with their last check) and the proxies cooling off now."""
    return {
        "harvested": [entry.to_dict() for entry in _read_proxy_pool(deps.redis_client())],
        "cooling": deps.proxy_health().cooling(),
    }


def harvest_proxies_now() -> dict[str, Any]:
    """Run one proxy harvest in this process, as beat's firing does on a worker; its report."""
    return harvest_proxies()  # the task's own body, called in this process (no worker, no broker)


def schedule_store() -> ScheduleStore:
    """The schedules in this process's Redis (RedBeat entries), to add, list, change and remove."""
    return ScheduleStore(deps.celery_app())


def export_records(job_id: str, out: TextIO, fmt: str, data: str | None = None) -> int:
    """Write a job's records to ``out`` as ``jsonl`` or ``csv``: from the records database when
    ``VCRAWL_RECORDS_URL`` is set, else from the part files under data root ``data`` (default the configured one).

    Returns how many records were written.

    Raises:
        RecordsUnavailable: the records database is out of reach.
    """
    current = deps.settings() if data is None else replace(deps.settings(), data=data)
    if current.records_url is not None:
        return _records.write_records(deps.records_database().read(job_id), out, fmt)
    return _records.export_records(Storage.from_settings(current), job_records_location(job_id), out, fmt)
