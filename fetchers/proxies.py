"""Proxy pool health: a proxy that fails is benched for a cool-off, for every worker at once.

Whose fault is a failure through a proxy? Only what the evidence puts on the proxy itself:

- ``proxy_error``: no connection to the proxy (refused, reset or closed before any answer,
  unreachable, TLS to an https proxy failed);
- ``proxy_timeout``: connecting to the proxy timed out;
- ``proxy_auth``: the proxy answered 407 (RFC 9110 §15.5.8: only proxies send it), to a plain
  request or to a CONNECT;
- ``proxy_refused``: the proxy refused a CONNECT tunnel with another status (403, 500, 503, ...);
- ``proxy_5xx``: a 5xx the proxy says is its own failure, with an RFC 9209 ``Proxy-Status``
  whose error is a proxy-side one (``proxy_internal_error``, ``proxy_configuration_error``, ...).

A 502 or 504 is what a proxy answers when it cannot reach the origin, so without such a
``Proxy-Status`` (or with one that names the destination: ``connection_refused``,
``dns_error``, ...) it is taken as the origin's answer, as if no proxy were there: one dead
site must not bench the whole pool. The same goes for a CONNECT answered 502/504
(``http_502``/``http_504``), and for errors after the proxy took the request (a read timeout,
a body cut short), which look the same whether the proxy or the origin is slow.

The bench is one Redis hash (``redis_keys.proxy_health``), field = the proxy with its password
masked, value = ``<until ms>:<strikes>`` on Redis's clock. A proxy that fails again on its first
use after a cool-off gets twice the time, up to a cap; a response through it clears the record.
Every process reads the hash at most once per ``refresh_s`` and keeps what it marks itself.

Harvested proxies (``fetchers.proxy_pool``, filled by the proxy harvest) are read with the bench
when proxy sources are configured (``read_harvested``): a pool drawn with ``harvested=True`` (a job
without its own proxy list) has them too, and the same bench applies to them.
"""

from __future__ import annotations

import functools
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any, Protocol

import redis
import requests
import urllib3.exceptions

from fetchers.base import Fetcher, FetchRequest, FetchResult
from vcrawl import redis_keys
from vcrawl.errors import DownloadFailed, FetchFailed
from vcrawl.jobs import masked_url
from vcrawl.lua import script_text
from vcrawl.redis_replies import text
from vcrawl.settings import Settings

__all__ = [
    "PROXY_FAULTS",
    "ProxyHealth",
    "ProxyRecorder",
    "fetch_through",
    "is_proxy_fault",
    "pick_proxy",
    "proxy_counter",
    "proxy_error_reason",
    "proxy_stats",
    "response_fault",
]

logger = logging.getLogger(__name__)

PROXY_FAULTS = frozenset({"proxy_error", "proxy_timeout", "proxy_auth", "proxy_refused", "proxy_5xx"})
"""Failure reasons that are the proxy's fault: the proxy is benched and the fetch retried."""

# RFC 9209 §2.3 error types that say the intermediary itself failed; the others name the next
# hop (dns_*, destination_*, connection_*, tls_*, http_response_*) or the request.
_PROXY_SIDE_ERRORS = frozenset(
    {
        "proxy_internal_error",
        "proxy_internal_response",
        "proxy_configuration_error",
        "proxy_loop_detected",
        "connection_limit_reached",
    }
)
_TUNNEL_STATUS = re.compile(r"Tunnel connection failed: (\d{3})")
_GATEWAY = frozenset({502, 504})


def is_proxy_fault(reason: str) -> bool:
    """True if a failure with this reason is put on the proxy."""
    return reason in PROXY_FAULTS


def proxy_error_reason(exc: requests.exceptions.ProxyError) -> tuple[str, int | None]:
    """Why requests could not get through the proxy: (reason, HTTP status of a refused CONNECT).

    urllib3 wraps everything that goes wrong before the proxy answered in its ProxyError:
    the connection error itself, or an OSError naming the status of a refused CONNECT.
    """
    cause = exc.args[0] if exc.args else None
    if isinstance(cause, urllib3.exceptions.MaxRetryError):
        cause = cause.reason
    original = getattr(cause, "original_error", cause)
    if isinstance(original, urllib3.exceptions.NewConnectionError):  # a subclass of ConnectTimeoutError
        return "proxy_error", None
    if isinstance(original, urllib3.exceptions.ConnectTimeoutError | TimeoutError):
        return "proxy_timeout", None
    match = _TUNNEL_STATUS.search(str(original)) if isinstance(original, OSError) else None
    if match is None:
        return "proxy_error", None
    status = int(match.group(1))
    if status == 407:
        return "proxy_auth", status
    if status in _GATEWAY:  # the proxy could not reach the origin: the origin's trouble
        return f"http_{status}", status
    return "proxy_refused", status


