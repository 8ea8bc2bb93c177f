"""The browser's egress guard: a small HTTP proxy on loopback that Chromium must send everything through.

Chromium is started with ``--proxy-server`` pointing here (and ``<-loopback>`` in its bypass
list, so loopback is not exempt). Every navigation, redirect, sub-resource, XHR/fetch and
WebSocket arrives here as an absolute-form request or a CONNECT tunnel, and goes on only to an
address the network policy permits: the name is resolved once and the connection goes to the
checked address (``fetchers.netguard.connect_pinned``). A refused CONNECT is answered 403; a
refused plain request is closed unanswered. Either way Chromium sees a network error, and the
guard remembers the refused target so the fetcher can report ``blocked_address``.

With an upstream proxy, the guard checks the target by resolving it and forwards to that proxy
(a job's proxy must itself be at an address the cluster allows). Each client connection
carries one request (``Connection: close``); connections, threads and waits are bounded, and
``close()`` cuts whatever is still open.
"""

from __future__ import annotations

import base64
import http.client
import http.server
import logging
import select
import socket
import socketserver
import ssl
import threading
import time
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

from fetchers.netguard import PUBLIC_ONLY, BlockedAddress, NetworkPolicy, Resolver, check_target, connect_pinned

__all__ = ["EgressGuard"]

logger = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te", "trailer",
    "transfer-encoding", "upgrade",
})  # fmt: skip
_MAX_HEAD_BYTES = 64 * 1024
_MAX_INTERIM = 5  # 1xx responses (103 Early Hints) passed on before the final one
_CHUNK = 64 * 1024


class _UpstreamRefused(OSError):
    """The upstream proxy would not open a tunnel."""


