"""What one fetch of one URL came to: a frozen record per URL, for a batch to fold or a task to report.

``fetch_one`` returns exactly one of these. A crawl job's fetch batch folds them into the
release of its lease (``engine.fetch_batch``); a single ``crawl.delay`` task turns one into its status
trail and its Celery outcome (``tasks.fetch``). Every outcome carries its ``Visit``: what was
observed on the way (whether a request went out, the host's Crawl-delay, counters, and for
scheduled jobs the URL's history after this visit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from frontier import Entry, UrlHistory
from vcrawl.payloads import FetchedPage

__all__ = [
    "Failed",
    "FetchOutcome",
    "Redirected",
    "Retry",
    "RobotsBlocked",
    "RobotsFetched",
    "SitemapRead",
    "Stored",
    "Unchanged",
    "Visit",
]


@dataclass(frozen=True)
class Visit:
    """What a fetch observed, whatever its outcome."""

    requested: bool = False  # a request (robots.txt or the page) went to the host
    crawl_delay_s: float | None = None  # the host's Crawl-delay for us, when robots.txt was read
    counts: Mapping[str, int] = field(default_factory=dict)  # job counters this fetch adds
    revisit: UrlHistory | None = None  # scheduled jobs: the URL's history to write when the batch ends
    # The host asked for no request this long (a Retry-After, an API's spent rate limit): held at every worker.
    host_wait_s: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", MappingProxyType(dict(self.counts)))  # a record: no later changes


@dataclass(frozen=True)
class Stored:
    """A 200: the body is in storage at ``page.save_path``."""

    entry: Entry
    page: FetchedPage
    visit: Visit = field(default_factory=Visit)


@dataclass(frozen=True)
class Redirected:
    """A 3xx with a Location: the target is admitted as a link of its own (dedup sees every hop)."""

    entry: Entry
    target: str
    http_status: int = 302
    visit: Visit = field(default_factory=Visit)


@dataclass(frozen=True)
class Unchanged:
    """A scheduled job's known URL answered 304, or the same content hash: nothing to analyse."""

    entry: Entry
    visit: Visit = field(default_factory=Visit)


@dataclass(frozen=True)
class RobotsBlocked:
    """robots.txt disallows the URL for our token: no request was made for it."""

    entry: Entry
    visit: Visit = field(default_factory=Visit)


@dataclass(frozen=True)
class RobotsFetched:
    """robots.txt was read just now and took the host's politeness slot: the URL goes again first
    (``again_in_batch``: later in the same paced batch, a pause on)."""

    entry: Entry
    visit: Visit = field(default_factory=Visit)
    again_in_batch: bool = False


@dataclass(frozen=True)
class Retry:
    """Another attempt may help. ``entry`` is the next attempt; ``scope`` says who waits ``delay_s``:

    - ``host``: the host is down, overloaded or asked for a wait: the whole host pauses;
    - ``url``: only this URL waits for its Retry-After (``politeness.retry_after: url``);
    - ``queue``: one URL's own error: it goes behind the host's other URLs, no pause.
    """

    entry: Entry
    reason: str
    delay_s: float
    scope: Literal["host", "url", "queue"]
    http_status: int | None = None
    visit: Visit = field(default_factory=Visit)


@dataclass(frozen=True)
class Failed:
    """The URL failed for good; ``host_wait_s`` > 0 when the host asked for a long wait all the same."""

    entry: Entry
    reason: str
    http_status: int | None = None
    error: str = ""
    host_wait_s: float = 0.0
    visit: Visit = field(default_factory=Visit)
    gave_up: bool = False  # a transient trouble that outlasted the URL's retries


@dataclass(frozen=True)
class SitemapRead:
    """A sitemap was read (or found missing or unreadable: see the visit's counters); what it
    listed is admitted already. The URL is done; the host's next URLs come in another batch."""

    entry: Entry
    visit: Visit = field(default_factory=Visit)
    found: int = 0  # URLs (pages, sitemaps) it led to, before scope and dedup


FetchOutcome = Stored | Redirected | Unchanged | RobotsBlocked | RobotsFetched | Retry | Failed | SitemapRead
