"""robots.txt per RFC 9309, read as Google's reference parser reads it; cached per origin in Redis and in each process.

Groups and Allow/Disallow matching are ``frontier.robots_groups`` (the reference's behaviour);
Protego reads the Crawl-delay of the group chosen there, which the reference ignores.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import redis
from protego import Protego

from frontier.robots_groups import RobotsGroups, directives
from frontier.urls import origin as url_origin
from vcrawl import names, redis_keys
from vcrawl.errors import DownloadFailed, FetchFailed

__all__ = ["KINDS", "MAX_ROBOTS_BYTES", "RobotsCache", "RobotsResponse", "RobotsRules", "read_robots", "robots_url"]

logger = logging.getLogger(__name__)

MAX_ROBOTS_BYTES = 500 * 1024
"""RFC 9309 section 2.5: parse at least 500 KiB; content after the cut is ignored."""

KINDS: tuple[str, ...] = ("parsed", "allow_all", "disallow_all")
"""Values of ``RobotsRules.kind``."""

_ORIGIN = re.compile(r"https?://[^/?#]+")
_TOO_MANY_REQUESTS = 429
_MAX_ROBOTS_REDIRECTS = 5  # RFC 9309 section 2.3.1.2
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_BYTE_ORDER_MARK = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class RobotsResponse:
    """One response to a robots.txt request, as the caller's fetcher got it (no redirect followed)."""

    status: int
    final_url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


def read_robots(url: str, get: Callable[[str], RobotsResponse]) -> tuple[RobotsRules | None, int | None]:
    """Read the robots.txt governing ``url`` with ``get``, following up to 5 redirects hop by hop.

    ``get`` fetches one URL without following redirects and raises ``DownloadFailed`` /
    ``FetchFailed`` as fetchers do, so every hop passes the caller's network policy. Returns
    ``(rules, status)``; ``(None, None)`` when the policy refuses the origin's own address (its
    URLs cannot be fetched either). A redirect to a refused address or a malformed Location leaves
    robots.txt unavailable (RFC 9309 section 2.3.1.3: allow all); no answer at all or a 5xx means
    "disallow all" until it can be read (section 2.3.1.4).

    Raises:
        FetchFailed: ``dns_error``: the origin's own name did not resolve. There is no server to be
            unreachable, and its URLs cannot be fetched either: the caller fails them as their own
            fetch would (``engine.fetch_step.robots``), instead of holding them for robots.txt.
    """
    target, status, body = robots_url(url), None, None
    try:
        for hop in range(_MAX_ROBOTS_REDIRECTS + 1):
            try:
                response = get(target)
            except DownloadFailed as exc:
                if exc.reason != "blocked_address":
                    raise
                if hop == 0:
                    return None, None
                logger.debug("robots.txt of %s redirects to a refused address (%s)", url_origin(url), target)
                status, body = 404, None
                break
            status, body = response.status, response.body
            if response.status not in _REDIRECTS or "location" not in response.headers:
                break
            try:
                target = urljoin(response.final_url, response.headers["location"].strip())
                if urlsplit(target).scheme not in ("http", "https"):
                    break
            except ValueError:  # a malformed Location: robots.txt as if unavailable
                status, body = 404, None
                break
    except FetchFailed as exc:
        if exc.reason == names.REASON_DNS_ERROR and target == robots_url(url):
            raise
        status, body = None, None
    except DownloadFailed:
        status, body = None, None
    return RobotsRules.from_response(status, body), status


def robots_url(url: str) -> str:
    """Return the robots.txt URL that governs ``url`` (one per origin, RFC 9309 section 2.3).

    Raises:
        ValueError: the URL has no host.
    """
    return url_origin(url) + "/robots.txt"


def _is_robots_txt(url: str) -> bool:
    return "/robots.txt" in url and urlsplit(url).path == "/robots.txt"


def _decode(body: bytes) -> str:
    if len(body) > MAX_ROBOTS_BYTES:
        body = body[:MAX_ROBOTS_BYTES]
        # Drop the line the cut went through: "Allow: /private/x" cut to "Allow: /p" would allow too much.
        last_break = max(body.rfind(b"\n"), body.rfind(b"\r"))
        body = body[: last_break + 1] if last_break != -1 else b""
    # A leading BOM, even a partial one, would spoil the first line (often "User-agent: *"); the
    # reference skips as much of one as the body starts with.
    for size in (3, 2, 1):
        if body.startswith(_BYTE_ORDER_MARK[:size]):
            body = body[size:]
            break
    return body.decode("utf-8", errors="replace")


