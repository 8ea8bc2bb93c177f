"""What one fetch uses, by lifetime: the services, the policy, and the hooks only a crawl job has.

- ``FetchServices``: objects with behaviour, made once per process (a single task's) or per job
  runtime (a job's own fetcher, identities and API secrets), each behind a small ``Protocol`` where
  the real one needs a socket, so the step runs in unit tests with in-process stand-ins.
- ``FetchPolicy``: plain values (the job's politeness, or the cluster's settings for single tasks).
- ``JobHooks``: what only a job's fetch batch has: its id, its cycle, its host's record in this
  batch, its WARC stage, its sitemaps. A single task has none (``FetchContext.job`` is None).
"""

from __future__ import annotations

import ipaddress
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.node_meter import NodeMeter
from engine.outcomes import SitemapRead
from fetchers import Fetcher, FetchResult, IdentityPool
from frontier import Entry, RobotsRules, UrlHistory
from storage.warc import WarcStage, WarcWriter
from telemetry.alerts import Alert
from vcrawl.jobs import RevisitSpec
from vcrawl.payloads import Rule
from vcrawl.policies import RetryPolicy

__all__ = [
    "AlertSink",
    "Cycle",
    "FetchContext",
    "FetchItem",
    "FetchPolicy",
    "FetchServices",
    "JobHooks",
    "PageStore",
    "PageTypeFetchers",
    "ProxyBench",
    "RobotsRulesCache",
    "SitemapReader",
]

AlertSink = Callable[[str, Alert], bool]
"""(cause, alert) -> whether it was sent: once per cause per alert window."""


class RobotsRulesCache(Protocol):
    """robots.txt rules by origin (``frontier.RobotsCache``: Redis with an in-process layer)."""

    def get(self, origin: str) -> RobotsRules | None:
        """The cached rules of ``origin``, or None: read robots.txt first."""
        ...

    def put(self, origin: str, rules: RobotsRules) -> None:
        """Keep ``rules`` for ``origin``."""
        ...


class PageStore(Protocol):
    """Where a 200 body goes (``storage.Storage``)."""

    def write_bytes(self, location: str, data: bytes) -> int:
        """Store ``data`` atomically at ``location``; return the bytes written."""
        ...


class PageTypeFetchers(Protocol):
    """Page type -> its fetcher (``fetchers.FetcherRegistry``), for page types other than static and api."""

    def get(self, page_type: str) -> Fetcher:
        """The fetcher of ``page_type``.

        Raises:
            UnknownComponent: no working fetcher for it in this process.
        """
        ...


class ProxyBench(Protocol):
    """The cluster's proxies cooling off (``fetchers.ProxyHealth``: kept in Redis)."""

    def draw(self, pool: Sequence[str], *, harvested: bool = False) -> str | None:
        """A proxy of ``pool`` to send a request through; None for no pool."""
        ...

    def has_healthy(self, pool: Sequence[str], *, harvested: bool = False) -> bool:
        """True if some proxy of ``pool`` is not cooling off."""
        ...

    def record(self, proxy: str | None, reason: str | None) -> None:
        """Note how a fetch through ``proxy`` ended (``reason`` of its failure, None for a response)."""
        ...


class SitemapReader(Protocol):
    """Where a job's sitemap entries go (``engine.sitemaps.SitemapSink``)."""

    def discover(self, entry: Entry, rules: RobotsRules | None, requested: bool, counts: Counter[str]) -> SitemapRead:
        """A discovery entry (an origin's robots.txt): queue the sitemaps it names."""
        ...

    def read(
        self, entry: Entry, result: FetchResult, counts: Counter[str], crawl_delay_s: float | None
    ) -> SitemapRead | None:
        """A sitemap's response, read and its URLs admitted; None for an answer worth a retry."""
        ...


@dataclass(frozen=True)
class Cycle:
    """A scheduled job's current cycle: URL history is kept and revisits are planned."""

    number: int
    started_s: float
    revisit: RevisitSpec = field(default_factory=RevisitSpec)


@dataclass(frozen=True)
class FetchServices:
    """What fetches: made once per process (a job's runtime brings its own fetcher, identities, secrets)."""

    fetcher: Fetcher  # static and api pages
    robots_fetcher: Fetcher  # robots.txt: its size cap, no redirect followed (read_robots follows them hop by hop)
    identities: IdentityPool
    robots: RobotsRulesCache
    store: PageStore
    fetchers: PageTypeFetchers | None = None  # other page types (the browser)
    proxies: ProxyBench | None = None  # the cluster's proxy bench; None: draw from the pool blindly
    alert: AlertSink | None = None
    api_auth: Mapping[str, str] = field(default_factory=dict, repr=False)  # api pages' secrets by auth name
    clock: Callable[[], float] = time.time
    meter: NodeMeter | None = None  # this process's wire counters, for its node's statistics; None: not counted


@dataclass(frozen=True)
class FetchPolicy:
    """How to fetch: a job's politeness and limits, or the cluster's settings for a single task."""

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # A job's narrowing of the cluster's network policy; None: the cluster's policy as it is.
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] | None = None
    # False (a job's): every page type's fetcher hands a redirect back, so admission sees each hop.
    follow_redirects: bool = True
    obey_robots: bool = True
    robots_token: str = "vcrawl"
    retry_after: str = "auto"  # what a 429/503 holds: its whole host (auto and host, with Retry-After) or its URL
    pace_after_robots: bool = True  # politeness on: a robots.txt request takes the host's slot
    robots_retry_s: float = 600.0  # an unreachable robots.txt is asked again after this


@dataclass(frozen=True)
class JobHooks:
    """What only a crawl job's fetch batch has (a single task has none)."""

    job_id: str  # for logs and alerts
    # The host -> 429/503 answers in a row so far (released batches' and this batch's).
    host_throttle: Callable[[str], int]
    # The host -> (requests given up for time, responses) so far.
    host_slowness: Callable[[str], tuple[int, int]]
    sitemaps: SitemapReader  # where the sitemaps the job reads go
    cycle: Cycle | None = None  # scheduled jobs
    # Where the job's captures go (``warc: true``): the fetch batch's stage (``engine.warc_stage``).
    warc: Callable[[], WarcStage | WarcWriter] | None = None


@dataclass(frozen=True)
class FetchContext:
    """The services, the policy and (a job's) hooks one fetch uses."""

    services: FetchServices
    policy: FetchPolicy = field(default_factory=FetchPolicy)
    job: JobHooks | None = None  # None: a single ``crawl.delay`` task

    @property
    def job_id(self) -> str:
        """The job's id, for logs and alerts; "" for a single task."""
        return self.job.job_id if self.job is not None else ""

    @property
    def cycle(self) -> Cycle | None:
        """A scheduled job's cycle; None for other jobs and single tasks."""
        return self.job.cycle if self.job is not None else None


@dataclass(frozen=True)
class FetchItem:
    """One URL to fetch: its queue entry, the rule it matched, where a 200 body goes, what is known of it."""

    entry: Entry
    rule: Rule
    save_path: str
    known: UrlHistory | None = None  # scheduled jobs: the URL's history before this visit
    unchanged_by_sitemap: bool = False  # this cycle's sitemap dates its last change before its last fetch
