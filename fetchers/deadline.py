"""A whole-request deadline and the head's rate floor: a watchdog thread shuts down the sockets of
late or drip-fed requests.

Per-read timeouts restart with every byte, so a server that sends its status line or
headers one byte (or one line) at a time is never timed out by them. The static fetcher's
connections register themselves here before they connect and before they wait for a response;
once the request's deadline passes, the watchdog shuts their sockets down and the blocked
read returns at once.

The response head (status line and headers) is held to the transfer-rate floor the body is held
to (``fetchers.rate_floor``): its bytes are counted as they arrive, and from its first byte on,
a head slower than ``min_rate_bytes_s`` over a whole ``window_s`` is cut the same way, and the
request fails as ``slow_head``. Until that first byte the server may think for up to the read
timeout, as before: a slow page is not a tarpit.
"""

from __future__ import annotations

import http.client
import io
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any

from requests.adapters import HTTPAdapter
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from fetchers.rate_floor import RateFloor
from fetchers.targets import AsWritten

__all__ = ["DeadlineAdapter", "DeadlineWatch", "SlowHead"]

logger = logging.getLogger(__name__)


class SlowHead(TimeoutError):
    """A response head was cut for arriving slower than the rate floor (urllib3 reads it as a read timeout)."""


class _Head:
    """A response head being read: its bytes so far, counted by the reading thread, and its rate floor
    (from its first byte), checked by the watchdog."""

    def __init__(self, connection: Any, min_rate: float, window_s: float, clock: Callable[[], float]) -> None:
        self.connection = connection
        self.size = 0
        self.reading = True  # False once the head is read: the body's bytes are the fetcher's to count
        self.cut = False
        self.floor: RateFloor | None = None
        self._min_rate, self._window_s, self._clock = min_rate, window_s, clock

    def add(self, n: int) -> None:
        """``n`` more bytes of the head arrived."""
        if self.floor is None:
            self.floor = RateFloor(self._min_rate, self._window_s, self._clock())
        self.size += n

    def too_slow(self, now: float) -> bool:
        """True once the head, begun, brought too few bytes over a whole window."""
        floor = self.floor
        return floor is not None and floor.too_slow(now, self.size)


class DeadlineWatch:
    """Per-thread deadlines and rate floors of response heads, and the connections to cut when one is missed."""

    def __init__(self, poll_s: float = 0.1, clock: Callable[[], float] = time.monotonic) -> None:
        self._poll_s = poll_s
        self._clock = clock
        self._lock = threading.Lock()
        self._deadlines: dict[int, float] = {}
        self._connections: dict[int, list[Any]] = {}
        self._expired: set[int] = set()
        self._floors: dict[int, tuple[float, float]] = {}  # thread -> (min bytes/s, window s) of its heads
        self._heads: dict[int, _Head] = {}  # thread -> the response head it is reading
        self._slow_heads: set[int] = set()
        self._thread: threading.Thread | None = None

    @contextmanager
    def limit(self, seconds: float, min_rate_bytes_s: float = 0.0, window_s: float = 0.0) -> Iterator[None]:
        """Bound everything the calling thread's requests do inside the block to ``seconds``, and each
        response head, once begun, to ``min_rate_bytes_s`` over any ``window_s`` (0: no floor)."""
        ident = threading.get_ident()
        with self._lock:
            self._deadlines[ident] = self._clock() + seconds
            self._connections[ident] = []
            self._expired.discard(ident)
            self._slow_heads.discard(ident)
            if min_rate_bytes_s > 0 and window_s > 0:
                self._floors[ident] = (min_rate_bytes_s, window_s)
            self._ensure_thread()
        try:
            yield
        finally:
            with self._lock:
                self._deadlines.pop(ident, None)
                self._connections.pop(ident, None)
                self._floors.pop(ident, None)
                self._heads.pop(ident, None)

    def expired(self) -> bool:
        """True if the calling thread's deadline passed and its sockets were cut."""
        return threading.get_ident() in self._expired

    def slow_head(self) -> bool:
        """True if a response head of the calling thread was cut for arriving slower than the floor."""
        return threading.get_ident() in self._slow_heads

    def head(self, connection: Any) -> _Head | None:
        """Start counting the response head the calling thread reads on ``connection``; None: no floor."""
        ident = threading.get_ident()
        with self._lock:
            floor = self._floors.get(ident)
            if floor is None:
                return None
            head = self._heads[ident] = _Head(connection, *floor, self._clock)
            return head

    def head_read(self, head: _Head) -> None:
        """The head is read (or given up): stop counting and checking it."""
        head.reading = False
        with self._lock:
            if self._heads.get(threading.get_ident()) is head:
                del self._heads[threading.get_ident()]

    def arm(self, connection: Any) -> None:
        """Cut ``connection`` if the calling thread's deadline passes while it is in use."""
        ident = threading.get_ident()
        with self._lock:
            if ident in self._connections:
                self._connections[ident].append(connection)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._watch, name="vcrawl-deadlines", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while True:
            time.sleep(self._poll_s)
            now = self._clock()
            with self._lock:
                late = [ident for ident, deadline in self._deadlines.items() if deadline < now]
                for ident in late:
                    self._expired.add(ident)
                    for connection in self._connections.get(ident, ()):
                        _cut(connection)
                    self._deadlines.pop(ident, None)
                for ident in [ident for ident, head in self._heads.items() if head.too_slow(now)]:
                    head = self._heads.pop(ident)
                    head.cut = True
                    self._slow_heads.add(ident)
                    _cut(head.connection)
                    logger.debug("cut a response head slower than the rate floor (%d bytes so far)", head.size)