def _absolute_sitemap(robots_url: str, value: str) -> str | None:
    if not value or any(ch.isspace() for ch in value):
        return None
    try:
        parts = urlsplit(urljoin(robots_url, value))
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.geturl()  # urlsplit lower-cases the scheme


def _protego_crawl_delay(values: Sequence[str]) -> float | None:
    # Protego reads the value (a finite number >= 0; the last good one wins) from the chosen
    # group's Crawl-delay lines, handed to it as the one group of a file.
    if not values:
        return None
    lines = "".join(f"Crawl-delay: {value}\n" for value in values)
    return Protego.parse("User-agent: *\n" + lines).crawl_delay("*")


@dataclass(frozen=True)
class RobotsRules:
    """The robots.txt rules of one origin; ``text`` is set only when ``kind == "parsed"``."""

    kind: str
    text: str = ""
    _parsed: RobotsGroups | None = field(default=None, init=False, repr=False, compare=False)
    _delays: dict[str, float | None] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"RobotsRules.kind must be one of {KINDS}, got {self.kind!r}")
        if self.text and self.kind != "parsed":
            raise ValueError(f"RobotsRules of kind {self.kind!r} carry no text")

    @classmethod
    def from_response(cls, status: int | None, body: bytes | None) -> RobotsRules:
        """Build the rules from the final status of a robots.txt fetch (RFC 9309 section 2.3.1).

        2xx: parse the first ``MAX_ROBOTS_BYTES`` of the body; 3xx (redirect budget
        spent) and 4xx (unavailable): allow all, except 429, which like 5xx and an
        unreachable server (``status`` None) means disallow all until fetched again.
        """
        if status is not None and 200 <= status < 300:
            text = _decode(body or b"")
            rules = cls("parsed", text) if text.strip() else cls("allow_all")
        elif status is not None and 300 <= status < 500 and status != _TOO_MANY_REQUESTS:
            rules = cls("allow_all")
        else:
            # 5xx, unreachable, 429 (Google's reading: the server asks us to back off) and
            # anything outside 100-599: assume a complete disallow (RFC 9309 section 2.3.1.4).
            rules = cls("disallow_all")
        logger.debug("robots.txt status %s: %s", status, rules.kind)
        return rules

    def _groups(self) -> RobotsGroups:
        # Parsed once per instance, on first use; a race only parses twice.
        groups = self._parsed
        if groups is None:
            groups = RobotsGroups(self.text)
            object.__setattr__(self, "_parsed", groups)
        return groups

    def can_fetch(self, url: str, token: str) -> bool:
        """Return True if the crawler with product ``token`` (e.g. ``vcrawl``) may fetch ``url``.

        ``token`` is compared whole, case-insensitively, with the product token each group names
        (pass ``vcrawl``, not a User-Agent header). The robots.txt URL itself is always allowed.
        Raises ValueError for an empty token.
        """
        if not token:
            raise ValueError("can_fetch needs the crawler's product token")
        if self.kind == "allow_all" or _is_robots_txt(url):
            return True
        if self.kind == "disallow_all":
            return False
        return self._groups().is_allowed(url, token)

    def crawl_delay(self, token: str) -> float | None:
        """Return the Crawl-delay (seconds) of the groups that apply to ``token``, or None."""
        if self.kind != "parsed":
            return None
        if token not in self._delays:
            self._delays[token] = _protego_crawl_delay(self._groups().choice(token).crawl_delays)
        return self._delays[token]

    def sitemaps(self, robots_url: str) -> tuple[str, ...]:
        """The URLs of its ``Sitemap:`` lines (outside any group, per sitemaps.org), in order, made absolute.

        A relative value is resolved against ``robots_url`` (the URL this robots.txt was read from), as
        crawler-commons' robots parser does; the scheme is lower-cased (``HTTP://`` is ``http://``);
        values that are not then an http(s) URL with a host are left out.
        """
        if self.kind != "parsed":
            return ()
        found = (_absolute_sitemap(robots_url, item.value) for item in directives(self.text) if item.kind == "sitemap")
        return tuple(dict.fromkeys(url for url in found if url is not None))

    def to_cache(self) -> str:
        """Return the compact JSON form stored in Redis."""
        return json.dumps({"kind": self.kind, "text": self.text}, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_cache(cls, text: str) -> RobotsRules:
        """Rebuild rules written by ``to_cache``.

        Raises:
            ValueError: ``text`` is not what ``to_cache`` writes.
        """
        data = json.loads(text)
        if not isinstance(data, dict) or set(data) != {"kind", "text"} or not isinstance(data["text"], str):
            raise ValueError(f"not a cached RobotsRules: {text[:80]!r}")
        return cls(data["kind"], data["text"])


class RobotsCache:
    """Robots rules per origin: a per-process LRU of parsed rules in front of Redis.

    Redis keeps ``to_cache`` text for ``ttl_s`` (``error_ttl_s`` for ``disallow_all``,
    so a failing robots.txt is fetched again sooner). A local entry never outlives the
    Redis key it came from. ``local_max_chars`` bounds the robots.txt text held locally.
    Redis errors are not caught here.
    """

    def __init__(
        self,
        client: redis.Redis,
        ttl_s: float = 86400,
        error_ttl_s: float = 600,
        local_size: int = 1024,
        clock: Callable[[], float] = time.monotonic,
        local_max_chars: int = 64 * 1024 * 1024,
    ) -> None:
        if ttl_s <= 0 or error_ttl_s <= 0 or local_size < 0 or local_max_chars < 0:
            raise ValueError("RobotsCache needs positive TTLs and non-negative local limits")
        self._redis = client
        self._ttl_s = ttl_s
        self._error_ttl_s = error_ttl_s
        self._local_size = local_size
        self._local_max_chars = local_max_chars
        self._clock = clock
        self._lock = threading.Lock()
        self._local: OrderedDict[str, tuple[RobotsRules, float]] = OrderedDict()
        self._local_chars = 0

    def _ttl_for(self, rules: RobotsRules) -> float:
        return self._error_ttl_s if rules.kind == "disallow_all" else self._ttl_s

    def get(self, origin: str) -> RobotsRules | None:
        """Return the cached rules of ``origin`` (``scheme://host[:port]``), or None: fetch robots.txt then.

        Raises:
            ValueError: ``origin`` is not ``scheme://host[:port]``.
        """
        _check_origin(origin)
        now = self._clock()
        with self._lock:
            entry = self._local.get(origin)
            if entry is not None:
                if now < entry[1]:
                    self._local.move_to_end(origin)
                    return entry[0]
                self._forget(origin)
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(redis_keys.robots(origin))
        pipe.pttl(redis_keys.robots(origin))
        raw, ttl_ms = pipe.execute()
        if raw is None:
            return None
        try:
            rules = RobotsRules.from_cache(raw.decode() if isinstance(raw, bytes) else raw)
        except ValueError:
            logger.debug("unreadable cached robots rules for %s; refetching", origin)
            return None
        if ttl_ms > 0:  # -1: no expiry (set by someone else), -2: expired since the GET
            self._remember(origin, rules, now + min(ttl_ms / 1000, self._ttl_for(rules)))
        elif ttl_ms == -1:
            self._remember(origin, rules, now + self._ttl_for(rules))
        return rules

    def put(self, origin: str, rules: RobotsRules) -> None:
        """Store ``rules`` for ``origin`` in Redis and in this process.

        Raises:
            ValueError: ``origin`` is not ``scheme://host[:port]``.
        """
        _check_origin(origin)
        ttl_s = self._ttl_for(rules)
        self._redis.set(redis_keys.robots(origin), rules.to_cache(), ex=max(1, math.ceil(ttl_s)))
        self._remember(origin, rules, self._clock() + ttl_s)
        logger.debug("robots rules for %s cached for %ss: %s", origin, ttl_s, rules.kind)

    def forget_local(self, origin: str | None = None) -> None:
        """Drop this process's copy of ``origin``'s rules (of every origin if None); the next ``get`` asks Redis."""
        with self._lock:
            for known in [origin] if origin is not None else list(self._local):
                self._forget(known)

    def _remember(self, origin: str, rules: RobotsRules, expires_at: float) -> None:
        with self._lock:
            self._forget(origin)
            self._local[origin] = (rules, expires_at)
            self._local_chars += len(rules.text)
            while self._local and (len(self._local) > self._local_size or self._local_chars > self._local_max_chars):
                self._forget(next(iter(self._local)))

    def _forget(self, origin: str) -> None:
        # Caller holds the lock.
        entry = self._local.pop(origin, None)
        if entry is not None:
            self._local_chars -= len(entry[0].text)


def _check_origin(origin: str) -> None:
    if not _ORIGIN.fullmatch(origin):
        raise ValueError(f"not an origin (scheme://host[:port]): {origin!r}")
