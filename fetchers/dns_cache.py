"""A per-process DNS cache in front of ``socket.getaddrinfo``, for the SSRF guard's connections.

The guard (``fetchers.netguard``) resolves a name once per connection and connects to an
address it checked; with this cache as its resolver, that one resolution comes from here, so
pinning holds exactly as before: the addresses checked are the addresses connected to.

Answers live a fixed ``ttl_s`` (``VCRAWL_DNS_TTL_S``), not the record's own TTL:
``getaddrinfo`` does not report TTLs, and it is the system's resolver (``/etc/hosts``, nscd or
systemd-resolved, search domains, as nsswitch orders them), which operators and the tests
rely on. Asking DNS directly for TTLs would bypass all of that (``localhost`` and names pinned
in ``/etc/hosts`` would go to a name server first). A short fixed TTL bounds how stale an
answer can be, as the JVM's ``networkaddress.cache.ttl`` does (Scrapy's cache never expires).
Failures are kept ``negative_ttl_s`` so a dead name is not asked again for every URL of it.

One cache per worker process (``tasks.deps``), shared by its threads; a pool child builds its
own after fork. Concurrent misses of one name wait for a single lookup.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vcrawl.settings import Settings

__all__ = ["DnsCache", "DnsCacheStats"]

logger = logging.getLogger(__name__)

AddrInfo = tuple[Any, ...]
_Key = tuple[str, int, int, int, int]  # name, family, type, proto, flags (the port is set per call)


@dataclass(frozen=True)
class DnsCacheStats:
    """How the cache answered so far: ``lookups`` went to the resolver, ``hits`` did not."""

    lookups: int
    hits: int
    failures: int  # lookups that raised socket.gaierror (kept negative_ttl_s)
    names: int  # entries held now


@dataclass(frozen=True)
class _Answer:
    expires_at: float
    infos: tuple[AddrInfo, ...] = ()
    error: tuple[int, str] | None = None  # a failed lookup: gaierror's (errno, strerror)


class _Pending:
    """A lookup in progress: threads missing the same name wait for it instead of asking again."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: _Answer | None = None


class DnsCache:
    """A bounded, thread-safe LRU of ``getaddrinfo`` answers; call it as ``getaddrinfo``."""

    def __init__(
        self,
        resolve: Callable[..., list[AddrInfo]] = socket.getaddrinfo,
        max_names: int = 4096,
        ttl_s: float = 60.0,
        negative_ttl_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resolve = resolve
        self._max_names = max_names
        self._ttl_s = ttl_s
        self._negative_ttl_s = negative_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._answers: OrderedDict[_Key, _Answer] = OrderedDict()
        self._pending: dict[_Key, _Pending] = {}
        self._lookups = self._hits = self._failures = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> DnsCache:
        """The cache as ``VCRAWL_DNS_CACHE_SIZE``, ``VCRAWL_DNS_TTL_S`` and ``_NEGATIVE_TTL_S`` set it."""
        return cls(
            max_names=settings.dns_cache_size, ttl_s=settings.dns_ttl_s, negative_ttl_s=settings.dns_negative_ttl_s
        )

    def __call__(
        self, host: str, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> list[AddrInfo]:
        """Resolve like ``socket.getaddrinfo``, from the cache while the answer is fresh.

        Raises:
            socket.gaierror: the name did not resolve (now, or within the negative TTL).
        """
        if _is_ip_literal(host):  # nothing to look up: never cached, never counted
            return self._resolve(host, port, family, type, proto, flags | socket.AI_NUMERICHOST)
        key = (host.lower().rstrip("."), family, type, proto, flags)
        answer = self._cached(key)
        if answer is None:
            answer = self._look_up(key, host)
        if answer.error is not None:
            raise socket.gaierror(*answer.error)  # a fresh one each time: threads share no traceback
        return [_with_port(info, port) for info in answer.infos]

    def stats(self) -> DnsCacheStats:
        """The counters so far (for a benchmark's "DNS lookups per page")."""
        with self._lock:
            return DnsCacheStats(self._lookups, self._hits, self._failures, len(self._answers))

    def _cached(self, key: _Key) -> _Answer | None:
        with self._lock:
            answer = self._answers.get(key)
            if answer is None:
                return None
            if answer.expires_at <= self._clock():
                del self._answers[key]
                return None
            self._answers.move_to_end(key)
            self._hits += 1
            return answer

    def _look_up(self, key: _Key, host: str) -> _Answer:
        """Ask the resolver, unless another thread is asking for the same key already."""
        with self._lock:
            pending = self._pending.get(key)
            leader = pending is None
            if pending is None:
                pending = self._pending[key] = _Pending()
            else:
                self._hits += 1  # answered by another thread's lookup
        if leader:
            return self._ask(key, host, pending)
        pending.done.wait()
        if pending.answer is not None:
            return pending.answer
        return self._look_up(key, host)  # the leader's lookup broke off with no answer: ask again

    def _ask(self, key: _Key, host: str, pending: _Pending) -> _Answer:
        name, family, kind, proto, flags = key
        try:
            infos = self._resolve(host, None, family, kind, proto, flags)
            answer = _Answer(self._clock() + self._ttl_s, infos=tuple(infos))
        except socket.gaierror as exc:
            logger.debug("%s does not resolve: %s (kept %gs)", name, exc, self._negative_ttl_s)
            answer = _Answer(self._clock() + self._negative_ttl_s, error=(exc.errno, exc.strerror))
        except BaseException:  # not an answer (a bad IDNA name, an interrupt): nothing to keep
            with self._lock:
                del self._pending[key]
                self._lookups += 1
            pending.done.set()
            raise
        with self._lock:
            del self._pending[key]
            self._lookups += 1
            self._failures += answer.error is not None
            if self._max_names > 0:
                self._answers[key] = answer
                self._answers.move_to_end(key)
                while len(self._answers) > self._max_names:
                    self._answers.popitem(last=False)
        pending.answer = answer
        pending.done.set()
        return answer


def _is_ip_literal(host: str) -> bool:
    """True for an IP address written out (IPv6 possibly with a zone).

    >>> _is_ip_literal("127.0.0.1"), _is_ip_literal("fe80::1%eth0"), _is_ip_literal("localhost")
    (True, True, False)
    """
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _with_port(info: AddrInfo, port: Any) -> AddrInfo:
    """A cached answer (resolved without a port) for ``port``: IPv4 (ip, port), IPv6 (ip, port, flow, scope).

    >>> _with_port((2, 1, 6, "", ("127.0.0.1", 0)), 8080)[4]
    ('127.0.0.1', 8080)
    """
    family, kind, proto, canonname, address = info
    number = socket.getservbyname(port) if isinstance(port, str) and not port.isdigit() else int(port or 0)
    return (family, kind, proto, canonname, (address[0], number, *address[2:]))
