"""A whole-request deadline: a watchdog thread shuts down the sockets of late requests.

Per-read timeouts restart with every byte, so a server that sends its status line or
headers one byte at a time is never timed out by them. The static fetcher's connections
register themselves here before they connect and before they wait for a response; once
the request's deadline passes, the watchdog shuts their sockets down and the blocked
read returns at once.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from requests.adapters import HTTPAdapter
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from fetchers.targets import AsWritten

__all__ = ["DeadlineAdapter", "DeadlineWatch"]

logger = logging.getLogger(__name__)


class DeadlineWatch:
    """Per-thread deadlines and the connections to cut when one passes."""

    def __init__(self, poll_s: float = 0.1, clock: Callable[[], float] = time.monotonic) -> None:
        self._poll_s = poll_s
        self._clock = clock
        self._lock = threading.Lock()
        self._deadlines: dict[int, float] = {}
        self._connections: dict[int, list[Any]] = {}
        self._expired: set[int] = set()
        self._thread: threading.Thread | None = None

    @contextmanager
    def limit(self, seconds: float) -> Iterator[None]:
        """Bound everything the calling thread's requests do inside the block to ``seconds``."""
        ident = threading.get_ident()
        with self._lock:
            self._deadlines[ident] = self._clock() + seconds
            self._connections[ident] = []
            self._expired.discard(ident)
            self._ensure_thread()
        try:
            yield
        finally:
            with self._lock:
                self._deadlines.pop(ident, None)
                self._connections.pop(ident, None)

    def expired(self) -> bool:
        """True if the calling thread's deadline passed and its sockets were cut."""
        return threading.get_ident() in self._expired

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


def _cut(connection: Any) -> None:
    sock = getattr(connection, "sock", None)
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed
    logger.debug("cut a connection past its deadline")


class _Watched:
    """Mixed into urllib3's connections: arm the watch before connecting and before waiting."""

    watch: DeadlineWatch

    def connect(self) -> None:
        self.watch.arm(self)
        super().connect()  # type: ignore[misc]

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        self.watch.arm(self)
        return super().getresponse(*args, **kwargs)  # type: ignore[misc]


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
