"""Sitemaps as a way into a site: discovered, read in the fetch step, their URLs admitted.

A job with ``sitemaps: "robots"`` (the default) or ``true`` queues one discovery entry per seed
origin (``engine.jobs.seed_links``): the origin's ``/robots.txt`` marked as a sitemap. The fetch
step answers it without a request of its own (robots.txt is read for every host anyway): the
``Sitemap:`` lines of robots.txt are queued as sitemaps; with ``true``, ``/sitemap.xml`` when
robots.txt names none. A job that lists sitemap URLs queues those instead. A sitemap is fetched
like a page (robots, politeness, network policy, proxies, body cap), read by
``analyzers.sitemaps.parse_sitemap``, and what it lists is admitted right there, through the
job's scope, filters and dedup: pages one level deeper than the sitemap, the sitemaps of an
index one nesting level deeper (at most ``MAX_NESTING``). Each listed URL's hints (``lastmod``,
``priority``, ``changefreq``) are kept per job; a scheduled job does not fetch a known URL again
in a cycle whose sitemap says it has not changed since.

Reading in the fetch step, not the analysis, is what makes ``lastmod`` usable: the batch stops
after a sitemap, so the host's next URLs are leased after its hints are known.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urljoin, urlsplit

from analyzers.sitemaps import Sitemap, SitemapUrl, parse_sitemap
from engine.jobs import JobRuntime, Link, admit_links
from engine.outcomes import SitemapRead, Visit
from fetchers import RETRYABLE_STATUSES, FetchResult
from frontier import Entry, Frontier, RobotsRules, canonical_url, origin
from vcrawl import names, redis_keys

__all__ = [
    "MAX_NESTING",
    "SitemapHint",
    "SitemapSink",
    "discovery_links",
    "is_discovery",
    "listed_links",
    "sitemap_counts",
    "unchanged_by_hint",
]

logger = logging.getLogger(__name__)

_REDIRECTS = frozenset({301, 302, 303, 307, 308})

MAX_NESTING = 3
"""Sitemap levels read: named (1), listed by an index (2), listed by an index an index lists (3)."""


def is_discovery(url: str) -> bool:
    """True for a discovery entry's URL (an origin's robots.txt)."""
    return urlsplit(url).path == "/robots.txt"


def discovery_links(
    url: str, robots_sitemaps: Sequence[str], depth: int, redirects_left: int, *, probe: bool = True
) -> list[Link]:
    """The sitemaps a discovery entry leads to: robots.txt's, else (``probe``) the origin's /sitemap.xml."""
    named = [item for item in robots_sitemaps if urlsplit(item).scheme in ("http", "https")]
    if not named and probe:
        named = [f"{origin(url)}/sitemap.xml"]
    return [Link(item, depth, redirects_left, sitemap=1) for item in named]


def listed_links(sitemap: Sitemap, level: int, depth: int, redirects_left: int) -> tuple[list[Link], int]:
    """What a sitemap file lists, as links to admit; and how many sitemaps were over the nesting cap."""
    if sitemap.kind == "index":
        if level >= MAX_NESTING:
            return [], len(sitemap.urls)
        return [Link(item.url, depth, redirects_left, sitemap=level + 1) for item in sitemap.urls], 0
    return [Link(item.url, depth + 1, redirects_left) for item in sitemap.urls], 0


@dataclass(frozen=True)
class SitemapHint:
    """What a sitemap said of one URL, and in which cycle it was read."""

    cycle: int
    lastmod_s: float | None = None
    priority: float | None = None
    changefreq: str | None = None

    def encode(self) -> str:
        """Compact JSON, as kept in Redis."""
        data: dict[str, Any] = {"c": self.cycle}
        for key, value in (("m", self.lastmod_s), ("p", self.priority), ("f", self.changefreq)):
            if value is not None:
                data[key] = value
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> SitemapHint:
        """Inverse of ``encode``."""
        data = json.loads(text)
        return cls(int(data["c"]), data.get("m"), data.get("p"), data.get("f"))


class SitemapSink:
    """Where a fetch batch's sitemaps go: their URLs into the job's frontier, their hints into Redis."""

    def __init__(self, runtime: JobRuntime, frontier: Frontier, batch_id: str) -> None:
        self._runtime = runtime
        self._frontier = frontier
        self._batch_id = batch_id

    def admit(self, sitemap_url: str, links: Iterable[Link], priorities: Mapping[str, float] | None = None) -> None:
        """Admit a sitemap's links (its own token: a repeated read admits nothing twice); ``priorities``:
        the sitemap's ``priority`` of listed URLs (what a priority job scores them with)."""
        admit_links(self._runtime, self._frontier, links, done=0, token=f"sitemap:{self._batch_id}:{sitemap_url}",
                    counters=Counter(), sitemap_priorities=priorities)  # fmt: skip

    def discover(self, entry: Entry, rules: RobotsRules | None, requested: bool, counts: Counter[str]) -> SitemapRead:
        """A discovery entry: queue its origin's sitemaps (robots.txt's, else /sitemap.xml)."""
        named = rules.sitemaps(entry.url) if rules is not None else ()  # entry.url: the origin's robots.txt
        probe = self._runtime.spec.sitemaps is True  # the default ("robots") asks the site nothing more
        links = discovery_links(entry.url, named, entry.depth, entry.redirects_left, probe=probe)
        if links:
            self.admit(entry.url, links)
        return SitemapRead(entry, Visit(requested=requested, counts=counts), found=len(links))

    def read(
        self, entry: Entry, result: FetchResult, counts: Counter[str], crawl_delay_s: float | None
    ) -> SitemapRead | None:
        """A sitemap's response: read it and admit what it lists. None for an answer worth a retry
        (429, 5xx): the fetch step retries it like a page's."""
        if result.status == 200:
            sitemap = parse_sitemap(result.body, base_url=result.final_url)
            if result.truncated:  # its connection closed early on its last attempt: what came is read
                sitemap = replace(sitemap, problem=sitemap.problem or "truncated")
            links, over = listed_links(sitemap, entry.sitemap, entry.depth, entry.redirects_left)
            listed = None  # the listed URLs' priorities: only a priority job scores with them
            if self._runtime.spec.strategy == names.STRATEGY_PRIORITY:
                listed = {item.url: item.priority for item in sitemap.urls if item.priority is not None}
            self.admit(entry.url, links, listed)
            found = len(links)
            if sitemap.kind != "index":
                self.note(sitemap.urls)
            counts.update(sitemap_counts(sitemap, over))
            if sitemap.problem is not None or over:
                logger.warning("job %s: sitemap %s: %s (%d entries read)", self._runtime.job_id, entry.url,
                               sitemap.problem or "nested too deep", len(sitemap.urls))  # fmt: skip
            return SitemapRead(entry, Visit(requested=True, crawl_delay_s=crawl_delay_s, counts=counts), found)
        if result.status in _REDIRECTS and "location" in result.headers:
            if entry.redirects_left <= 0:
                counts[f"{names.PREFIX_SITEMAP_PROBLEM}too_many_redirects"] += 1
            else:
                target = urljoin(result.final_url, result.headers["location"].strip())
                self.admit(entry.url, [(target, entry.depth, entry.redirects_left - 1, entry.sitemap)])
                return SitemapRead(entry, Visit(requested=True, crawl_delay_s=crawl_delay_s, counts=counts), 1)
            return SitemapRead(entry, Visit(requested=True, crawl_delay_s=crawl_delay_s, counts=counts))
        if result.status in RETRYABLE_STATUSES:
            return None
        counts[f"{names.PREFIX_SITEMAP_PROBLEM}http_{result.status}"] += 1  # a missing /sitemap.xml: no failure
        return SitemapRead(entry, Visit(requested=True, crawl_delay_s=crawl_delay_s, counts=counts))

    def note(self, urls: Sequence[SitemapUrl]) -> None:
        """Keep each listed page's hints, under its canonical URL (as the frontier knows it)."""
        hints: dict[str, str] = {}
        for item in urls:
            try:
                key = canonical_url(item.url)
            except ValueError:
                continue
            hint = SitemapHint(self._runtime.cycle, item.lastmod_s, item.priority, item.changefreq)
            hints[key] = hint.encode()
        if hints:
            self._frontier.scripts.client.hset(redis_keys.job_sitemap_hints(self._runtime.job_id), mapping=hints)

    def hints(self, urls: Sequence[str]) -> dict[str, SitemapHint]:
        """The hints kept for ``urls`` (one round trip)."""
        if not urls:
            return {}
        raw = self._frontier.scripts.client.hmget(redis_keys.job_sitemap_hints(self._runtime.job_id), list(urls))
        return {url: SitemapHint.decode(value) for url, value in zip(urls, raw, strict=True) if value is not None}


def unchanged_by_hint(hint: SitemapHint | None, cycle: int, fetched_s: float | None) -> bool:
    """True when this cycle's sitemap dates the URL's last change before its last fetch."""
    return (
        hint is not None
        and hint.cycle == cycle
        and hint.lastmod_s is not None
        and fetched_s is not None
        and hint.lastmod_s <= fetched_s
    )


def sitemap_counts(sitemap: Sitemap, over_nesting: int) -> Mapping[str, int]:
    """The job counters one sitemap file adds."""
    counts: Counter[str] = Counter({names.COUNTER_SITEMAPS_READ: 1})
    if sitemap.kind == "index":
        counts[names.COUNTER_SITEMAPS_LISTED] += len(sitemap.urls)
    else:
        counts[names.COUNTER_SITEMAP_URLS] += len(sitemap.urls)
    if sitemap.problem is not None:
        counts[f"{names.PREFIX_SITEMAP_PROBLEM}{sitemap.problem}"] += 1
    if over_nesting:
        counts[f"{names.PREFIX_SITEMAP_PROBLEM}too_deep"] += 1
    if sitemap.skipped:
        counts[f"{names.PREFIX_SITEMAP_PROBLEM}bad_loc"] += sitemap.skipped
    return counts
