"""The job API on the wire: the standard library's threading HTTP server, with every read bounded.

Whoever can reach the port controls what arrives, so (docs/security.md, "Limits"):

- a request's body is read only once ``JobApi.handle`` has checked the origin and the token, and
  never past ``max_body_bytes``: a missing, negative or non-numeric ``Content-Length`` is a 400,
  a longer one a 413 without reading it; a chunked body is counted as it comes;
- a request (its line, headers and body) must arrive within ``request_timeout_s`` of its first
  byte, or of the previous answer on a kept-alive connection; a per-read timeout alone would let a
  client dripping one byte every few seconds hold a thread for ever;
- at most ``max_connections`` connections are served at once; one more is answered 429 and closed;
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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from api.server import JobApi, RequestRefused, json_response

__all__ = ["HttpLimits", "make_server"]

logger = logging.getLogger(__name__)

_CHUNK_LINE_BYTES = 1024  # a chunk-size line with its extensions
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,8}")  # up to 4 GiB: past any body limit, never a huge int
_TRAILER_LINES = 32
_DRAIN_READ_BYTES = 64 * 1024
_REFUSAL_LOG_EVERY_S = 10.0
_SECRET_QUERY = re.compile(r"([?&](?:token|access_token)=)[^&\s\"]*", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class HttpLimits:
    """What one client may cost the server (docs/security.md lists the defaults)."""

    max_body_bytes: int = 1024 * 1024
    request_timeout_s: float = 10.0  # a whole request, from its first byte (or the last answer) to its body's end
    max_connections: int = 64
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
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._max_connections = limits.max_connections
        self._refused, self._refusal_logged = 0, -_REFUSAL_LOG_EVERY_S
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._refused += 1
            if (now := time.monotonic()) - self._refusal_logged >= _REFUSAL_LOG_EVERY_S:  # not a line per connection
                logger.warning("refused %d connection(s), the last from %s: %d open already", self._refused,
                               client_address[0], self._max_connections)  # fmt: skip
                self._refused, self._refusal_logged = 0, now
            _refuse_connection(request, self._max_connections)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The socketserver default prints a traceback to stderr; a client that went away is no error.
        logger.debug("connection from %s ended with an error", client_address[0], exc_info=True)


def _refuse_connection(request: socket.socket, limit: int) -> None:
    """Answer 429 on a connection over the limit, without waiting on the client."""
    body = f'{{"error": "more than {limit} open connections; try again shortly"}}'.encode()
    head = (f"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Retry-After: 1\r\nConnection: close\r\nX-Frame-Options: DENY\r\n\r\n")  # fmt: skip
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
        self._continue_due = False
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

    def _answer(self) -> None:
        body = _Body(self)
        try:
            status, headers, payload = self.api.handle(self.command, self.path, dict(self.headers.items()), body.read)
        except Exception:  # a bug or Redis trouble: answer 500, keep serving
            logger.exception("%s %s failed", self.command, _redacted(self.path))
            status, headers, payload = json_response(500, {"error": "internal error; see the server log"})
        unread = not body.done
        if unread or status in (HTTPStatus.REQUEST_TIMEOUT, HTTPStatus.BAD_REQUEST):
            self.close_connection = True  # what follows on the connection cannot be told from a next request
            headers = {**headers, "Connection": "close"}
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
        self.done = not self._lengths and not self._codings  # no body at all

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
        rfile, parts, total = self._handler.rfile, [], 0
        while True:
            line = rfile.readline(_CHUNK_LINE_BYTES + 1)
            size_text = line.split(b";", 1)[0].strip()
            if len(line) > _CHUNK_LINE_BYTES or not line.endswith(b"\n") or not _CHUNK_SIZE.fullmatch(size_text):
                raise RequestRefused(400, "a malformed chunk in a chunked body")
            size = int(size_text, 16)
            if size == 0:
                break
            total += size
            if total > limit:
                raise RequestRefused(413, f"a chunked body over {limit} bytes")
            chunk = rfile.read(size)
            if len(chunk) < size or rfile.read(2) != b"\r\n":
                raise RequestRefused(400, "a chunked body cut short")
            parts.append(chunk)
        for _ in range(_TRAILER_LINES):  # trailer fields are read and dropped
            line = rfile.readline(_CHUNK_LINE_BYTES + 1)
            if line in (b"\r\n", b"\n", b""):
                return b"".join(parts)
        raise RequestRefused(400, f"more than {_TRAILER_LINES} trailer lines after a chunked body")


def _redacted(text: str) -> str:
    """A request line fit for a log: tokens in the query hidden, control characters escaped.

    >>> _redacted('"GET /?token=s3cret&x=1 HTTP/1.1" 200 -')
    '"GET /?token=***&x=1 HTTP/1.1" 200 -'
    """
    text = _SECRET_QUERY.sub(r"\1***", text)
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)
