"""GET requests on kept-alive connections, their responses read by llhttp (``httptools``): the static
fetcher's direct requests, without urllib3's and http.client's layers (http.client reads a head line
by line and parses it with the ``email`` package; urllib3 wraps that in its own response). In one
process against the bench universe's nginx (a 31 KB page): 281 µs of CPU a fetch through urllib3's
pool, 123 on these connections.

What the layers gave is kept:

- **The network policy**: a connection goes only to an address the fetch's policy permits
  (``fetchers.netguard.connect_pinned``); a kept-alive one is checked again for each request.
- **Time**: each read waits no longer than the earliest of the read timeout since the last byte,
  the total deadline and the next check of the head's rate floor; no watchdog thread.
- **Size**: a head up to ``MAX_HEAD_BYTES`` and ``MAX_HEADERS`` fields; a body decoded (one gzip or
  deflate coding) at most ``n`` bytes per ``read1(n)``, so the fetcher's cap bounds a bomb.
- **TLS** verified against certifi's bundle as requests verifies it; **the target as written**
  (``fetchers.targets``); a kept-alive connection its server closed costs a retry on a new one.

Proxied requests keep requests' adapter (``fetchers.static``).
"""

from __future__ import annotations

import re
import select
import socket
import ssl
import struct
import sys
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import certifi
import httptools
from urllib3.util.ssl_ import create_urllib3_context

from fetchers.codings import decoders_for
from fetchers.netguard import Resolver, connect_pinned, current_policy, note_connection_opened
from fetchers.rate_floor import RateFloor

__all__ = ["ACCEPT_ENCODING", "MAX_HEADERS", "MAX_HEAD_BYTES", "Budget", "Connections", "WireError", "WireResponse"]

MAX_HEAD_BYTES = 256 * 1024
"""A response head (status line and fields) larger than this is refused (``bad_response``)."""
MAX_HEADERS = 256
ACCEPT_ENCODING = "gzip, deflate"  # what ``read1`` decodes
_RECV = 64 * 1024
_FLOOR_CHECK_S = 0.5  # while a head arrives: how often its rate floor is checked at most
_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\r\n\x00]")
_NO_BODY = frozenset({204, 304})
# The kernel stamps each packet's arrival (SO_TIMESTAMPNS, Linux; Python names no constant for it).
_TIMESTAMPNS = 35 if sys.platform == "linux" else None
_STAMP_SPACE = socket.CMSG_SPACE(16)  # one struct timespec


class WireError(Exception):
    """A request that failed; ``reason`` is the static fetcher's: ``connect_timeout``, ``timeout``,
    ``total_timeout``, ``slow_head``, ``dns_error`` (the host name did not resolve), ``connection_error``,
    ``incomplete_body``, ``tls_error``, ``bad_response``, ``bad_request``, ``bad_encoding``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class _Stale(Exception):
    """A kept-alive connection was closed by its server before this request's response began."""


class _AfterResponse(Exception):
    """Bytes after the response: llhttp would parse them as the next one; they end the connection."""


@dataclass(slots=True)
class Budget:
    """The time a request may take: ``deadline`` on ``clock``; each read ``read_s`` since the last
    byte; a begun head at least ``head_rate`` bytes/s over any ``head_window_s`` (0: no floor)."""

    connect_s: float
    read_s: float
    deadline: float
    head_rate: float = 0.0
    head_window_s: float = 0.0
    clock: Callable[[], float] = time.monotonic


