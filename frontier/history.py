"""What a scheduled job learned about each URL, kept across its cycles (Nutch's CrawlDb, in Redis).

Per job, two keys:

* ``hist``: one hash, URL -> a compact JSON list ``[depth, cycle_start_s, interval_s, etag,
  last_modified_s, content_hash]``, plus the URL's last WARC capture when the job archives to
  WARC. A record ``[depth]`` alone is a URL found but not fetched
  yet (over the page limit, or left queued by a cancelled cycle).
* ``due``: one sorted set, URL -> the time (s) it is due again: the start of the cycle that
  fetched it plus its interval. A new cycle takes every URL due by its start.

Intervals adapt like Nutch's AdaptiveFetchSchedule: shrink when a visit finds the page changed,
grow when not, within the job's bounds.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import redis

from vcrawl import redis_keys
from vcrawl.jobs import RevisitSpec
from vcrawl.redis_replies import text

__all__ = ["History", "UrlHistory", "content_hash", "next_interval", "parse_http_date"]


def content_hash(body: bytes) -> str:
    """64-bit BLAKE2b of a body, hex: enough to tell one page's versions apart."""
    return hashlib.blake2b(body, digest_size=8).hexdigest()


def next_interval(current_s: float | None, changed: bool, revisit: RevisitSpec) -> float:
    """The revisit interval after a visit; ``current_s`` None means a first visit.

    >>> spec = RevisitSpec(initial_s=100, min_s=50, max_s=300, grow=0.4, shrink=0.2)
    >>> next_interval(None, True, spec)
    100.0
    >>> next_interval(100, False, spec), next_interval(100, True, spec)
    (140.0, 80.0)
    >>> next_interval(280, False, spec), next_interval(55, True, spec)
    (300.0, 50.0)
    """
    if current_s is None:
        value = revisit.initial_s
    elif changed:
        value = current_s * (1 - revisit.shrink)
    else:
        value = current_s * (1 + revisit.grow)
    return round(float(min(max(value, revisit.min_s), revisit.max_s)), 3)


@dataclass(frozen=True)
class UrlHistory:
    """One URL's record. ``fetched_cycle_s`` 0 means never fetched."""

    depth: int
    fetched_cycle_s: float = 0.0
    interval_s: float | None = None
    etag: str = ""
    last_modified_s: int = 0
    content_hash: str = ""
    # The URL's last WARC ``response`` record, "<14-digit timestamp> <base32 SHA-1 payload digest>":
    # what a revisit record of an unchanged page refers to ("" when none was archived).
    capture: str = ""

    @property
    def fetched(self) -> bool:
        """True once any visit got a response for the URL."""
        return self.fetched_cycle_s > 0

    def conditional_headers(self) -> dict[str, str]:
        """``If-None-Match`` / ``If-Modified-Since`` for a revisit (RFC 9110 §13.1).

        >>> UrlHistory(0, 1.0, 60, '"v1"', 784111777).conditional_headers()
        {'If-None-Match': '"v1"', 'If-Modified-Since': 'Sun, 06 Nov 1994 08:49:37 GMT'}
        """
        headers = {}
        if self.etag:
            headers["If-None-Match"] = self.etag
        if self.last_modified_s:
            headers["If-Modified-Since"] = email.utils.formatdate(self.last_modified_s, usegmt=True)
        return headers

    def due_s(self) -> float:
        """When the URL is due again (0: at once).

        A tenth of the interval early (at most 10 minutes): a cycle that starts a little
        earlier after its firing than the last one must not find the URL a moment short of
        due and leave it for a whole period.

        >>> UrlHistory(0, 1000.0, 3600.0).due_s(), UrlHistory(0, 1000.0, 86400.0).due_s()
        (4240.0, 86800.0)
        """
        if not self.fetched:
            return 0.0
        interval = self.interval_s or 0.0
        return self.fetched_cycle_s + interval - min(interval / 10, 600.0)

    def after_visit(
        self,
        *,
        cycle_started_s: float,
        revisit: RevisitSpec,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        changed: bool = False,
        digest: str | None = None,
        capture: str | None = None,
    ) -> UrlHistory:
        """This URL's record after a visit in the cycle started at ``cycle_started_s``: a new interval,
        and the validators of a response (``status``/``headers``; None: no response); ``capture`` is
        the visit's WARC response record, if it wrote one.

        >>> known = UrlHistory(1, 100.0, 3600.0, '"a"', 0, "h1")
        >>> after = known.after_visit(cycle_started_s=200.0, revisit=RevisitSpec(), status=304,
        ...                           headers={"etag": '"b"'})
        >>> after.fetched_cycle_s, after.etag, after.content_hash, after.interval_s
        (200.0, '"b"', 'h1', 5040.0)
        """
        previous = self if self.fetched else None
        headers = headers or {}
        etag, modified = (previous.etag, previous.last_modified_s) if previous else ("", 0)
        if status == 200:  # a new representation: its validators only
            etag, modified = headers.get("etag", ""), parse_http_date(headers.get("last-modified"))
        elif status == 304:  # RFC 9110 §15.4.5: may refresh the validators
            etag = headers.get("etag") or etag
            modified = parse_http_date(headers.get("last-modified")) or modified
        return UrlHistory(
            depth=self.depth,
            fetched_cycle_s=cycle_started_s,
            interval_s=next_interval(previous.interval_s if previous else None, changed, revisit),
            etag=etag,
            last_modified_s=modified,
            content_hash=digest if digest is not None else (previous.content_hash if previous else ""),
            capture=capture if capture is not None else self.capture,
        )

    def encode(self) -> str:
        """The compact stored form.

        >>> UrlHistory(2, 1763780000, 86400.0, '"a"', 1763700000, "0a1b").encode()
        '[2,1763780000,86400.0,"\\\\"a\\\\"",1763700000,"0a1b"]'
        >>> UrlHistory(3).encode()
        '[3]'
        """
        if not self.fetched:
            return f"[{self.depth}]"
        fields = [self.depth, self.fetched_cycle_s, self.interval_s, self.etag, self.last_modified_s, self.content_hash]
        if self.capture:
            fields.append(self.capture)
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> UrlHistory:
        """Inverse of ``encode``."""
        data = json.loads(text)
        if len(data) == 1:
            return cls(int(data[0]))
        depth, cycle_s, interval_s, etag, modified_s, digest, *capture = data
        return cls(int(depth), cycle_s, interval_s, etag, int(modified_s), digest, capture[0] if capture else "")