def _cut(connection: Any) -> None:
    sock = getattr(connection, "sock", None)
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed
    logger.debug("cut a connection past its deadline")


class _CountedReader(io.RawIOBase):
    """A response's socket reader that counts the head's bytes as they arrive (one count per read)."""

    def __init__(self, raw: Any, head: _Head) -> None:
        super().__init__()
        self._raw, self._head = raw, head

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        n = self._raw.readinto(buffer)
        if n and self._head.reading:
            self._head.add(n)
        return n  # type: ignore[no-any-return]

    def fileno(self) -> int:
        return int(self._raw.fileno())

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _CountedResponse(http.client.HTTPResponse):
    """http.client's response, reading through a ``_CountedReader`` (same buffering as ``makefile``)."""

    def __init__(self, sock: Any, *args: Any, head: _Head, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp = io.BufferedReader(_CountedReader(self.fp.detach(), head))


class _Watched:
    """Mixed into urllib3's connections: arm the watch before connecting and before waiting, and
    hold the response head to the rate floor."""

    watch: DeadlineWatch

    def connect(self) -> None:
        self.watch.arm(self)
        super().connect()  # type: ignore[misc]

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        self.watch.arm(self)
        head = self.watch.head(self)
        if head is None:
            return super().getresponse(*args, **kwargs)  # type: ignore[misc]
        self.response_class = partial(_CountedResponse, head=head)  # what http.client reads the head with
        try:
            response = super().getresponse(*args, **kwargs)  # type: ignore[misc]
        except (OSError, http.client.HTTPException) as exc:
            if head.cut:
                raise SlowHead(f"response head slower than the rate floor ({head.size} bytes)") from exc
            raise
        finally:
            self.watch.head_read(head)
            del self.response_class
        if head.cut:  # cut between two header lines, http.client took the end of data for the head's end
            response.close()
            raise SlowHead(f"response head slower than the rate floor ({head.size} bytes)")
        return response


_POOLS: dict[str, type] = {"http": HTTPConnectionPool, "https": HTTPSConnectionPool}


def _watched_classes(watch: DeadlineWatch, pools: Mapping[str, type]) -> dict[str, type]:
    """Subclasses of ``pools`` (scheme -> pool class) whose connections are watched."""
    watched = {}
    for scheme, pool in pools.items():
        bases = (_Watched, AsWritten, pool.ConnectionCls)
        connection = type(f"Watched{pool.ConnectionCls.__name__}", bases, {"watch": watch})
        watched[scheme] = type(f"Watched{pool.__name__}", (pool,), {"ConnectionCls": connection})
    return watched


class DeadlineAdapter(HTTPAdapter):
    """An HTTPAdapter whose connections (direct or through proxies) obey a DeadlineWatch.

    ``pools`` (scheme -> urllib3 pool class) are the classes to watch; default: urllib3's own.
    """

    def __init__(self, watch: DeadlineWatch, pools: Mapping[str, type] | None = None, **kwargs: Any) -> None:
        self._pools = _watched_classes(watch, pools if pools is not None else _POOLS)
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        """Build the pool manager with watched connection classes."""
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = self._pools

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        """The proxy's pool manager, with watched connection classes."""
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        manager.pool_classes_by_scheme = self._pools
        return manager