class _Connection:
    __slots__ = ("address", "key", "reused", "sock", "stamped")

    def __init__(self, sock: socket.socket, key: tuple[str, str, int], address: str, stamped: bool) -> None:
        self.sock, self.key, self.address, self.reused, self.stamped = sock, key, address, False, stamped

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def dropped(self) -> bool:
        """True if the idle connection is readable: its server closed it (or sent what nobody asked)."""
        try:
            poller = select.poll()  # not select(): a worker may hold more than 1,024 descriptors
            poller.register(self.sock, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True


class Connections:
    """Kept-alive connections by origin (``per_host`` each, for ``hosts`` origins at most), shared by
    a process's threads; ``get`` sends a GET and returns its response once its head is read."""

    def __init__(self, resolver: Resolver = socket.getaddrinfo, per_host: int = 32, hosts: int = 512,
                 ca_file: str | None = None) -> None:  # fmt: skip
        self._resolver, self._per_host, self._hosts = resolver, per_host, hosts
        self._idle: OrderedDict[tuple[str, str, int], list[_Connection]] = OrderedDict()
        self._lock = threading.Lock()
        self._ca_file = ca_file or certifi.where()
        self._tls: ssl.SSLContext | None = None

    def get(self, url: str, headers: Mapping[str, str], budget: Budget) -> WireResponse:
        """GET ``url`` (fragment dropped) with ``headers``; no redirect is followed.

        Raises:
            WireError: the request could not be sent or its head not read.
            fetchers.netguard.BlockedAddress: the policy refuses every address of the host.
        """
        key, host_header, target = _parts(url)
        request = _request_bytes(target, host_header, headers)
        for attempt in range(2):
            # A retry goes on a new connection: another kept one may have been closed too.
            conn = (None if attempt else self._checkout(key)) or self._connect(key, budget)
            try:
                return self._exchange(conn, url, request, headers, budget)
            except _Stale:
                conn.close()
                if attempt:
                    raise WireError("connection_error", "closed by the server before its response") from None
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")

    def _exchange(self, conn: _Connection, url: str, request: bytes, headers: Mapping[str, str],
                  budget: Budget) -> WireResponse:  # fmt: skip
        try:
            conn.sock.settimeout(max(0.001, min(budget.read_s, budget.deadline - budget.clock())))
            conn.sock.sendall(request)
            # Taken after the send: a thread switch before it would count a wait for the GIL as the server's.
            sent_at = time.time()  # the kernel's stamps are wall-clock time
        except TimeoutError:
            raise WireError("timeout", "sending the request") from None
        except OSError as exc:
            if conn.reused:
                raise _Stale() from exc
            raise WireError("connection_error", str(exc)) from exc
        response = WireResponse(conn, self, url, headers, budget)
        response.read_head(sent_at)
        return response

    def _checkout(self, key: tuple[str, str, int]) -> _Connection | None:
        policy = current_policy()
        while True:
            with self._lock:
                idle = self._idle.get(key)
                if not idle:
                    return None
                conn = idle.pop()
            if policy.permits(conn.address) and not conn.dropped():
                conn.reused = True
                return conn
            conn.close()  # closed by its server, or not for this request's policy: a new one

    def close(self) -> None:
        """Close the kept-alive connections (a request after this opens new ones)."""
        with self._lock:
            idle, self._idle = self._idle, OrderedDict()
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def checkin(self, conn: _Connection) -> None:
        """Keep ``conn`` for the next request to its origin (the least recently used origin's go)."""
        evicted: list[_Connection] = []
        with self._lock:
            idle = self._idle.get(conn.key)
            if idle is None:
                idle = self._idle[conn.key] = []
                while len(self._idle) > self._hosts:
                    evicted += self._idle.popitem(last=False)[1]
            else:
                self._idle.move_to_end(conn.key)
            if len(idle) < self._per_host:
                idle.append(conn)
            else:
                evicted.append(conn)
        for old in evicted:
            old.close()

    def _connect(self, key: tuple[str, str, int], budget: Budget) -> _Connection:
        scheme, host, port = key
        timeout = max(0.001, min(budget.connect_s, budget.deadline - budget.clock()))
        options = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        try:
            sock = connect_pinned(host, port, current_policy(), self._resolver, timeout, socket_options=options)
        except socket.gaierror as exc:
            raise WireError("dns_error", f"{host} did not resolve: {exc}") from exc
        except TimeoutError as exc:
            raise WireError("connect_timeout", f"{host}:{port}") from exc
        except OSError as exc:
            raise WireError("connection_error", f"{host}:{port}: {exc}") from exc
        address = sock.getpeername()[0]
        note_connection_opened()
        stamped = False
        if scheme == "http" and _TIMESTAMPNS is not None:  # an SSLSocket has no recvmsg
            try:
                sock.setsockopt(socket.SOL_SOCKET, _TIMESTAMPNS, 1)
                stamped = True
            except OSError:
                pass
        if scheme == "https":
            try:
                sock = self._tls_context().wrap_socket(sock, server_hostname=host.strip("[]"))
            except TimeoutError as exc:
                sock.close()
                raise WireError("connect_timeout", f"TLS handshake with {host}:{port}") from exc
            except ssl.SSLError as exc:
                sock.close()
                raise WireError("tls_error", str(exc)) from exc
            except OSError as exc:
                sock.close()
                raise WireError("connection_error", f"TLS handshake with {host}:{port}: {exc}") from exc
        return _Connection(sock, key, address, stamped)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            context = create_urllib3_context()  # urllib3's defaults: TLS 1.2 at least, its ciphers
            context.load_verify_locations(cafile=self._ca_file)
            context.check_hostname = True
            self._tls = context
        return self._tls


class WireResponse:
    """A response: ``status_code``, ``reason``, ``headers`` (lower-case names, repeats joined by ", ")
    once its head is read; ``read1`` reads its body. Its connection goes back to the pool as soon as
    the whole response has arrived; ``close`` drops it if it has not."""

    __slots__ = (
        "_arrived_at", "_budget", "_chunks", "_complete", "_conn", "_decoders", "_eof_ends", "_head_bytes",
        "_head_done", "_interim", "_keep_alive", "_parser", "_pool", "answer_s", "headers", "ip", "reason",
        "request", "status_code", "url")  # fmt: skip

    def __init__(self, conn: _Connection, pool: Connections, url: str, sent: Mapping[str, str], budget: Budget) -> None:
        self._conn: _Connection | None = conn
        self._pool, self._budget, self.url, self.ip = pool, budget, url, conn.address
        self.request = SimpleNamespace(headers=sent)
        self.answer_s: float | None = None  # see read_head
        self._arrived_at: float | None = None
        self.status_code, self.reason, self.headers = 0, "", {}
        self._chunks: list[bytes] = []
        self._head_bytes, self._head_done, self._interim, self._complete = 0, False, False, False
        self._keep_alive, self._eof_ends = False, False
        self._decoders: list[Any] = []
        self._parser = httptools.HttpResponseParser(self)
        # Browsers read a bare LF as a line end; llhttp refuses it unless told.
        self._parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True)

    # -- llhttp's callbacks
    def on_message_begin(self) -> None:
        if self._complete:
            raise _AfterResponse()

    def on_status(self, status: bytes) -> None:
        self.reason = status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_HEADERS:
            raise WireError("bad_response", f"more than {MAX_HEADERS} header fields")
        key, text = name.decode("latin-1").lower(), value.decode("latin-1").strip(" \t")
        old = self.headers.get(key)
        self.headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # an interim response: the real one follows
            self._interim = True
            return
        self.status_code, self._head_done = status, True
        self._keep_alive = self._parser.should_keep_alive()
        headers = self.headers
        self._eof_ends = (status not in _NO_BODY and "content-length" not in headers
                          and "chunked" not in headers.get("transfer-encoding", "").lower())  # fmt: skip
        self._decoders = decoders_for(headers.get("content-encoding", ""))  # type: ignore[assignment]

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim, self.headers, self.reason = False, {}, ""
            return
        self._complete = True

    # -- reading
    def read_head(self, sent_at: float | None = None) -> None:
        """Read until the head is complete (some of the body may come with it); ``answer_s``: from
        ``sent_at`` (``time.time()``) to the arrival of the first byte, as the kernel stamped it."""
        floor: RateFloor | None = None
        budget = self._budget
        while not self._head_done:
            stamp = sent_at is not None and self._head_bytes == 0 and self._conn is not None and self._conn.stamped
            data = self._recv(floor, "head", stamp)
            if stamp and self._arrived_at is not None:
                self.answer_s = max(0.0, self._arrived_at - sent_at)
            if not data:
                if self._head_bytes == 0 and self._conn is not None and self._conn.reused:
                    raise _Stale()
                raise WireError("connection_error", "the connection closed before the response's head")
            if floor is None and budget.head_rate > 0 and budget.head_window_s > 0:
                floor = RateFloor(budget.head_rate, budget.head_window_s, budget.clock())
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self._head_done:
                raise WireError("bad_response", f"a head over {MAX_HEAD_BYTES} bytes")
            self._feed(data, "bad_response")
            if floor is not None and not self._head_done and floor.too_slow(budget.clock(), self._head_bytes):
                raise WireError("slow_head", f"{self._head_bytes} bytes of head")
        if self._decoders is None:
            raise WireError("bad_encoding", f"stacked content codings: {self.headers['content-encoding'][:100]}")
        if self._complete:
            self._release()

    def read1(self, n: int) -> bytes:
        """Up to ``n`` bytes of the decoded body, b"" at its end.

        Raises:
            WireError: ``timeout``, ``total_timeout``, ``incomplete_body``, ``bad_encoding``.
        """
        while True:
            if self._decoders and (pending := self._decoders[0].unconsumed_tail):
                return self._decode(pending, n)
            if self._chunks:
                data = self._chunks.pop(0)
                if len(data) > n and not self._decoders:
                    self._chunks.insert(0, data[n:])
                    data = data[:n]
                if self._decoders:
                    if out := self._decode(data, n):
                        return out
                    continue
                return data
            if self._complete:
                self._release()
                return self._flush()
            data = self._recv(None, "body")
            if not data:
                self._close()
                if self._eof_ends:
                    self._complete = True
                    return self._flush()
                raise WireError("incomplete_body", "the connection closed before the body's end")
            self._feed(data, "incomplete_body")

    def close(self) -> None:
        """Done with the response: its connection goes back if it was read to the end, else it is dropped."""
        if self._complete:
            self._release()
        else:
            self._close()

    def _recv(self, floor: RateFloor | None, what: str, stamp: bool = False) -> bytes:
        conn, budget = self._conn, self._budget
        assert conn is not None
        clock = budget.clock
        started = clock()
        while True:
            now = clock()
            left = budget.deadline - now
            if left <= 0:
                raise WireError("total_timeout", f"reading the {what}")
            wait = min(budget.read_s - (now - started), left)
            if floor is not None:
                wait = min(wait, _FLOOR_CHECK_S)
            if wait <= 0:
                raise WireError("timeout", f"reading the {what}")
            try:
                conn.sock.settimeout(wait)
                if not stamp:
                    return conn.sock.recv(_RECV)
                data, ancillary, _, _ = conn.sock.recvmsg(_RECV, _STAMP_SPACE)
                for level, kind, value in ancillary:
                    if level == socket.SOL_SOCKET and kind == _TIMESTAMPNS and len(value) >= 16:
                        seconds, nanoseconds = struct.unpack("qq", value[:16])
                        self._arrived_at = seconds + nanoseconds / 1e9
                return data
            except TimeoutError:
                if floor is not None and floor.too_slow(clock(), self._head_bytes):
                    raise WireError("slow_head", f"{self._head_bytes} bytes of head") from None
            except ssl.SSLError as exc:
                raise WireError("connection_error", str(exc)) from exc
            except OSError as exc:
                if what == "head" and self._head_bytes == 0 and conn.reused:
                    raise _Stale() from exc
                raise WireError("connection_error" if what == "head" else "incomplete_body", str(exc)) from exc

    def _feed(self, data: bytes, broken: str) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _AfterResponse):
                self._keep_alive = False
                return
            if isinstance(exc.__context__, WireError):  # a callback's own refusal (too many fields)
                raise exc.__context__ from None
            raise
        except httptools.HttpParserError as exc:
            if not self._complete:
                # The head whole (a broken body may come in its segment): the body's fault.
                raise WireError("incomplete_body" if self._head_done else broken, str(exc)) from exc
            self._keep_alive = False  # bytes after the response: the connection is not reused

    def _decode(self, data: bytes, n: int) -> bytes:
        try:
            return self._decoders[0].decompress(data, n)
        except zlib.error as exc:
            raise WireError("bad_encoding", str(exc)) from exc

    def _flush(self) -> bytes:
        try:
            return self._decoders[0].flush() if self._decoders else b""
        except zlib.error as exc:
            raise WireError("bad_encoding", str(exc)) from exc
        finally:
            self._decoders = []

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._keep_alive:
                self._pool.checkin(conn)
            else:
                conn.close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _parts(url: str) -> tuple[tuple[str, str, int], str, str]:
    """(scheme, host, port), the Host header's value and the request target of ``url``.

    >>> _parts("http://h.test:8080/a%2zb[c]?#f")
    (('http', 'h.test', 8080), 'h.test:8080', '/a%2zb[c]?')
    >>> _parts("https://user@[::1]/")
    (('https', '[::1]', 443), '[::1]', '/')
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WireError("bad_request", str(exc)) from exc
    scheme, host = parts.scheme, parts.hostname
    if scheme not in ("http", "https") or not host:
        raise WireError("bad_request", f"not an http(s) URL: {url[:200]}")
    default = 443 if scheme == "https" else 80
    if ":" in host:
        host = f"[{host}]"
    host_header = host if port in (None, default) else f"{host}:{port}"
    rest = url.partition("#")[0].partition("://")[2]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i != -1), default=len(rest))
    target = rest[cut:] or "/"
    if target.startswith("?"):
        target = "/" + target
    return (scheme, host, port or default), host_header, target


def _request_bytes(target: str, host_header: str, headers: Mapping[str, str]) -> bytes:
    """The request's head; a target or field that would break its framing is refused (``bad_request``)."""
    if not target.isascii() or _BAD_TARGET.search(target):
        raise WireError("bad_request", f"a target with a space, control or non-ASCII character: {target[:200]!r}")
    lines = [f"GET {target} HTTP/1.1", f"Host: {host_header}"]
    for name, value in headers.items():
        if name.lower() == "host":
            continue
        if not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
            raise WireError("bad_request", f"an invalid header field {name[:100]!r}")
        lines.append(f"{name}: {value}")
    try:
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError as exc:
        raise WireError("bad_request", "a header field outside latin-1") from exc