def parse_http_date(value: str | None) -> int:
    """An HTTP date as epoch seconds; 0 when missing or unreadable.

    >>> parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"), parse_http_date("soon")
    (784111777, 0)
    """
    if not value:
        return 0
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0
    return int(parsed.timestamp()) if parsed is not None else 0


class History:
    """Reads and writes the URL history of scheduled jobs."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def load(self, job_id: str, urls: Sequence[str]) -> dict[str, UrlHistory]:
        """The records of ``urls`` that exist (one round trip)."""
        if not urls:
            return {}
        raw = self._redis.hmget(redis_keys.job_history(job_id), list(urls))
        return {url: UrlHistory.decode(value) for url, value in zip(urls, raw, strict=True) if value}

    def save(self, job_id: str, records: Mapping[str, UrlHistory]) -> None:
        """Store records and their due times (one round trip)."""
        if not records:
            return
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(redis_keys.job_history(job_id), mapping={url: record.encode() for url, record in records.items()})
        pipe.zadd(redis_keys.job_due(job_id), {url: record.due_s() for url, record in records.items()})
        pipe.execute()

    def todo_pages(self, job_id: str, page_size: int = 2000) -> Iterator[list[tuple[str, int]]]:
        """The URLs a starting cycle took as due, with their depths, in fixed pages.

        The list was copied when the cycle started, so pages are the same on every call
        (a redelivered cycle start admits the same pages under the same tokens).
        """
        todo = redis_keys.job_todo(job_id)
        for start in range(0, int(self._redis.zcard(todo)), page_size):
            urls = [text(url) for url in self._redis.zrange(todo, start, start + page_size - 1)]
            records = self.load(job_id, urls)
            yield [(url, records[url].depth if url in records else 0) for url in urls]

    def size(self, job_id: str) -> int:
        """URLs with a record."""
        return int(self._redis.hlen(redis_keys.job_history(job_id)))

    def memory_bytes(self, job_id: str) -> int:
        """Redis memory of the history and due keys (``MEMORY USAGE`` with full sampling)."""
        total = 0
        for key in (redis_keys.job_history(job_id), redis_keys.job_due(job_id)):
            total += int(self._redis.memory_usage(key, samples=0) or 0)
        return total
