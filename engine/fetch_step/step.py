"""The one fetch step, phase after phase: robots.txt, one request, the response sorted into an outcome.

``fetch_one`` is what both a crawl job's fetch batch and a single ``crawl.delay`` task call for
each URL: its origin's robots.txt (``robots``), the request (``request``), the capture of a job
that archives (``archive``), the response sorted (``response``, ``store``). A sitemap entry of a
job is read instead of stored (``engine.sitemaps``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from engine.api_pages import masked_result, with_rate_limit
from engine.fetch_step.archive import archive, with_capture
from engine.fetch_step.context import FetchContext, FetchItem, SitemapReader
from engine.fetch_step.request import page_request, send
from engine.fetch_step.response import retry_or_fail, sort_response
from engine.fetch_step.robots import Cleared, check_robots, read_robots_rules
from engine.fetch_step.visits import failed, visit_of
from engine.outcomes import (
    Failed,
    FetchOutcome,
    Retry,
    RobotsBlocked,
    RobotsFetched,
    SitemapRead,
    Unchanged,
    Visit,
)
from engine.sitemaps import is_discovery
from fetchers import FetchResult
from frontier import origin
from telemetry.log_context import log_context
from vcrawl import names
from vcrawl.errors import DownloadFailed, FetchFailed

__all__ = ["fetch_one", "stops_batch"]


def fetch_one(ctx: FetchContext, item: FetchItem) -> FetchOutcome:
    """Fetch one URL (reading its origin's robots.txt first when needed) and say what came of it.

    A sitemap entry (``Entry.sitemap``) is read and its URLs admitted (``engine.sitemaps``); it
    leaves no history: each cycle reads the sitemaps again.

    Raises:
        StorageFailed: the body could not be stored (the caller retries the whole step).
    """
    with log_context(job=ctx.job_id or None, url=item.entry.url):  # lines logged below say which URL
        outcome = _as_sitemap(item, _fetch_one(ctx, item)) if item.entry.sitemap else _fetch_one(ctx, item)
    if ctx.services.meter is not None:  # the node's statistics: a page stored, or a failure
        ctx.services.meter.outcome(outcome)
    return outcome


def _as_sitemap(item: FetchItem, outcome: FetchOutcome) -> FetchOutcome:
    """A sitemap entry's outcome: a sitemap not read is a sitemap problem, and it leaves no history."""
    if isinstance(outcome, Failed | RobotsBlocked):  # a sitemap not read is a sitemap problem, not a failed URL
        counts = Counter(outcome.visit.counts)
        reason = outcome.reason if isinstance(outcome, Failed) else names.COUNTER_ROBOTS_BLOCKED
        counts.pop(f"{names.PREFIX_FAILED}{reason}", None)
        counts.pop(names.COUNTER_ROBOTS_BLOCKED, None)
        counts[f"{names.PREFIX_SITEMAP_PROBLEM}{reason}"] += 1
        visit = outcome.visit
        return SitemapRead(
            outcome.entry, Visit(requested=visit.requested, crawl_delay_s=visit.crawl_delay_s, counts=counts)
        )
    if outcome.visit.revisit is not None:
        return replace(outcome, visit=replace(outcome.visit, revisit=None))
    return outcome


def stops_batch(outcome: FetchOutcome, obey_robots: bool = True) -> bool:
    """True when the host needs its pause before the batch's next URL."""
    if outcome.visit.host_wait_s > 0:
        return True
    match outcome:
        case Retry(scope="host") | RobotsFetched(again_in_batch=False):
            return True
        case SitemapRead(found=found):  # the host's next URLs come after what it listed is queued, its hints kept
            return found > 0
        case Failed(host_wait_s=wait) if wait > 0:
            return True
    # A host with a Crawl-delay gets its pause after every request, even with politeness off.
    return obey_robots and outcome.visit.requested and bool(outcome.visit.crawl_delay_s)


def _fetch_one(ctx: FetchContext, item: FetchItem) -> FetchOutcome:
    entry, counts = item.entry, Counter[str]()
    if item.unchanged_by_sitemap:  # no request: the sitemap read this cycle says nothing changed
        counts[names.COUNTER_UNCHANGED] += 1
        counts[names.COUNTER_UNCHANGED_BY_SITEMAP] += 1
        return Unchanged(entry, visit_of(ctx, item, counts, False, None))
    sitemaps = ctx.job.sitemaps if entry.sitemap and ctx.job is not None else None
    cleared = check_robots(ctx, item, counts)
    if not isinstance(cleared, Cleared):
        return cleared
    if sitemaps is not None and is_discovery(entry.url):  # robots.txt names the sitemaps: no request of its own
        return _discover(ctx, sitemaps, item, cleared, counts)
    crawl_delay_s = cleared.crawl_delay_s
    try:
        result = send(ctx, item.rule.page_type, page_request(ctx, item), counts)
    except FetchFailed as exc:
        return retry_or_fail(ctx, item, exc.reason, exc.retry_after_s, exc.http_status, counts, crawl_delay_s)
    except DownloadFailed as exc:
        return failed(ctx, item, exc.reason, exc.http_status, str(exc), counts, crawl_delay_s=crawl_delay_s)
    return _answered(ctx, item, result, counts, crawl_delay_s, sitemaps)


def _discover(
    ctx: FetchContext, sitemaps: SitemapReader, item: FetchItem, cleared: Cleared, counts: Counter[str]
) -> SitemapRead:
    """A discovery entry: the sitemaps its origin's robots.txt names, read even when robots.txt is not obeyed."""
    entry = item.entry
    rules, requested = cleared.rules, cleared.fetched_now
    if rules is None:  # robots.txt not obeyed: read all the same for its Sitemap lines
        rules = ctx.services.robots.get(origin(entry.url))
        if rules is None:
            rules, requested = read_robots_rules(ctx, entry.url), True
    return sitemaps.discover(entry, rules, requested, counts)


def _answered(
    ctx: FetchContext,
    item: FetchItem,
    result: FetchResult,
    counts: Counter[str],
    crawl_delay_s: float | None,
    sitemaps: SitemapReader | None,
) -> FetchOutcome:
    """A response came: archived if the job archives, then read as a sitemap, or sorted as a page."""
    if item.rule.page_type == "api" and sitemaps is None:
        # The secret never reaches storage; the API's rate limit holds the host.
        counts[names.COUNTER_FETCHED] += 1
        counts[f"{names.PREFIX_STATUS}{result.status}"] += 1
        result = masked_result(result, item.rule, ctx.services.api_auth)
        capture = archive(ctx, item, result, counts)
        outcome = with_capture(sort_response(ctx, item, result, counts, crawl_delay_s), capture)
        return with_rate_limit(outcome, result, ctx.services.clock(), ctx.policy.retry.max_retry_after_s)
    capture = archive(ctx, item, result, counts)
    if sitemaps is not None:  # not a page: counted as a sitemap, not as a page fetched
        read = sitemaps.read(item.entry, result, counts, crawl_delay_s)
        if read is not None:
            return read
    counts[names.COUNTER_FETCHED] += 1
    counts[f"{names.PREFIX_STATUS}{result.status}"] += 1
    return with_capture(sort_response(ctx, item, result, counts, crawl_delay_s), capture)
