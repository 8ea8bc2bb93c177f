"""The ``static`` fetcher: plain HTTP on its own kept-alive connections (``fetchers.wire``; requests' adapter
through a proxy), bounded in time, size and redirects."""

from __future__ import annotations

import http.cookiejar
import logging
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from functools import partial
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
import urllib3.exceptions

from fetchers.base import FetchLimits, FetchRequest, FetchResult
from fetchers.deadline import DeadlineWatch
from fetchers.netguard import PUBLIC_ONLY, BlockedAddress, GuardedAdapter, NetworkPolicy, Resolver, applying
from fetchers.proxies import proxy_error_reason
from fetchers.rate_floor import RateFloor
from fetchers.targets import sending_as_written
from fetchers.wire import ACCEPT_ENCODING, Budget, Connections, WireError, WireResponse
from vcrawl import names
from vcrawl.errors import DownloadFailed, FetchFailed

__all__ = ["DEADLINES", "StaticFetcher", "make_session"]

logger = logging.getLogger(__name__)

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024
_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


# One watchdog per process for every session's requests.
DEADLINES = DeadlineWatch()

HOSTS_KEPT = 512
"""Hosts whose kept-alive connections a session holds at most. A polite crawl goes round many
hosts one request at a time: with fewer, each request to a host found its pool evicted since its
last one, and opened a new connection (and closed another)."""


