"""A small local web site for tests: pages, redirects, scripted statuses, slow bodies.

Every request is recorded server-side (path, headers, arrival time), so tests
check what the crawler really sent and when.
"""

from __future__ import annotations

import email.utils
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def link_page(*links: str) -> str:
    """An HTML page that links to ``links``."""
    return "<html><body>" + "".join(f'<a href="{href}">{href}</a>' for href in links) + "</body></html>"


@dataclass
class Response:
    """One scripted response."""

    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # before the status line
    chunks: Sequence[bytes] | None = None  # body sent in these pieces, pausing chunk_pause_s between
    chunk_pause_s: float = 0.0
    raw: bytes | None = None  # sent as is, one byte per chunk_pause_s: status line and headers included
    raw_pieces: Sequence[bytes] | None = None  # sent as is, one piece per chunk_pause_s (e.g. one header line)


def header_trickle(line_every_s: float, lines: int = 600) -> Response:
    """A response whose status line comes at once, then one header line every ``line_every_s``, for
    minutes: never a byte late for the read timeout, never an end to the head."""
    pieces = [b"HTTP/1.1 200 OK\r\n"] + [b"X-Trickle-%d: y\r\n" % n for n in range(lines)]
    return Response(raw_pieces=pieces, chunk_pause_s=line_every_s)


@dataclass
class VersionedPage:
    """A page that changes when a test says so, with validators a revisit can send back.

    ``validators``: ``etag`` (answers 304 to a matching If-None-Match), ``last-modified``
    (304 to an If-Modified-Since not older than the version) or ``none`` (always 200).
    """

    body: bytes
    validators: str = "etag"
    version: int = 1
    modified_at: float = 1_700_000_000.0

    def change(self, body: str | bytes) -> None:
        """Serve a new version from now on."""
        self.body = body.encode() if isinstance(body, str) else body
        self.version += 1
        self.modified_at += 3600

    def respond(self, headers: Any) -> Response:
        etag = f'"v{self.version}"'
        modified = email.utils.formatdate(self.modified_at, usegmt=True)
        if self.validators == "etag":
            if headers.get("If-None-Match") == etag:
                return Response(b"", 304, {"ETag": etag})
            return Response(self.body, 200, {"ETag": etag})
        if self.validators == "last-modified":
            since = headers.get("If-Modified-Since")
            parsed = email.utils.parsedate_to_datetime(since).timestamp() if since else None
            if parsed is not None and parsed >= self.modified_at:
                return Response(b"", 304, {"Last-Modified": modified})
            return Response(self.body, 200, {"Last-Modified": modified})
        return Response(self.body, 200)


NOT_PAGES = frozenset({"/robots.txt", "/sitemap.xml"})
"""What a crawl asks every host besides its pages: robots.txt, and the sitemap discovered when
robots.txt names none (answered 404 by a site without one)."""


@dataclass(frozen=True)
class Seen:
    """A request as the server saw it."""

    path: str
    headers: dict[str, str]
    at: float
    client_port: int = 0
    client: Any = None  # what ``TestSite.identify`` said about the client (e.g. its process)
    client_host: str = ""  # the client's address (a network namespace's own, tests/netns.py)