def response_fault(result: FetchResult) -> str | None:
    """The proxy's fault in a response that came through a proxy, or None (the origin's answer)."""
    if result.status == 407:
        return "proxy_auth"
    if result.status >= 500 and _proxy_side_error(result.headers.get("proxy-status")):
        return "proxy_5xx"
    return None


def _proxy_side_error(header: str | None) -> bool:
    """True if the nearest proxy's ``Proxy-Status`` member (the last one) names a proxy-side error.

    >>> _proxy_side_error('origin-cache, proxy-b; error=proxy_internal_error; details="x, y"')
    True
    >>> _proxy_side_error("proxy-b; error=connection_refused"), _proxy_side_error(None)
    (False, False)
    """
    if not header:
        return False
    members = re.findall(r'(?:[^,"]|"(?:[^"\\]|\\.)*")+', header)
    if not members:
        return False
    match = re.search(r';\s*error\s*=\s*"?([A-Za-z0-9_.-]+)', members[-1])
    return match is not None and match.group(1).lower() in _PROXY_SIDE_ERRORS


def pick_proxy(
    pool: Sequence[str], cooling_until: Mapping[str, float], now: float, rng: random.Random | None = None
) -> str | None:
    """A random proxy of ``pool`` that is not cooling off; None for an empty pool.

    When every proxy is cooling off, the one whose cool-off ends first: never none, since
    proxies may be there for a reason, and a retry through it probes whether it is back.

    >>> pick_proxy(["http://a:1", "http://b:1"], {"http://a:1": 9.0, "http://b:1": 5.0}, now=1.0)
    'http://b:1'
    """
    if not pool:
        return None
    healthy = [proxy for proxy in pool if cooling_until.get(_name(proxy), 0.0) <= now]
    if healthy:
        return (rng or random).choice(healthy)
    return min(pool, key=lambda proxy: cooling_until.get(_name(proxy), 0.0))


@functools.lru_cache(maxsize=4096)
def _name(proxy: str) -> str:
    """A proxy as the bench and the counts know it: its URL with the password masked."""
    return masked_url(proxy)


def proxy_counter(proxy: str, reason: str | None) -> str:
    """The job counter for one fetch through ``proxy`` that ended with ``reason`` (None: a response).

    >>> proxy_counter("http://u:pw@p:3128", None), proxy_counter("http://p:3128", "proxy_auth")
    ('proxy_ok:http://u:***@p:3128', 'proxy_failed:proxy_auth:http://p:3128')
    """
    name = _name(proxy)
    if reason is None:
        return f"proxy_ok:{name}"
    if is_proxy_fault(reason):
        return f"proxy_failed:{reason}:{name}"
    return f"proxy_errors:{name}"