def make_session(pool_size: int = 32, resolver: Resolver = socket.getaddrinfo) -> requests.Session:
    """Return a pooled Session that ignores the environment, keeps no cookies and obeys deadlines.

    Cookies are refused so one site's state never leaks into another task's request
    and the shared Session is safe to use from a worker's threads. Its connections obey the
    network policy of the fetch using them (``fetchers.netguard``) and resolve with ``resolver``.
    ``pool_size``: connections kept per host, for ``HOSTS_KEPT`` hosts at most.
    Requests without a proxy go on the session's own connections (``session.wire``,
    ``fetchers.wire``); proxied ones through its adapter.
    """
    session = _NoRedirectSession()
    session.headers["Accept-Encoding"] = ACCEPT_ENCODING  # what both paths decode
    session.wire = Connections(resolver, per_host=pool_size, hosts=max(pool_size, HOSTS_KEPT))  # type: ignore[attr-defined]
    session.trust_env = False  # proxies come from VCRAWL_PROXIES only, never *_PROXY or .netrc
    session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    adapter = GuardedAdapter(DEADLINES, resolver=resolver, pool_connections=max(pool_size, HOSTS_KEPT),
                             pool_maxsize=pool_size, max_retries=0)  # fmt: skip
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class _NoRedirectSession(requests.Session):
    """A Session that never looks at Location itself: vcrawl follows redirects hop by hop.

    With ``allow_redirects=False`` requests still parses the Location to prepare
    ``Response.next``, so a malformed one (``http://[::1``) failed the whole fetch.
    """

    def resolve_redirects(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return iter(())


class StaticFetcher:
    """Fetches on the session's connections (``session.wire``; through a proxy, or on a session without
    them, with requests); follows redirects itself so every hop is bounded.

    Every connection, redirect hops included, obeys ``policy`` (default: public addresses
    only) narrowed by the request's ``networks``.
    """

    def __init__(
        self,
        session: requests.Session,
        limits: FetchLimits,
        clock: Callable[[], float] = time.monotonic,
        deadlines: DeadlineWatch = DEADLINES,
        policy: NetworkPolicy = PUBLIC_ONLY,
    ) -> None:
        self._session = session
        self._limits = limits
        self._clock = clock
        self._deadlines = deadlines
        self._policy = policy
        self._wire: Connections | None = getattr(session, "wire", None)

    def fetch(self, request: FetchRequest) -> FetchResult:
        """Download ``request.url``, following at most ``max_redirects`` redirects.

        Raises:
            FetchFailed: timeout, connection trouble, a body cut short, a head or body slower than
                the rate floor (``slow_head``, ``too_slow``).
            DownloadFailed: ``too_large``, ``redirect_loop``, ``too_many_redirects``,
                ``bad_redirect``, ``bad_response``, ``blocked_address`` (the network policy
                refuses the address of the URL or of a redirect's target; nothing was sent there).
        """
        policy = self._policy.narrowed(request.networks)
        limits = self._limits
        # The head's floor is the body's: a server trickling its status line and headers is given
        # up a window after their first byte, not at the total timeout (fetchers.deadline).
        # (The session's own connections keep these bounds themselves: ``fetchers.wire``.)
        watch = (self._deadlines.limit(limits.total_timeout_s, limits.min_rate_bytes_s, limits.slow_window_s)
                 if request.proxy is not None or self._wire is None else nullcontext())  # fmt: skip
        with applying(policy), watch:
            try:
                return self._fetch(request)
            except FetchFailed as exc:
                if self._deadlines.expired():
                    raise FetchFailed(request.url, "total_timeout", exc.http_status) from exc
                if self._deadlines.slow_head():
                    raise FetchFailed(request.url, "slow_head", exc.http_status) from exc
                raise

    def _fetch(self, request: FetchRequest) -> FetchResult:
        started = self._clock()
        deadline = started + self._limits.total_timeout_s
        url, seen = request.url, {request.url}
        for hop in range(self._limits.max_redirects + 1):
            response = self._send(request, url, deadline)
            ip = _peer_address(response) if request.proxy is None else ""  # through a proxy: the proxy's
            try:
                is_redirect = response.status_code in _REDIRECTS and "location" in response.headers
                if is_redirect and not (self._limits.follow_redirects and request.follow_redirects):
                    return FetchResult(
                        url=request.url,
                        final_url=url,
                        status=response.status_code,
                        headers=_headers(response),
                        elapsed_s=self._clock() - started,
                        reason=response.reason or "",
                        request_headers=dict(response.request.headers),
                        ip=ip,
                        answer_s=getattr(response, "answer_s", None),
                    )
                if is_redirect:
                    url = _redirect_target(request.url, url, _location(response.headers["location"]))
                    if url in seen:
                        raise DownloadFailed(request.url, "redirect_loop", response.status_code)
                    seen.add(url)
                    logger.debug("redirect %s -> %s", response.url, url)
                    continue
                body, truncated = self._read_body(request.url, response, deadline, request.keep_cut_body)
                return FetchResult(
                    url=request.url,
                    final_url=url,
                    status=response.status_code,
                    headers=_headers(response),
                    body=body,
                    elapsed_s=self._clock() - started,
                    redirects=hop,
                    truncated=truncated,
                    reason=response.reason or "",
                    request_headers=dict(response.request.headers),
                    ip=ip,
                    answer_s=getattr(response, "answer_s", None),
                )
            finally:
                response.close()
        raise DownloadFailed(request.url, "too_many_redirects")

    def _send(self, request: FetchRequest, url: str, deadline: float) -> requests.Response | WireResponse:
        headers = {"User-Agent": request.user_agent, "Accept": _ACCEPT, "Accept-Language": "en;q=0.9,*;q=0.5"}
        if request.referer is not None:
            headers["Referer"] = request.referer
        if url == request.url:  # validators belong to the URL asked for, not to a redirect's target
            headers.update(request.conditional)
        if request.headers and _origin(url) == _origin(request.url):
            headers.update(request.headers)
        proxies = {"http": request.proxy, "https": request.proxy} if request.proxy is not None else {}
        try:
            # Straight to the session's adapter: the Session layer would only merge cookies it
            # refuses, settings it ignores (trust_env is off) and hooks nobody set, at a third
            # of a fetch's CPU.
            sent = {**self._session.headers, **headers}
            timeout = (self._limits.connect_timeout_s, self._limits.read_timeout_s)
            if not proxies and self._wire is not None:  # the session's own connections (fetchers.wire)
                limits = self._limits
                budget = Budget(limits.connect_timeout_s, limits.read_timeout_s,
                                time.monotonic() + max(0.0, deadline - self._clock()),
                                limits.min_rate_bytes_s, limits.slow_window_s)  # fmt: skip
                return self._wire.get(url, sent, budget)
            with sending_as_written(url):  # the URL as the page meant it, not re-escaped (fetchers.targets)
                prepared = requests.PreparedRequest()
                prepared.prepare(method="GET", url=url, headers=sent)
                adapter = self._session.get_adapter(prepared.url or url)
                return adapter.send(prepared, stream=True, timeout=timeout, verify=True, cert=None, proxies=proxies)
        except BlockedAddress as exc:
            logger.info("refused %s (for %s): %s", url, request.url, exc)
            raise DownloadFailed(request.url, "blocked_address") from exc
        except WireError as exc:
            raise _failure(request.url, exc.reason, None) from exc
        except requests.exceptions.ProxyError as exc:
            reason, status = proxy_error_reason(exc)  # refused, timed out, 407, tunnel refused
            raise FetchFailed(request.url, reason, status) from exc
        except requests.exceptions.SSLError as exc:
            raise DownloadFailed(request.url, "tls_error") from exc
        except requests.exceptions.ConnectTimeout as exc:  # the host does not answer: its trouble, not the URL's
            raise FetchFailed(request.url, "connect_timeout") from exc
        except requests.exceptions.Timeout as exc:
            raise FetchFailed(request.url, "timeout") from exc
        except requests.exceptions.ConnectionError as exc:
            reason = names.REASON_DNS_ERROR if _did_not_resolve(exc) else "connection_error"
            raise FetchFailed(request.url, reason) from exc
        except requests.exceptions.InvalidHeader as exc:
            # urllib3's InvalidHeader: the response's framing (Content-Length "3, 300"); else our request's headers.
            broken_response = bool(exc.args) and isinstance(exc.args[0], urllib3.exceptions.InvalidHeader)
            raise DownloadFailed(request.url, "bad_response" if broken_response else "bad_request") from exc
        except (requests.exceptions.InvalidURL, ValueError) as exc:
            raise DownloadFailed(request.url, "bad_request") from exc
        except requests.exceptions.RequestException as exc:
            raise FetchFailed(request.url, "request_error") from exc

    def _read_body(self, task_url: str, response: requests.Response | WireResponse,
                   deadline: float, keep_cut: bool = False) -> tuple[bytes, bool]:  # fmt: skip
        """Read the (decompressed) body in chunks, enforcing the size cap and the total time; ``keep_cut``:
        a body its connection cut short is returned as far as it came, truncated."""
        cap = self._limits.max_body_bytes
        truncate = self._limits.truncate_body
        declared = _content_length(task_url, response)
        if not truncate and declared is not None and "content-encoding" not in response.headers and declared > cap:
            raise DownloadFailed(task_url, "too_large", response.status_code)
        chunks: list[bytes] = []
        size = 0
        rate = RateFloor(self._limits.min_rate_bytes_s, self._limits.slow_window_s, self._clock())
        wire = isinstance(response, WireResponse)
        read1 = response.read1 if wire else partial(response.raw.read1, decode_content=True)
        try:
            while True:
                now = self._clock()
                if now > deadline:
                    raise FetchFailed(task_url, "total_timeout", response.status_code)
                if rate.too_slow(now, size):
                    raise FetchFailed(task_url, "too_slow", response.status_code)
                # read1 returns what has arrived, so a slow drip still reaches the deadline
                # check; its max length bounds decompression too.
                chunk = read1(_CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > cap:
                    if truncate:
                        chunks.append(chunk[: len(chunk) - (size - cap)])
                        return b"".join(chunks), True
                    raise DownloadFailed(task_url, "too_large", response.status_code)
                chunks.append(chunk)
        except WireError as exc:
            if keep_cut and exc.reason == "incomplete_body":
                logger.debug("kept the %d bytes of %s before its connection closed", size, task_url)
                return b"".join(chunks), True
            raise _failure(task_url, exc.reason, response.status_code) from exc
        except (urllib3.exceptions.ReadTimeoutError, TimeoutError) as exc:
            raise FetchFailed(task_url, "timeout", response.status_code) from exc
        except urllib3.exceptions.DecodeError as exc:
            raise DownloadFailed(task_url, "bad_encoding", response.status_code) from exc
        except (urllib3.exceptions.ProtocolError, OSError) as exc:
            if keep_cut:
                logger.debug("kept the %d bytes of %s before its connection closed", size, task_url)
                return b"".join(chunks), True
            raise FetchFailed(task_url, "incomplete_body", response.status_code) from exc
        return b"".join(chunks), False


_DOWNLOAD_FAILED = frozenset({"tls_error", "bad_response", "bad_request", "bad_encoding"})


def _failure(task_url: str, reason: str, status: int | None) -> FetchFailed | DownloadFailed:
    """A request's failure as the fetcher reports it: worth a retry (``FetchFailed``) or not."""
    if reason in _DOWNLOAD_FAILED:
        return DownloadFailed(task_url, reason, status)
    return FetchFailed(task_url, reason, status)


def _did_not_resolve(exc: requests.exceptions.ConnectionError) -> bool:
    """True when the connection failed because the host name did not resolve (urllib3's retry wrapper
    carries the ``NameResolutionError`` as its ``reason``)."""
    cause = exc.args[0] if exc.args else None
    return isinstance(getattr(cause, "reason", cause), urllib3.exceptions.NameResolutionError)


def _peer_address(response: requests.Response | WireResponse) -> str:
    """The address the response's connection was pinned to (``fetchers.netguard``), "" if unknown.

    Read before the body: once it is read, urllib3 hands the connection back to its pool.
    """
    if isinstance(response, WireResponse):
        return response.ip
    connection = getattr(response.raw, "connection", None)  # urllib3 2's public HTTPResponse.connection
    return getattr(connection, "pinned_address", None) or ""


def _headers(response: requests.Response) -> dict[str, str]:
    headers = {name.lower(): value for name, value in response.headers.items()}
    if "location" in headers:
        headers["location"] = _location(headers["location"])
    return headers


def _location(value: str) -> str:
    """A Location header as its sender meant it.

    http.client decodes header bytes as latin-1, so a UTF-8 path (``/café``) arrives as mojibake;
    like requests' own redirect handling, take the bytes back and read them as UTF-8 when they are.

    >>> _location("/caf\u00c3\u00a9.html"), _location("/caf\u00e9.html")
    ('/café.html', '/café.html')
    """
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def _content_length(task_url: str, response: requests.Response) -> int | None:
    """The declared body length; a malformed or conflicting one is a broken response.

    RFC 9112 §6.3: an invalid Content-Length makes the message unreadable, so it is refused at
    once (``bad_response``, no retry), not read until the server closes or the clock runs out.
    Repeats of one value ("42, 42") are accepted, as the RFC allows.
    """
    declared = response.headers.get("content-length")
    if declared is None:
        return None
    values = {value.strip() for value in declared.split(",")}
    if len(values) != 1 or not (value := values.pop()).isdigit() or not value.isascii():
        raise DownloadFailed(task_url, "bad_response", response.status_code)
    return int(value)


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port


def _redirect_target(task_url: str, current: str, location: str) -> str:
    target = urljoin(current, location.strip())
    parts = urlsplit(target)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DownloadFailed(task_url, "bad_redirect")
    return target.split("#", 1)[0]
