"""The fetcher interface and the rules every fetcher shares (limits, status classes)."""

from __future__ import annotations

import email.utils
import ipaddress
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from vcrawl.browser_actions import BrowserAction
from vcrawl.errors import DownloadFailed, FetchFailed

__all__ = [
    "NOT_RETRIED_REASONS",
    "RETRYABLE_STATUSES",
    "SLOW_REASONS",
    "FetchLimits",
    "FetchRequest",
    "FetchResult",
    "Fetcher",
    "check_status",
    "parse_retry_after",
]

# Statuses where the same request may succeed later (RFC 9110 §15.5.9, §15.6; RFC 6585 §4).
RETRYABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
SLOW_REASONS = frozenset({"timeout", "too_slow", "slow_head", "total_timeout"})
"""Failure reasons of a request given up for time: no byte for the read timeout, the total timeout
spent, or a body or a response head slower than the minimum rate (``FetchLimits``)."""
NOT_RETRIED_REASONS = frozenset({"slow_head"})
"""Transient-looking failures a retry cannot help: a server that trickles its status line and
headers does so on purpose (a tarpit), and would hold the next attempt as long again."""


@dataclass(frozen=True)
class FetchLimits:
    """Bounds that keep a hostile or broken site from wedging a worker."""

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 15.0
    total_timeout_s: float = 60.0
    # A body slower than min_rate_bytes_s over any slow_window_s once it has begun is given up
    # (``too_slow``), like curl's --speed-limit/--speed-time: a drip-feeding tarpit holds its
    # host's slot for seconds, not for the whole total_timeout_s. The response head (status line
    # and headers) is held to the same floor from its first byte (``slow_head``).
    min_rate_bytes_s: float = 1024.0
    slow_window_s: float = 5.0
    max_body_bytes: int = 10 * 1024 * 1024
    max_redirects: int = 5
    # False: a redirect comes back as the result (the frontier admits its target as a new URL).
    follow_redirects: bool = True
    # True: keep the first max_body_bytes and stop (robots.txt); False: a larger body fails.
    truncate_body: bool = False


@dataclass(frozen=True)
class FetchRequest:
    """One request: the URL and the identity it is sent with."""

    url: str
    user_agent: str
    referer: str | None = None
    proxy: str | None = None
    js_function: str | None = None
    wait_for: str | None = None  # dynamic pages without js_function: a CSS selector to wait for
    actions: tuple[BrowserAction, ...] = ()  # dynamic pages: what the browser does, in order, before reading
    conditional: Mapping[str, str] = field(default_factory=dict)  # If-None-Match / If-Modified-Since (static)
    # A job's allowed_networks: narrows the fetcher's network policy (None: the cluster's policy as it is).
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] | None = None
    # More headers (api pages: Accept JSON, the auth header): sent to the URL's own origin only, never
    # to a redirect's target elsewhere (as requests drops Authorization on a redirect to another host).
    headers: Mapping[str, str] = field(default_factory=dict)
    # False: a redirect comes back as the result, whatever the fetcher's limits say. A job's pages
    # are fetched so, every fetcher alike: each hop goes back through admission (scope, dedup, robots).
    follow_redirects: bool = True
    # True: a body whose connection closes before its end comes back as far as it arrived, ``truncated``,
    # instead of failing ``incomplete_body`` (a sitemap's last attempt: its complete entries are worth
    # reading). Only the static fetcher honours it.
    keep_cut_body: bool = False


@dataclass(frozen=True)
class FetchResult:
    """The final response after redirects (any status); the body is at most the cap."""

    url: str
    final_url: str
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    elapsed_s: float = 0.0
    redirects: int = 0
    truncated: bool = False
    reason: str = ""
    request_headers: Mapping[str, str] = field(default_factory=dict)  # as sent (for WARC request records)
    # The address of the server that sent this response (WARC-IP-Address); "" when unknown: through
    # a proxy (it was the proxy's), or a browser fetch (Chromium does not say).
    ip: str = ""
    # Seconds from the last request's sending to its answer's first byte, as the kernel timed its
    # arrival (``fetchers.wire``): unlike the wall time around a fetch, no wait for the GIL counts.
    # None when unknown (TLS, a proxy, a browser).
    answer_s: float | None = None

    @property
    def content_type(self) -> str | None:
        """The Content-Type header, if any."""
        return self.headers.get("content-type")


class Fetcher(Protocol):
    """Downloads one URL; raises FetchFailed for transient network trouble."""

    def fetch(self, request: FetchRequest) -> FetchResult:
        """Return the final response.

        Raises:
            FetchFailed: timeouts, refused or reset connections, truncated bodies.
            DownloadFailed: body over the cap, redirect loops, malformed responses.
        """
        ...


def check_status(result: FetchResult, now: float | None = None) -> None:
    """Accept only 200; sort every other status into retryable or final.

    Raises:
        FetchFailed: 408, 425, 429 and 5xx gateways/overload, with ``Retry-After`` in seconds.
        DownloadFailed: any other status (404, 403, 410, 3xx left over, ...).
    """
    if result.status == 200:
        return
    reason = f"http_{result.status}"
    if result.status in RETRYABLE_STATUSES:
        retry_after = parse_retry_after(result.headers.get("retry-after"), now)
        raise FetchFailed(result.url, reason, result.status, retry_after)
    raise DownloadFailed(result.url, reason, result.status)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` value: delta-seconds or an HTTP-date (RFC 9110 §10.2.3).

    >>> parse_retry_after("120")
    120.0
    >>> parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0)
    10.0
    >>> parse_retry_after("soon") is None
    True
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None or when.tzinfo is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)
