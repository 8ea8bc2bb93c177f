"""The job API on the wire: the standard library's threading HTTP server, with every read bounded.

Whoever can reach the port controls what arrives, so (docs/security.md, "Limits"):

- a request's body is read only once ``JobApi.handle`` has checked the origin and the token, and
  never past ``max_body_bytes``: a missing, negative or non-numeric ``Content-Length`` is a 400,
  a longer one a 413 without reading it; a chunked body is counted as it comes;
- a request (its line, headers and body) must arrive within ``request_timeout_s`` of its first
  byte, or of the previous answer on a kept-alive connection; a per-read timeout alone would let a
  client dripping one byte every few seconds hold a thread for ever;
- at most ``max_connections`` connections are served at once, ``max_connections_per_address`` from
  one client address; one more is answered 429 and closed; a client that showed no token gets no
  keep-alive (``JobApi`` answers it with ``Connection: close``), so it cannot sit on a connection;
- an answer given before the body was read (401, 413, ...) is followed by a bounded drain of what
  the client still sends (a "lingering close", as nginx does), so the client reads the answer
  instead of a connection reset.

The server has no third-party dependency: servers that buffer whole bodies before the
application sees them (waitress, the WSGI reference server) cannot refuse one before reading it.
"""

from __future__ import annotations

import io
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from api.server import JobApi, RequestRefused, json_response, loggable

__all__ = ["HttpLimits", "make_server"]

logger = logging.getLogger(__name__)

_CHUNK_LINE_BYTES = 1024  # a chunk-size line with its extensions
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,8}")  # up to 4 GiB: past any body limit, never a huge int
_TRAILER_LINES = 32
_DRAIN_READ_BYTES = 64 * 1024
_REFUSAL_LOG_EVERY_S = 10.0
_ERROR_POLICY = "default-src 'none'; frame-ancestors 'none'"  # answers that bring no policy of their own
_SECRET_QUERY = re.compile(r"([?&](?:token|access_token)=)[^&\s\"]*", re.IGNORECASE)


@dataclass(frozen=True)
class HttpLimits:
    """What one client may cost the server (docs/security.md lists the defaults)."""

    max_body_bytes: int = 1024 * 1024
    request_timeout_s: float = 10.0  # a whole request, from its first byte (or the last answer) to its body's end
    max_connections: int = 64
    max_connections_per_address: int = 32  # so that one client cannot take every slot
    max_chunks: int = 65_536  # of a chunked body: tiny chunks would cost a parse each
    linger_s: float = 5.0  # draining an unread body after an early answer
    linger_read_s: float = 1.0  # ... ending sooner when the client sends nothing for this long