def proxy_stats(counters: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """Per proxy (masked): ``ok``, ``failed`` (its fault, by reason in ``reasons``), ``errors``
    (failures not put on it), from a job's counters."""
    stats: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return stats.setdefault(name, {"ok": 0, "failed": 0, "errors": 0, "reasons": {}})

    for counter, count in counters.items():
        if counter.startswith("proxy_ok:"):
            entry(counter.split(":", 1)[1])["ok"] += count
        elif counter.startswith("proxy_errors:"):
            entry(counter.split(":", 1)[1])["errors"] += count
        elif counter.startswith("proxy_failed:"):
            _, reason, name = counter.split(":", 2)
            row = entry(name)
            row["failed"] += count
            row["reasons"][reason] = row["reasons"].get(reason, 0) + count
    return stats


class ProxyRecorder(Protocol):
    """Where a fetch through a proxy is noted (``ProxyHealth``)."""

    def record(self, proxy: str | None, reason: str | None) -> None:
        """Note how a fetch through ``proxy`` ended: ``reason`` of its failure, None for a response."""
        ...


def fetch_through(fetcher: Fetcher, request: FetchRequest, health: ProxyRecorder | None) -> FetchResult:
    """Fetch ``request``; its outcome goes on its proxy's record, and a proxy's fault is raised.

    Raises:
        FetchFailed: as the fetcher does, and ``proxy_auth``/``proxy_5xx`` for such responses.
        DownloadFailed: as the fetcher does.
    """
    try:
        result = fetcher.fetch(request)
    except (FetchFailed, DownloadFailed) as exc:
        if health is not None:
            health.record(request.proxy, exc.reason)
        raise
    fault = response_fault(result) if request.proxy is not None else None
    if health is not None:
        health.record(request.proxy, fault)
    if fault is not None:
        raise FetchFailed(request.url, fault, result.status)
    return result


class ProxyHealth:
    """Which proxies are cooling off, shared by every worker through Redis, cached per process.

    Args:
        client: a redis-py client.
        cooloff_s: the first cool-off of a failing proxy; doubled each time it fails again
            on its first use after one, up to ``cooloff_max_s``.
        refresh_s: how long this process trusts its copy of the bench (at most a second).
        read_harvested: read the harvested pool with the bench (proxy sources are configured);
            without it, ``harvested=True`` adds nothing and no refresh reads the pool.
    """

    def __init__(
        self,
        client: Any,
        cooloff_s: float = 60.0,
        cooloff_max_s: float = 900.0,
        refresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        read_harvested: bool = False,
    ) -> None:
        if cooloff_max_s < cooloff_s:
            raise ValueError(f"cooloff_max_s ({cooloff_max_s:g}) must be at least cooloff_s ({cooloff_s:g})")
        self._redis = client
        self._base_ms, self._cap_ms = int(cooloff_s * 1000), int(cooloff_max_s * 1000)
        self._refresh_s, self._clock = refresh_s, clock
        self._mark = client.register_script(_lua("proxy_mark"))
        self._clear = client.register_script(_lua("proxy_clear"))
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}  # masked proxy -> end of its cool-off, on self._clock
        self._read_harvested = read_harvested
        self._harvested: tuple[str, ...] = ()  # the harvested pool, fastest first; a new tuple per refresh
        # The last merged pool: (the _harvested it was built from, the pool given, pool + harvested);
        # built once per refresh (and pool), not on every draw.
        self._merged: tuple[tuple[str, ...] | None, Sequence[str], Sequence[str]] = (None, (), ())
        self._read_at = float("-inf")

    @classmethod
    def from_settings(cls, settings: Settings, client: Any) -> ProxyHealth:
        """The bench with the cluster's cool-off (``VCRAWL_PROXY_COOLOFF_S``, ``..._MAX_S``), and the
        harvested pool when ``VCRAWL_PROXY_SOURCES`` is set."""
        return cls(
            client, settings.proxy_cooloff_s, settings.proxy_cooloff_max_s, read_harvested=bool(settings.proxy_sources)
        )

    def draw(self, pool: Sequence[str], rng: random.Random | None = None, harvested: bool = False) -> str | None:
        """A proxy of ``pool`` (with the harvested ones if ``harvested``) to send a request through
        (see ``pick_proxy``); None for no pool."""
        with_harvested = harvested and self._read_harvested
        if not pool and not with_harvested:
            return None
        until = self._current()
        return pick_proxy(self._merge(pool, with_harvested), until, self._clock(), rng)

    def has_healthy(self, pool: Sequence[str], harvested: bool = False) -> bool:
        """True if some proxy of ``pool`` (with the harvested ones if ``harvested``) is not cooling off."""
        until, now = self._current(), self._clock()
        return any(until.get(_name(proxy), 0.0) <= now for proxy in self._merge(pool, harvested))

    def pool(self, pool: Sequence[str], harvested: bool = False) -> Sequence[str]:
        """``pool``, followed by the harvested proxies it does not have yet if ``harvested``."""
        if harvested and self._read_harvested:
            self._current()
        return self._merge(pool, harvested)

    def _merge(self, pool: Sequence[str], harvested: bool) -> Sequence[str]:
        """``pool`` with the harvested proxies it lacks (as of the last refresh), cached per refresh."""
        if not (harvested and self._read_harvested):
            return pool
        built_from, given, merged = self._merged
        current = self._harvested
        if built_from is current and (given is pool or given == pool):
            return merged
        have = set(pool)
        extra = [proxy for proxy in current if proxy not in have]
        merged = (*pool, *extra) if extra else pool
        self._merged = (current, pool, merged)  # one assignment: threads see an old or a new entry, whole
        return merged

    def cooling(self) -> dict[str, float]:
        """Masked proxy -> seconds of cool-off left, for the proxies cooling off now."""
        until, now = self._current(), self._clock()
        return {name: round(end - now, 3) for name, end in until.items() if end > now}

    def record(self, proxy: str | None, reason: str | None) -> None:
        """Note how a fetch through ``proxy`` ended: ``reason`` of its failure, None for a response."""
        if proxy is None:
            return
        name = _name(proxy)
        if reason is not None and is_proxy_fault(reason):
            self._bench(name, reason)
        elif reason is None and self._until.get(name, float("inf")) <= self._clock():  # one read: _until is swapped
            self._forgive(name)

    def _bench(self, name: str, reason: str) -> None:
        try:
            marked = self._mark(keys=[redis_keys.proxy_health()], args=[name, self._base_ms, self._cap_ms])
            left_ms, strikes, fresh = (int(x) for x in marked)
        except redis.RedisError as exc:  # the bench is advice: keep it in this process
            logger.warning("proxy %s failed (%s); could not record it in Redis: %r", name, reason, exc)
            left_ms, strikes, fresh = self._base_ms, 0, 1
        with self._lock:
            self._until[name] = max(self._until.get(name, 0.0), self._clock() + left_ms / 1000)
        if fresh:
            logger.warning("proxy %s benched for %.1f s: %s (strike %d)", name, left_ms / 1000, reason, strikes + 1)
        else:
            logger.debug("proxy %s failed again while benched (%s)", name, reason)

    def _forgive(self, name: str) -> None:
        with self._lock:
            self._until.pop(name, None)
        try:
            if self._clear(keys=[redis_keys.proxy_health()], args=[name]):
                logger.info("proxy %s works again", name)
        except redis.RedisError as exc:
            logger.warning("could not clear the record of proxy %s in Redis: %r", name, exc)

    def forget_local(self, proxy: str | None = None) -> None:
        """Drop this process's marks of ``proxy`` (of every proxy if None); the next use reads Redis."""
        with self._lock:
            if proxy is None:
                self._until = {}
            else:
                self._until.pop(_name(proxy), None)
            self._read_at = float("-inf")

    def _current(self) -> dict[str, float]:
        """This process's copy of the bench, read again from Redis when older than ``refresh_s``."""
        started = self._clock()
        if started - self._read_at < self._refresh_s:
            return self._until
        self._read_at = started  # one read per interval, even when it fails
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.time()
            pipe.hgetall(redis_keys.proxy_health())
            if self._read_harvested:
                pipe.zrange(redis_keys.proxy_pool(), 0, -1)
            (seconds, micros), raw, *harvested = pipe.execute()
        except redis.RedisError as exc:
            logger.warning("could not read the proxy bench from Redis: %r", exc)
            return self._until
        # Redis read its clock during the round trip: taking ``now`` after it puts an end time read
        # from Redis late by up to the round trip, never early (a benched proxy is never drawn early).
        now = self._clock()
        server_ms = int(seconds) * 1000 + int(micros) // 1000
        fresh: dict[str, float] = {}
        for field, value in raw.items():
            until_ms = int(text(value).split(":", 1)[0])
            fresh[text(field)] = now + (until_ms - server_ms) / 1000
        if harvested:
            self._harvested = tuple(text(proxy) for proxy in harvested[0])
        with self._lock:
            # A mark of this process newer than the read is kept; a record cleared elsewhere goes.
            for name, end in self._until.items():
                if end > now and end > fresh.get(name, float("-inf")):
                    fresh[name] = end
            self._until = fresh
        return fresh


def _lua(name: str) -> str:
    """A script of ``fetchers/lua/`` (its KEYS and ARGV are documented at its top)."""
    return script_text(resources.files("fetchers") / "lua", name)