class EgressGuard:
    """A policy-enforcing forward proxy on 127.0.0.1 for one browser."""

    def __init__(
        self,
        policy: NetworkPolicy = PUBLIC_ONLY,
        upstream: str | None = None,
        resolver: Resolver = socket.getaddrinfo,
        connect_timeout_s: float = 10.0,
        idle_timeout_s: float = 30.0,
        max_lifetime_s: float = 300.0,
        max_connections: int = 64,
    ) -> None:
        self._policy = policy
        self._upstream = upstream
        self._resolver = resolver
        self.connect_timeout_s, self.idle_timeout_s, self.max_lifetime_s = (
            connect_timeout_s, idle_timeout_s, max_lifetime_s,
        )  # fmt: skip
        self._lock = threading.Lock()
        self._refused: set[tuple[str, int]] = set()
        self._open: set[socket.socket] = set()
        self._server = _Server(self, max_connections)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="vcrawl-egress", daemon=True
        )

    @property
    def url(self) -> str:
        """The proxy URL to give Chromium."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> EgressGuard:
        """Start serving in a thread; return self."""
        self._thread.start()
        return self

    def begin(self, policy: NetworkPolicy) -> None:
        """Apply ``policy`` from now on (one page at a time) and forget earlier refusals."""
        with self._lock:
            self._policy = policy
            self._refused.clear()

    def was_refused(self, url: str) -> bool:
        """True if a request to ``url``'s host and port was refused since ``begin``."""
        try:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme in ("https", "wss") else 80)
        except ValueError:
            return False
        with self._lock:
            return ((parts.hostname or "").lower(), port) in self._refused

    def close(self) -> None:
        """Stop serving and cut every connection still open."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        with self._lock:
            open_sockets, self._open = list(self._open), set()
        for sock in open_sockets:
            _close(sock)
        self._thread.join(5)

    def open(self, host: str, port: int, tunnel: bool) -> socket.socket:
        """A connection on which to send the request for ``host:port`` (a tunnel to it, if ``tunnel``).

        Raises:
            BlockedAddress: the policy refuses the target (nothing was sent to it).
            OSError: no connection (a refused tunnel, a timeout, no such host).
        """
        with self._lock:
            policy = self._policy
        if self._upstream is None:
            sock = connect_pinned(host, port, policy, self._resolver, self.connect_timeout_s)
        else:
            check_target(host, port, policy, self._resolver)
            sock = self._connect_upstream(policy)
            if tunnel:
                self._upstream_tunnel(sock, host, port)
        self.track(sock)
        return sock

    def refuse(self, host: str, port: int, exc: BlockedAddress) -> None:
        """Remember a refused target (the fetcher reports ``blocked_address`` for its page)."""
        logger.info("browser request to %s port %d refused: %s", host, port, exc)
        with self._lock:
            self._refused.add((host.strip("[]").lower(), port))

    def track(self, sock: socket.socket) -> None:
        """Cut ``sock`` when the guard closes."""
        sock.settimeout(self.idle_timeout_s)
        with self._lock:
            self._open.add(sock)

    def untrack(self, sock: socket.socket) -> None:
        """Close ``sock`` and forget it."""
        with self._lock:
            self._open.discard(sock)
        _close(sock)

    def upstream_headers(self) -> list[str]:
        """Header lines for the upstream proxy (its credentials, if its URL has them)."""
        parts = urlsplit(self._upstream or "")
        if parts.username is None:
            return []
        token = base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()).decode()
        return [f"Proxy-Authorization: Basic {token}"]

    @property
    def upstream(self) -> str | None:
        """The upstream proxy's URL, if any."""
        return self._upstream

    def _connect_upstream(self, policy: NetworkPolicy) -> socket.socket:
        parts = urlsplit(self._upstream or "")
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        if policy.trusts(self._upstream):
            sock = socket.create_connection((host, port), self.connect_timeout_s)
        else:  # a job's proxy: anywhere the cluster allows
            sock = connect_pinned(host, port, policy.ceiling(), self._resolver, self.connect_timeout_s)
        if parts.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        return sock

    def _upstream_tunnel(self, sock: socket.socket, host: str, port: int) -> None:
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}", *self.upstream_headers()]
        sock.settimeout(self.connect_timeout_s)
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = _read_head(sock)
        status = head.split(b" ", 2)[1] if head.count(b" ") >= 1 else b""
        if not status.startswith(b"2"):
            _close(sock)
            raise _UpstreamRefused(f"upstream proxy answered {status.decode('latin-1', 'replace')!r} to CONNECT")


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, guard: EgressGuard, max_connections: int) -> None:
        self.guard = guard
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # Chromium opens at most 32 per proxy; this is a runaway
            logger.warning("egress guard: connection limit reached; a browser connection was refused")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("egress guard: a connection failed", exc_info=True)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(http.server.BaseHTTPRequestHandler):
    """One request per connection: a CONNECT tunnel or an absolute-form http:// request."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.guard.track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.guard.untrack(self.connection)

    def handle(self) -> None:
        self.close_connection = True
        try:
            self.handle_one_request()
        except (OSError, http.client.HTTPException) as exc:  # a side went away or broke the protocol
            logger.debug("egress guard: %s %s ended: %r", self.command, self.path, exc)

    def handle_one_request(self) -> None:
        self.raw_requestline = self.rfile.readline(65537)
        if not self.raw_requestline or not self.parse_request():
            return
        if self.command == "CONNECT":
            self._tunnel()
        else:
            self._forward()

    def _tunnel(self) -> None:
        try:
            parts = urlsplit(f"//{self.path}")
            host, port = parts.hostname or "", parts.port
        except ValueError:
            host, port = "", None
        if not host or port is None:
            self._answer(400, "Bad Request")
            return
        guard = self.server.guard
        try:
            upstream = guard.open(host, port, tunnel=True)
        except BlockedAddress as exc:
            guard.refuse(host, port, exc)
            self._answer(403, "Forbidden")
            return
        except OSError as exc:
            logger.debug("egress guard: no tunnel to %s:%s: %r", host, port, exc)
            self._answer(502, "Bad Gateway")
            return
        try:
            self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.wfile.flush()
            _relay(self.connection, upstream, guard.idle_timeout_s, time.monotonic() + guard.max_lifetime_s)
        finally:
            guard.untrack(upstream)

    def _forward(self) -> None:
        try:
            parts = urlsplit(self.path)
            host, port = parts.hostname or "", parts.port or 80
        except ValueError:
            host, port, parts = "", 0, urlsplit("")
        if parts.scheme != "http" or not host:
            self._answer(400, "Bad Request")
            return
        if "transfer-encoding" in self.headers:  # Chromium sends bodies with a length
            self._answer(501, "Not Implemented")
            return
        if not (self.headers.get("content-length") or "0").isdigit():
            self._answer(400, "Bad Request")
            return
        guard = self.server.guard
        try:
            upstream = guard.open(host, port, tunnel=False)
        except BlockedAddress as exc:
            guard.refuse(host, port, exc)
            return  # closed unanswered: a network error for the page, not a response it could store
        except OSError as exc:
            logger.debug("egress guard: no connection to %s:%s: %r", host, port, exc)
            self._answer(502, "Bad Gateway")
            return
        try:
            self._exchange(upstream, parts)
        finally:
            guard.untrack(upstream)

    def _exchange(self, upstream: socket.socket, parts: Any) -> None:
        guard = self.server.guard
        if guard.upstream is None:
            target = parts.path or "/"
            target += f"?{parts.query}" if parts.query else ""
            extra: list[str] = []
        else:
            target, extra = self.path, guard.upstream_headers()
        listed = {name.strip().lower() for value in self.headers.get_all("connection", []) for name in value.split(",")}
        lines = [f"{self.command} {target} HTTP/1.1"]
        lines += [f"{name}: {value}" for name, value in self.headers.items()
                  if name.lower() not in _HOP_BY_HOP and name.lower() not in listed]  # fmt: skip
        lines += [*extra, "Connection: close"]
        upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        _copy(self.rfile, upstream, int(self.headers.get("content-length") or 0))
        replies = upstream.makefile("rb")
        try:
            for _ in range(_MAX_INTERIM + 1):
                status, headers, head = _response_head(replies)
                self.wfile.write(head)
                self.wfile.flush()
                if not 100 <= status < 200:
                    break
            else:
                return
            if self.command == "HEAD" or status in (204, 304):
                return
            length = headers.get("content-length")
            if length is not None and "transfer-encoding" not in headers and length.isdigit():
                _copy(replies, self.connection, int(length))
            else:
                _copy(replies, self.connection, None)
        finally:
            replies.close()

    def _answer(self, status: int, reason: str) -> None:
        self.wfile.write(f"HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("egress guard: " + format, *args)


def _response_head(replies: BinaryIO) -> tuple[int, http.client.HTTPMessage, bytes]:
    """Read a response head; return its status, headers and the head to pass on (hop-by-hop dropped)."""
    status_line = replies.readline(_MAX_HEAD_BYTES)
    fields = status_line.split(None, 2)
    if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
        raise http.client.BadStatusLine(status_line.decode("latin-1", "replace"))
    headers = http.client.parse_headers(replies)  # type: ignore[arg-type]  # at most 100 lines of 64 KiB
    listed = {name.strip().lower() for value in headers.get_all("connection", []) for name in value.split(",")}
    lines = [status_line.rstrip(b"\r\n").decode("latin-1")]
    lines += [f"{name}: {value}" for name, value in headers.items()
              if name.lower() not in _HOP_BY_HOP - {"transfer-encoding"} and name.lower() not in listed]  # fmt: skip
    status = int(fields[1])
    if not 100 <= status < 200:
        lines.append("Connection: close")
    return status, headers, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _read_head(sock: socket.socket) -> bytes:
    """Read up to the blank line after a response head, byte by byte (nothing after it is consumed)."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        if not byte or len(head) > _MAX_HEAD_BYTES:
            raise _UpstreamRefused("upstream proxy closed or sent an oversized head")
        head += byte
    return head


def _copy(source: Any, target: socket.socket, length: int | None) -> None:
    """Copy ``length`` bytes (None: until end of stream) from a file or socket to ``target``."""
    left = length
    while left is None or left > 0:
        want = _CHUNK if left is None else min(_CHUNK, left)
        chunk = source.read1(want) if hasattr(source, "read1") else source.recv(want)
        if not chunk:
            return
        target.sendall(chunk)
        if left is not None:
            left -= len(chunk)


def _relay(client: socket.socket, upstream: socket.socket, idle_s: float, until: float) -> None:
    """Pass bytes both ways until a side closes, nothing moves for ``idle_s``, or ``until`` passes."""
    peers = {client: upstream, upstream: client}
    while time.monotonic() < until:
        # A TLS upstream (an https proxy) may hold decrypted bytes select() cannot see.
        pending = [sock for sock in peers if isinstance(sock, ssl.SSLSocket) and sock.pending()]
        ready = pending or select.select(list(peers), [], [], idle_s)[0]
        if not ready:
            return
        for sock in ready:
            data = sock.recv(_CHUNK)
            if not data:
                return
            peers[sock].sendall(data)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected, or already shut
    sock.close()
