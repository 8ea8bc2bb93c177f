"""Crawler clusters reached from one process (``vcrawl serve`` over several): a ``ClusterClient`` each.

Every façade function (``tasks.start_job``, ``tasks.job_status``, ``tasks.ring_nodes``, ...) reaches its cluster
only through ``tasks.deps``, the composition root: its settings, its Redis clients, its frontier, its Celery app.
So a client of another cluster is not a second copy of the façade but a ``deps.Scope`` of its own: that
cluster's settings (this process's, with the cluster's Redis URL), the components made for it, once, and a
Celery app built from those settings (its broker is that cluster's Redis; it is never made the current app).
``client.call(tasks.start_job, job)`` runs the façade function with the scope entered, in this thread only:
the same code that serves this process's cluster writes to the other cluster's Redis and broker, and
nothing of one cluster's can leak into another's cache. The process's own cluster is a client without a scope.

A cluster that does not answer is reported, never waited on for long: ``health`` asks its Redis for a PING
with short timeouts (cached for a moment, so a dashboard's burst of requests asks once), and a Redis error
during a call becomes ``ClusterDown``, its text free of the URL's password.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import ParamSpec, TypeVar
from urllib.parse import unquote, urlsplit

from celery import Celery
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from celeryconfig import celery_settings
from tasks import deps
from tasks.redis_clients import probe_redis
from vcrawl.errors import ClusterDown
from vcrawl.settings import Settings
from vcrawl.targets.clusters import shown_url

__all__ = ["PROBE_TIMEOUT_S", "ClusterClient"]

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0
"""How long a health check waits for a cluster's Redis to connect and to answer PING."""
_HEALTH_TTL_S = 2.0  # a health check's answer is reused this long (the dashboard refreshes every 2 s)

P = ParamSpec("P")
T = TypeVar("T")


class ClusterClient:
    """One crawler cluster as this process reaches it: its name, its settings and (another cluster's) scope."""

    def __init__(self, name: str, settings: Settings, scope: deps.Scope | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.name, self.settings = name, settings
        self._scope = scope
        self._clock = clock
        self._health_lock = threading.Lock()
        self._health: tuple[float, str | None] | None = None  # (checked at, why down or None)

    @classmethod
    def own(cls, name: str) -> ClusterClient:
        """This process's own cluster (its ``VCRAWL_*`` settings, ``tasks.configure``'s), in no scope of its own."""
        return cls(name, deps.settings())

    @classmethod
    def named(cls, name: str, url: str, base: Settings) -> ClusterClient:
        """The cluster whose Redis (broker, frontier, job state) is ``url``; the rest of ``base`` applies.

        ``base``'s Redis password is not sent to it (the URL holds this cluster's), nor its frontier's own
        Redis: the frontier is on ``url``'s server. TLS is the URL's (``rediss://``), verified as ``base`` says.

        Raises:
            ConfigError: ``url`` is not a Redis URL vcrawl takes.
        """
        settings = replace(base, redis_url=url, redis_password="", redis_sentinel_master="", frontier_url=None,
                           redis_tls=False, redis_sentinel_tls=False, monitor_clusters=())  # fmt: skip
        app = Celery("vcrawl", set_as_current=False)
        app.conf.update(celery_settings(settings))
        return cls(name, settings, deps.Scope(settings=settings, app=app))

    @property
    def shown_url(self) -> str:
        """The cluster's Redis URL without its password."""
        return shown_url(self.settings.redis_url)

    def call(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``function(*args, **kwargs)`` (a façade function) on this cluster.

        Raises:
            ClusterDown: its Redis or broker failed during the call.
        """
        try:
            if self._scope is None:
                return function(*args, **kwargs)
            with deps.scoped(self._scope):
                return function(*args, **kwargs)
        except (RedisError, OperationalError) as exc:
            reason = self._scrubbed(f"{type(exc).__name__}: {exc}")
            self._note(reason)
            raise ClusterDown(self.name, reason) from exc

    def bind(self, function: Callable[P, T]) -> Callable[P, T]:
        """``function`` made to act on this cluster (``call``)."""

        @functools.wraps(function)
        def on_cluster(*args: P.args, **kwargs: P.kwargs) -> T:
            return self.call(function, *args, **kwargs)

        return on_cluster

    def health(self) -> str | None:
        """Why the cluster's Redis is down now (without passwords), or None if it answers PING within
        ``PROBE_TIMEOUT_S``; an answer is reused for ``_HEALTH_TTL_S``."""
        with self._health_lock:
            if self._health is not None and self._clock() - self._health[0] < _HEALTH_TTL_S:
                return self._health[1]
        problem = probe_redis(self.settings, PROBE_TIMEOUT_S)
        reason = None if problem is None else self._scrubbed(problem)
        self._note(reason)
        return reason

    def close(self) -> None:
        """Close the clients made for another cluster (this process's own are left as they are)."""
        if self._scope is None:
            return
        with deps.scoped(self._scope):
            for name in ("redis", "frontier_redis"):
                if (client := deps.clients.made(name)) is not None:
                    client.close()
            deps.reset(self.settings)
        if self._scope.app is not None:
            self._scope.app.close()

    def _note(self, reason: str | None) -> None:
        """Remember the cluster's health; log when it changes (the URL without its password)."""
        with self._health_lock:
            before = self._health[1] if self._health is not None else None
            self._health = (self._clock(), reason)
        if reason is not None and before is None:
            logger.warning("cluster %s (%s) is down: %s", self.name, self.shown_url, reason)
        elif reason is None and before is not None:
            logger.warning("cluster %s (%s) answers again", self.name, self.shown_url)

    def _scrubbed(self, text: str) -> str:
        """``text`` with the cluster's URL shown without its password, and the password itself hidden."""
        url = self.settings.redis_url
        text = text.replace(url, self.shown_url)
        try:
            secrets = [urlsplit(url).password, urlsplit(url).username, self.settings.redis_password]
        except ValueError:
            secrets = []
        for secret in secrets:
            if secret and len(secret) >= 3:  # a one- or two-letter user name would blot out the whole text
                text = text.replace(secret, "***").replace(unquote(secret), "***")
        return text[:500]
