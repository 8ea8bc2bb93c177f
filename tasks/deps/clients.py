"""This process's settings and clients, and the one cache every factory of ``tasks.deps`` builds through.

``reset`` forgets everything made (a pool child calls it after fork, so no socket is shared
between processes); ``once`` makes a component on first use, once per process, under one lock.

The cache is the process's own cluster's, unless a thread entered another cluster's ``Scope`` (``scoped``):
then ``settings()`` and every component (Redis clients, frontier, Celery app, ...) are that cluster's,
made once for it, so one process (``vcrawl serve`` over several clusters) can reach each with the same code.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import redis
import requests
from celery import Celery

from fetchers import DnsCache, make_session
from storage import Storage
from tasks.app import app as _own_app
from tasks.redis_clients import make_frontier_client, make_redis_client
from telemetry.alerts import Alert, Alerter
from vcrawl import redis_keys
from vcrawl.settings import Settings

__all__ = [
    "LIVE_DERIVED",
    "Scope",
    "alert",
    "alerter",
    "base_settings",
    "celery_app",
    "dns_cache",
    "first_in_window",
    "made",
    "on_settings_change",
    "once",
    "per_job",
    "redis_client",
    "reset",
    "scoped",
    "session",
    "settings",
    "storage",
    "take_up_settings",
]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Scope:
    """One cluster's settings, its components made so far and its Celery app (None: the process's, ``tasks.app``)."""

    settings: Settings | None = None  # the base with the cluster's live values on top
    base: Settings | None = None  # from the environment (or given to reset): what live values go on top of
    app: Celery | None = None
    made: dict[str, Any] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)


_process = Scope()
_current: ContextVar[Scope] = ContextVar("vcrawl_deps_scope", default=_process)
_on_change: list[Callable[[Settings], None]] = []
# Built from settings that may be set live (vcrawl.live_settings): made again after a change. Each is
# looked up per use (never kept by a long-lived object); job runtimes follow on their own (RuntimeCache).
LIVE_DERIVED = ("single_context", "crawl_env", "alerter", "identities", "host_gate")


@contextmanager
def scoped(scope: Scope) -> Iterator[Scope]:
    """Within the block, this thread's components are ``scope``'s (another cluster's)."""
    token = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(token)


def reset(new_settings: Settings | None = None) -> None:
    """Forget every client of the current scope; the next use builds them again (from ``new_settings`` if given)."""
    scope = _current.get()
    with scope.lock:
        for name in ("output_shipper", "origin_holds", "live_settings_keeper"):
            if (keeper := scope.made.get(name)) is not None:
                keeper.stop(timeout_s=0)  # its writers, subscription or client go with the rest
        if (records := scope.made.get("records_database")) is not None:
            records.close()  # this process's connection only: a forked child leaves its parent's alone
        scope.made.clear()
        scope.base = scope.settings = new_settings


def settings() -> Settings:
    """Return this process's settings (its environment's, with the cluster's live values on top), or the
    scope's cluster's."""
    scope = _current.get()
    with scope.lock:
        if scope.settings is None:
            scope.base = scope.settings = Settings.from_env()
        return scope.settings


def base_settings() -> Settings:
    """The settings before the cluster's live values (what ``reset`` was given, or the environment)."""
    current = settings()
    return _current.get().base or current


def take_up_settings(new: Settings) -> None:
    """Use ``new`` from now on (the cluster's live values changed): what was built from the old is built again."""
    scope = _current.get()
    with scope.lock:
        if new == scope.settings:
            return
        scope.settings = new
        for name in LIVE_DERIVED:
            scope.made.pop(name, None)
        hooks = list(_on_change) if scope is _process else []
    for hook in hooks:
        hook(new)


def on_settings_change(hook: Callable[[Settings], None]) -> None:
    """Call ``hook`` with this process's new settings after each live change (e.g. the log stream's level)."""
    with _process.lock:
        _on_change.append(hook)


def celery_app() -> Celery:
    """The Celery app of the current scope's cluster: this process's (``tasks.app``), or the scope's own."""
    return _current.get().app or _own_app


def once(name: str, build: Callable[[], Any]) -> Any:
    """The component ``name`` of this process (or scope), built by ``build`` on first use (until ``reset``)."""
    scope = _current.get()
    made_now = scope.made.get(name)
    if made_now is None:
        with scope.lock:
            made_now = scope.made.get(name)
            if made_now is None:
                made_now = scope.made[name] = build()
    return made_now


def made(name: str) -> Any:
    """The component ``name`` if this process made it already, else None (nothing is built)."""
    return _current.get().made.get(name)


def per_job(kind: str, job_id: str, build: Callable[[Settings], Any]) -> Any:
    """This process's one ``kind`` writer for ``job_id``, made on first use."""
    writers: dict[str, Any] = once(kind, dict)
    with _current.get().lock:
        if job_id not in writers:
            writers[job_id] = build(settings())
        return writers[job_id]


def redis_client() -> redis.Redis:
    """Return the Redis client of the broker's server: vcrawl's keys that are not the frontier's
    (status trails, ring membership, holdings, logs, alerts, proxies)."""
    return once("redis", lambda: make_redis_client(settings()))


def frontier_client() -> Any:
    """Return the Redis client of the frontier (``VCRAWL_FRONTIER_URL``; the broker's when unset)."""
    if settings().frontier_url is None:
        return redis_client()  # one server, one pool
    return once("frontier_redis", lambda: make_frontier_client(settings()))


def storage() -> Storage:
    """Return the storage router for the configured data location."""
    return once("storage", lambda: Storage.from_settings(settings()))


def session() -> requests.Session:
    """Return this process's pooled HTTP session (shared by single tasks and jobs)."""
    return once("session", lambda: make_session(pool_size=64, resolver=dns_cache()))


def dns_cache() -> DnsCache:
    """Return this process's DNS cache: every connection of its threads resolves through it."""
    return once("dns_cache", lambda: DnsCache.from_settings(settings()))


def alerter() -> Alerter:
    """Return the admin alert sender."""
    return once("alerter", lambda: Alerter.from_settings(settings()))


def first_in_window(cause: str) -> bool:
    """True once per ``cause`` per ``VCRAWL_ALERT_WINDOW_S``: a broken site does not send a thousand emails."""
    window_s = max(1, int(settings().alert_window_s))
    return bool(redis_client().set(redis_keys.alert_sent(cause, "job"), 1, nx=True, ex=window_s))


def alert(cause: str, message: Alert) -> bool:
    """Send ``message`` unless an alert for ``cause`` went out within the alert window."""
    if not first_in_window(cause):
        return False
    alerter().send(message)
    return True