class TestSite:
    """A ThreadingHTTPServer on 127.0.0.1 with routes added per test."""

    __test__ = False

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._routes: dict[str, Callable[[], Response]] = {}
        self._versioned: dict[str, VersionedPage] = {}
        self._per_request: dict[str, Callable[[Seen], Response]] = {}
        self._lock = threading.Lock()
        self.seen: list[Seen] = []
        self.identify: Callable[[int], Any] | None = None  # client port -> who the client is
        self._in_flight = 0
        self._in_flight_log: list[tuple[float, int]] = [(time.monotonic(), 0)]  # (when, requests being served)
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                site._serving(+1)
                try:
                    self._answer()
                finally:
                    site._serving(-1)

            def _answer(self) -> None:
                seen = site._record(
                    self.path, dict(self.headers.items()), self.client_address[1], self.client_address[0]
                )
                versioned = site._versioned.get(self.path)
                route = site._routes.get(self.path)
                per_request = site._per_request.get(self.path)
                if versioned is not None:
                    response = versioned.respond(self.headers)
                elif per_request is not None:
                    response = per_request(seen)
                else:
                    response = route() if route else Response(b"not found", 404)
                self._send(response)

            def _send(self, response: Response) -> None:
                if response.delay_s:
                    time.sleep(response.delay_s)
                if response.raw is not None or response.raw_pieces is not None:
                    self._drip(response)
                    return
                try:
                    self.send_response(response.status)
                    headers = {"Content-Type": "text/html; charset=utf-8", **response.headers}
                    if response.chunks is None and "Content-Length" not in headers:
                        headers["Content-Length"] = str(len(response.body))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    if response.chunks is None:
                        self.wfile.write(response.body)
                        return
                    for piece in response.chunks:
                        self.wfile.write(piece)
                        self.wfile.flush()
                        time.sleep(response.chunk_pause_s)
                    self.close_connection = True
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def _drip(self, response: Response) -> None:
                self.close_connection = True
                pieces = response.raw_pieces
                if pieces is None:
                    pieces = [bytes([byte]) for byte in response.raw or b""]
                try:
                    for piece in pieces:
                        self.wfile.write(piece)
                        self.wfile.flush()
                        time.sleep(response.chunk_pause_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        """The server's address and port."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def base(self) -> str:
        """``http://127.0.0.1:PORT``."""
        host, port = self.address
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        """The absolute URL of ``path``."""
        return self.base + path

    def add_page(self, path: str, body: str | bytes, status: int = 200, **headers: str) -> str:
        """Serve ``body`` at ``path``; return its URL."""
        data = body.encode() if isinstance(body, str) else body
        response = Response(data, status, {k.replace("_", "-"): v for k, v in headers.items()})
        self._routes[path] = lambda: response
        return self.url(path)

    def add_response(self, path: str, response: Response) -> str:
        """Serve a fully scripted response at ``path``."""
        self._routes[path] = lambda: response
        return self.url(path)

    def add_answer(self, path: str, answer: Callable[[Seen], Response]) -> str:
        """Serve at ``path`` what ``answer`` gives for each request (e.g. by who sent it)."""
        self._per_request[path] = answer
        return self.url(path)

    def add_sequence(self, path: str, responses: Sequence[Response]) -> str:
        """Serve ``responses`` in turn; the last one repeats."""
        remaining: Iterator[Response] = iter(responses)
        last = [responses[-1]]

        def next_response() -> Response:
            with self._lock:
                last[0] = next(remaining, last[0])
                return last[0]

        self._routes[path] = next_response
        return self.url(path)

    def add_versioned(self, path: str, body: str | bytes, validators: str = "etag") -> VersionedPage:
        """Serve a page that ``change()`` updates; see ``VersionedPage``."""
        page = VersionedPage(body.encode() if isinstance(body, str) else body, validators)
        self._versioned[path] = page
        return page

    def add_redirect(self, path: str, location: str, status: int = 302) -> str:
        """Redirect ``path`` to ``location``."""
        return self.add_response(path, Response(b"", status, {"Location": location}))

    def requests_to(self, path: str) -> list[Seen]:
        """The requests the server received for ``path``."""
        with self._lock:
            return [seen for seen in self.seen if seen.path == path]

    def most_in_flight(self, since: float, until: float) -> int:
        """The most requests served at once between ``since`` and ``until`` (``time.monotonic``)."""
        with self._lock:
            log = list(self._in_flight_log)
        before = [count for at, count in log if at <= since]
        during = [count for at, count in log if since < at <= until]
        return max([before[-1] if before else 0, *during])

    def _serving(self, change: int) -> None:
        with self._lock:
            self._in_flight += change
            self._in_flight_log.append((time.monotonic(), self._in_flight))

    def _record(self, path: str, headers: dict[str, str], client_port: int = 0, client_host: str = "") -> Seen:
        arrived = time.monotonic()  # before the client is looked up in /proc, which takes milliseconds
        # While the request is served its connection is open: the client's socket can be found.
        client = self.identify(client_port) if self.identify is not None else None
        seen = Seen(path, headers, arrived, client_port, client, client_host)
        with self._lock:
            self.seen.append(seen)
        return seen

    def __enter__(self) -> TestSite:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
