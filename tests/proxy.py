"""A small threaded forward proxy on loopback for tests: it forwards, refuses, fails or stops on cue.

It takes absolute-form requests (``GET http://host:port/path HTTP/1.1``), forwards them to the
origin with http.client and passes the answer back, keeping connections alive like a real proxy;
an origin it cannot reach gets a 502 with ``Proxy-Status: ...; error=connection_refused``.
``mode`` makes it answer every request itself instead: ``"auth"`` (407, also to CONNECT) or
``"fail"`` (502 with a ``Proxy-Status`` naming a proxy-side error, RFC 9209). Any other CONNECT
gets ``connect_status``: there is no tunnelling. ``stop()`` closes the listening socket and cuts
every connection, so new connections are refused; ``start()`` listens on the same port again.
``stop_after=N`` stops it (once) as it forwards the Nth origin answer; that answer still goes
out, with ``Connection: close``, so a test can stop it mid-crawl at an exact point.
``delay_s`` makes it wait that long before forwarding each request (a slow proxy);
``forwarded_for=True`` tells the origin the client's address in ``X-Forwarded-For`` (a transparent
proxy). It connects to origins from its own address (``host``), as a proxy on another machine would.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

_HOP_BY_HOP = frozenset(
    "connection keep-alive proxy-connection proxy-authorization proxy-authenticate te trailer transfer-encoding "
    "upgrade content-length".split()
)
_MAX_BODY = 8 * 1024 * 1024
_MAX_HEADERS = 100
_MAX_REQUESTS_PER_CONNECTION = 10_000


@dataclass(frozen=True)
class ProxiedRequest:
    """A request as the proxy saw it, and the status it answered."""

    method: str
    target: str
    status: int
    at: float  # time.monotonic()
    forwarded: bool = False  # an origin answered, and its answer reached the client


class ForwardProxy:
    """A forward HTTP proxy on ``host`` (a free port unless given); use as a context manager."""

    __test__ = False

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        mode: str = "forward",
        connect_status: int = 501,
        stop_after: int | None = None,
        timeout_s: float = 5.0,
        delay_s: float = 0.0,
        forwarded_for: bool = False,
    ) -> None:
        if mode not in ("forward", "auth", "fail"):
            raise ValueError(f"unknown mode {mode!r}")
        self.mode, self.connect_status, self.stop_after = mode, connect_status, stop_after
        self._host, self._port, self._timeout_s = host, port, timeout_s
        self.delay_s, self.forwarded_for = delay_s, forwarded_for
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._handlers: list[threading.Thread] = []
        self.seen: list[ProxiedRequest] = []
        self._answered = 0  # origin answers, for stop_after
        self.stopped = threading.Event()  # set by every stop(), cleared by start()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: what a job lists in ``proxies``."""
        return f"http://{self._host}:{self._port}"

    @property
    def forwarded(self) -> int:
        """Origin answers the proxy passed on to its client."""
        with self._lock:
            return sum(1 for seen in self.seen if seen.forwarded)

    def start(self) -> ForwardProxy:
        """Listen (again: on the same port)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self._host, self._port))
        listener.listen(64)
        self._port = listener.getsockname()[1]
        self._listener = listener
        self.stopped.clear()
        self._acceptor = threading.Thread(target=self._accept, args=(listener,), name="test-proxy", daemon=True)
        self._acceptor.start()
        return self

    def stop(self, keep: socket.socket | None = None) -> None:
        """Stop listening and cut every connection (but ``keep``): new connections are refused."""
        with self._lock:
            listener, self._listener = self._listener, None
            connections = [conn for conn in self._connections if conn is not keep]
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes accept() and refuses at once (Linux)
            except OSError:
                pass
            listener.close()
        for conn in connections:
            _close(conn)
        self.stopped.set()
        if self._acceptor is not None and self._acceptor is not threading.current_thread():
            self._acceptor.join(5)

    def __enter__(self) -> ForwardProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        for handler in list(self._handlers):
            if handler is not threading.current_thread():
                handler.join(5)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # stopped
            with self._lock:
                if self._listener is not listener:
                    _close(conn)
                    return
                self._connections.add(conn)
            handler = threading.Thread(target=self._serve, args=(conn,), name="test-proxy-conn", daemon=True)
            self._handlers = [h for h in self._handlers if h.is_alive()] + [handler]
            handler.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(self._timeout_s)
        reader = conn.makefile("rb")
        try:
            for _ in range(_MAX_REQUESTS_PER_CONNECTION):
                request = _read_request(reader)
                if request is None or self.stopped.is_set():
                    return
                method, target, headers = request
                if not self._answer(conn, method, target, headers):
                    return
        except OSError:
            return
        finally:
            reader.close()
            with self._lock:
                self._connections.discard(conn)
            _close(conn)

    def _answer(self, conn: socket.socket, method: str, target: str, headers: dict[str, str]) -> bool:
        """Answer one request; False to close the connection."""
        if method == "CONNECT":
            status = 407 if self.mode == "auth" else self.connect_status
            self._record(method, target, status)
            _send(conn, status, {}, b"")
            return False
        if self.mode == "auth":
            self._record(method, target, 407)
            _send(conn, 407, {"Proxy-Authenticate": 'Basic realm="test-proxy"'}, b"proxy auth required")
            return True
        if self.mode == "fail":
            self._record(method, target, 502)
            _send(conn, 502, {"Proxy-Status": "test-proxy; error=proxy_internal_error"}, b"proxy broken")
            return True
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.forwarded_for:
            headers = {**headers, "X-Forwarded-For": conn.getpeername()[0]}
        status, answer_headers, body, forwarded = self._forward(target, headers)
        with self._lock:
            self._answered += forwarded
            last = forwarded and self.stop_after is not None and self._answered >= self.stop_after
            if last:
                self.stop_after = None  # once: a restarted proxy keeps going
        if last:
            self.stop(keep=conn)  # refused from now on; this answer still goes out
            answer_headers["Connection"] = "close"
        delivered = False
        try:
            _send(conn, status, answer_headers, body)
            delivered = True
        finally:  # an answer cut by stop() never reached the client: not forwarded
            self._record(method, target, status, forwarded and delivered)
        return not last

    def _forward(self, target: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes, bool]:
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            return 400, {}, b"absolute-form http URL expected", False
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        origin = http.client.HTTPConnection(
            parts.hostname, parts.port or 80, timeout=self._timeout_s, source_address=(self._host, 0)
        )
        try:
            origin.request("GET", path, headers={k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP})
            response = origin.getresponse()
            body = response.read(_MAX_BODY)
            kept = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP}
            kept["Via"] = "1.1 test-proxy"
            return response.status, kept, body, True
        except OSError:  # the origin is down: the proxy says so (RFC 9209), which is the origin's trouble
            return 502, {"Proxy-Status": "test-proxy; error=connection_refused"}, b"", False
        finally:
            origin.close()

    def _record(self, method: str, target: str, status: int, forwarded: bool = False) -> None:
        with self._lock:
            self.seen.append(ProxiedRequest(method, target, status, time.monotonic(), forwarded))


def _read_request(reader: object) -> tuple[str, str, dict[str, str]] | None:
    line = reader.readline(65537)  # type: ignore[attr-defined]
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3:
        return None
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADERS):
        raw = reader.readline(65537)  # type: ignore[attr-defined]
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip()] = value.strip()
    return parts[0], parts[1], headers


def _send(conn: socket.socket, status: int, headers: dict[str, str], body: bytes) -> None:
    reason = http.client.responses.get(status, "Unknown")
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers.items()), f"Content-Length: {len(body)}"]
    conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


def _close(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()