def make_server(api: JobApi, address: str, port: int, limits: HttpLimits | None = None) -> ThreadingHTTPServer:
    """A threading HTTP server answering with ``api`` (call ``serve_forever``; ``server_address`` has the port)."""
    handler = type("JobApiHandler", (_Handler,), {"api": api, "limits": limits or HttpLimits()})
    return _Server((address, port), handler, limits or HttpLimits())


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a stop does not wait for slow clients: their threads are bounded anyway
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], limits: HttpLimits) -> None:
        self._limits = limits
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}  # client address -> connections being served
        self._refused, self._refusal_logged = 0, -_REFUSAL_LOG_EVERY_S
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._take_slot(client_address[0]):
            _refuse_connection(request, self._limits)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give_slot(client_address[0])
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give_slot(client_address[0])

    def _take_slot(self, client: str) -> bool:
        limits = self._limits
        with self._lock:
            total, own = sum(self._open.values()), self._open.get(client, 0)
            if total < limits.max_connections and own < limits.max_connections_per_address:
                self._open[client] = own + 1
                return True
            self._refused += 1
            if (now := time.monotonic()) - self._refusal_logged >= _REFUSAL_LOG_EVERY_S:  # not a line per connection
                logger.warning("refused %d connection(s), the last from %s (%d open from it, %d in all)",
                               self._refused, client, own, total)  # fmt: skip
                self._refused, self._refusal_logged = 0, now
            return False

    def _give_slot(self, client: str) -> None:
        with self._lock:
            if (left := self._open.get(client, 1) - 1) > 0:
                self._open[client] = left
            else:
                self._open.pop(client, None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The socketserver default prints a traceback to stderr; a client that went away is no error.
        logger.debug("connection from %s ended: %r", client_address[0], sys.exc_info()[1])


def _refuse_connection(request: socket.socket, limits: HttpLimits) -> None:
    """Answer 429 on a connection over the limits, without waiting on the client."""
    body = (f'{{"error": "too many open connections (at most {limits.max_connections}, '
            f'{limits.max_connections_per_address} from one address); try again shortly"}}').encode()  # fmt: skip
    head = (f"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Retry-After: 1\r\nConnection: close\r\nX-Frame-Options: DENY\r\n"
            f"Content-Security-Policy: {_ERROR_POLICY}\r\n\r\n")  # fmt: skip
    try:
        request.setblocking(False)
        request.send(head.encode() + body)
    except OSError:
        pass


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each waiting no longer than what is left until ``deadline`` (monotonic)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self.deadline = float("inf")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request was not complete in time")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "vcrawl"
    sys_version = ""  # the Server header names no Python version
    api: JobApi
    limits: HttpLimits

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the plain socket file the base class made; ours waits no longer than the deadline
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + self.limits.request_timeout_s
        self._continue_due, self._own_policy = False, False
        super().handle_one_request()

    def handle_expect_100(self) -> bool:
        # "100 Continue" only once the request passed its checks (_Body.read): a client waiting for
        # it sends no body that would be refused anyway.
        self._continue_due = True
        return True

    def send_response(self, code: int, message: str | None = None) -> None:
        super().send_response(code, message)
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("X-Content-Type-Options", "nosniff")
        if not self._own_policy:  # the base class's own error pages (501, 505, 431, ...)
            self.send_header("Content-Security-Policy", _ERROR_POLICY)

    def _answer(self) -> None:
        body = _Body(self)
        try:
            status, headers, payload = self.api.handle(self.command, self.path, dict(self.headers.items()), body.read)
        except Exception:  # a bug or Redis trouble: answer 500, keep serving
            logger.exception("%s %s failed", self.command, _redacted(self.path))
            status, headers, payload = json_response(500, {"error": "internal error; see the server log"})
        unread = not body.done
        if unread or status in (HTTPStatus.REQUEST_TIMEOUT, HTTPStatus.BAD_REQUEST):
            headers = {**headers, "Connection": "close"}  # what follows cannot be told from a next request
        self.close_connection = self.close_connection or headers.get("Connection") == "close"
        self._own_policy = "Content-Security-Policy" in headers
        self.connection.settimeout(self.limits.request_timeout_s)  # the answer's write
        self.send_response(status, HTTPStatus(status).phrase)
        for name, value in {**headers, "Content-Length": str(len(payload))}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
        if unread and status != HTTPStatus.REQUEST_TIMEOUT:
            self._linger()

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = do_HEAD = _answer  # noqa: N815 - the base class's names

    def send_continue(self) -> None:
        """Send the interim "100 Continue" a client asked for, once."""
        if self._continue_due:
            self._continue_due = False
            self.send_response_only(HTTPStatus.CONTINUE)
            self.end_headers()

    def _linger(self) -> None:
        """Drain (and drop) what the client still sends for a while, so it reads the answer, not a reset."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
        except OSError:
            return
        scratch, end = bytearray(_DRAIN_READ_BYTES), time.monotonic() + self.limits.linger_s
        while (left := end - time.monotonic()) > 0:
            try:
                self.connection.settimeout(min(left, self.limits.linger_read_s))
                if not self.connection.recv_into(scratch):
                    return
            except OSError:
                return

    def log_message(self, format: str, *args: Any) -> None:
        logger.info("%s %s", self.address_string(), _redacted(format % args))


class _Body:
    """A request's body as its headers frame it, read on demand within the limits."""

    def __init__(self, handler: _Handler) -> None:
        self._handler = handler
        headers = handler.headers
        self._lengths = headers.get_all("Content-Length") or []
        self._codings = headers.get_all("Transfer-Encoding") or []
        # No body at all, or an empty one by its length
        self.done = not self._codings and all(value.strip() == "0" for value in self._lengths)

    def read(self) -> bytes:
        """The whole body (b"" without one).

        Raises:
            RequestRefused: 400 bad framing, 408 too slow, 413 too large, 501 a coding other than chunked.
        """
        if self.done:
            return b""
        limit = self._handler.limits.max_body_bytes
        read: Callable[[int], bytes]
        if self._codings:
            if self._lengths:
                raise RequestRefused(400, "both Content-Length and Transfer-Encoding: give one")
            coding = ",".join(self._codings).strip().lower()
            if coding != "chunked":
                raise RequestRefused(501, f"Transfer-Encoding {coding[:40]!r}: only chunked is supported")
            read = self._chunked
        else:
            length = self._length(limit)
            read = lambda _: self._exactly(length)  # noqa: E731
        self._handler.send_continue()
        try:
            data = read(limit)
        except TimeoutError:
            timeout_s = self._handler.limits.request_timeout_s
            raise RequestRefused(408, f"the request took longer than {timeout_s:g} s") from None
        except OSError as exc:  # the client went away mid-body: nobody reads the answer
            logger.debug("the connection failed while its body was read: %s", exc)
            self._handler.close_connection = True
            raise RequestRefused(400, "the connection failed while the body was read") from None
        self.done = True
        return data

    def _length(self, limit: int) -> int:
        values = {value.strip() for value in self._lengths}
        if len(values) != 1 or not (value := values.pop()).isdigit() or not value.isascii():
            shown = ", ".join(self._lengths)[:40]
            raise RequestRefused(400, f"Content-Length must be one number of bytes, got {shown!r}")
        if len(value) > 18 or int(value) > limit:
            raise RequestRefused(413, f"a body of {value[:20]} bytes; at most {limit} are accepted")
        return int(value)

    def _exactly(self, length: int) -> bytes:
        data = self._handler.rfile.read(length)
        if len(data) < length:
            raise RequestRefused(400, f"the body ended after {len(data)} of {length} bytes")
        return data

    def _chunked(self, limit: int) -> bytes:
        rfile, data = self._handler.rfile, bytearray()
        for _ in range(self._handler.limits.max_chunks):
            line = rfile.readline(_CHUNK_LINE_BYTES + 1)
            size_text = line.split(b";", 1)[0].strip()
            if len(line) > _CHUNK_LINE_BYTES or not line.endswith(b"\n") or not _CHUNK_SIZE.fullmatch(size_text):
                raise RequestRefused(400, "a malformed chunk in a chunked body")
            size = int(size_text, 16)
            if size == 0:
                return self._trailer(bytes(data))
            if len(data) + size > limit:
                raise RequestRefused(413, f"a chunked body over {limit} bytes")
            chunk = rfile.read(size)
            if len(chunk) < size or rfile.read(2) != b"\r\n":
                raise RequestRefused(400, "a chunked body cut short")
            data += chunk
        raise RequestRefused(400, f"a chunked body in more than {self._handler.limits.max_chunks} chunks")

    def _trailer(self, data: bytes) -> bytes:
        """Read (and drop) the trailer fields after the last chunk; return ``data``."""
        for _ in range(_TRAILER_LINES):
            line = self._handler.rfile.readline(_CHUNK_LINE_BYTES + 1)
            if line in (b"\r\n", b"\n", b""):
                return data
        raise RequestRefused(400, f"more than {_TRAILER_LINES} trailer lines after a chunked body")


def _redacted(text: str) -> str:
    """A request line fit for a log: tokens in the query hidden, control characters escaped.

    >>> _redacted('"GET /?token=s3cret&x=1 HTTP/1.1" 200 -')
    '"GET /?token=***&x=1 HTTP/1.1" 200 -'
    """
    return loggable(_SECRET_QUERY.sub(r"\1***", text))
