"""The one fetch step: robots.txt, one request, the response sorted into an outcome.

``fetch_one`` is what both a crawl job's fetch batch and a single ``crawl.delay`` task call for
each URL. It reads robots.txt when the origin's rules are not cached (RFC 9309), refuses what
they disallow, fetches with an identity (User-Agent, Referer, proxy) drawn from the pool, stores
a 200 body, and returns one frozen outcome (``engine.outcomes``). It never waits: politeness
(when the host may be asked next) belongs to the caller, the frontier for jobs and the host gate
for single tasks, both counted from what the outcome says.

One module past ~500 lines on purpose: the step is one sequence (robots, request, outcome, storage,
archive) whose parts share the request's context; the outcomes and the deadline already live apart.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urljoin

from engine.api_pages import api_headers, masked_result, with_rate_limit
from engine.host_trouble import (
    HOST_TROUBLE,
    SLOW_REASONS,
    THROTTLED,
    keeps_timing_out,
    pool_exhausted,
    throttles,
)
from engine.outcomes import (
    Failed,
    FetchOutcome,
    Redirected,
    Retry,
    RobotsBlocked,
    RobotsFetched,
    SitemapRead,
    Stored,
    Unchanged,
    Visit,
)
from engine.sitemaps import SitemapSink, is_discovery
from fetchers import (
    BUILTIN_FETCHERS,
    RETRYABLE_STATUSES,
    Fetcher,
    FetcherRegistry,
    FetchRequest,
    FetchResult,
    IdentityPool,
    ProxyHealth,
    fetch_through,
    parse_retry_after,
    proxy_counter,
)
from frontier import (
    Entry,
    RobotsCache,
    RobotsResponse,
    RobotsRules,
    UrlHistory,
    content_hash,
    origin,
    read_robots,
    robots_url,
)
from storage import Storage
from storage.warc import WarcStage, WarcWriter
from telemetry.alerts import Alert
from telemetry.log_context import log_context
from vcrawl import names
from vcrawl.errors import DownloadFailed, FetchFailed, UnknownComponent, VcrawlError
from vcrawl.jobs import RevisitSpec
from vcrawl.payloads import FetchedPage, Rule
from vcrawl.policies import RetryPolicy

__all__ = ["Cycle", "FetchContext", "FetchItem", "fetch_one", "read_robots_rules", "stops_batch"]

logger = logging.getLogger(__name__)

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_LONGEST_HOST_WAIT_S = 3600.0
# Response headers worth carrying to the analysis stage and later re-crawls.
_KEPT_HEADERS = ("content-type", "content-length", "etag", "last-modified", "content-language")


@dataclass(frozen=True)
class Cycle:
    """A scheduled job's current cycle: URL history is kept and revisits are planned."""

    number: int
    started_s: float
    revisit: RevisitSpec = field(default_factory=RevisitSpec)


@dataclass(frozen=True)
class FetchContext:
    """The services and policy one fetch uses: a job's runtime, or the cluster's settings for a single task."""

    fetcher: Fetcher  # static pages
    robots_fetcher: Fetcher  # robots.txt: its size cap, no redirect followed (read_robots follows them hop by hop)
    identities: IdentityPool
    retry: RetryPolicy
    robots: RobotsCache
    store: Storage
    fetchers: FetcherRegistry | None = None  # other page types (the browser)
    proxies: ProxyHealth | None = None  # the cluster's proxy bench; None: draw from the pool blindly
    networks: tuple[Any, ...] | None = None  # a job's narrowing of the cluster's network policy
    # False (a job's): every page type's fetcher hands a redirect back, so admission sees each hop.
    follow_redirects: bool = True
    obey_robots: bool = True
    robots_token: str = "vcrawl"
    retry_after: str = "auto"  # what a 429/503 holds: the whole host, only its URL, or or auto (engine.host_trouble)
    # A job's host -> 429/503 answers in a row so far; None: a single task (its URL waits).
    host_throttle: Callable[[str], int] | None = None
    # A job's host -> (requests given up for time, responses) so far; None: a single task (URL only).
    host_slowness: Callable[[str], tuple[int, int]] | None = None
    pace_after_robots: bool = True  # politeness on: a robots.txt request takes the host's slot
    robots_retry_s: float = 600.0  # an unreachable robots.txt is asked again after this
    alert: Callable[[str, Alert], bool] | None = None  # send once per cause per alert window
    api_auth: Mapping[str, str] = field(default_factory=dict, repr=False)  # api pages' secrets by auth name
    # Where the job's captures go (``warc: true``): a fetch batch's stage (engine.warc_stage), or the writer.
    warc: Callable[[], WarcStage | WarcWriter] | None = None
    cycle: Cycle | None = None  # scheduled jobs
    sitemaps: SitemapSink | None = None  # a job's: where the sitemaps it reads go
    job_id: str = ""  # for logs and alerts; "" for a single task
    clock: Callable[[], float] = time.time


@dataclass(frozen=True)
class FetchItem:
    """One URL to fetch: its queue entry, the rule it matched, where a 200 body goes, what is known of it."""

    entry: Entry
    rule: Rule
    save_path: str
    known: UrlHistory | None = None  # scheduled jobs: the URL's history before this visit
    unchanged_by_sitemap: bool = False  # this cycle's sitemap dates its last change before its last fetch


def fetch_one(ctx: FetchContext, item: FetchItem) -> FetchOutcome:
    """Fetch one URL (reading its origin's robots.txt first when needed) and say what came of it.

    A sitemap entry (``Entry.sitemap``) is read and its URLs admitted (``engine.sitemaps``); it
    leaves no history: each cycle reads the sitemaps again.

    Raises:
        StorageFailed: the body could not be stored (the caller retries the whole step).
    """
    with log_context(job=ctx.job_id or None, url=item.entry.url):  # lines logged below say which URL
        outcome = _fetch_one(ctx, item)
    if not item.entry.sitemap:
        return outcome
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


def _fetch_one(ctx: FetchContext, item: FetchItem) -> FetchOutcome:
    entry, counts = item.entry, Counter[str]()
    crawl_delay_s: float | None = None
    if item.unchanged_by_sitemap:  # no request: the sitemap read this cycle says nothing changed
        counts[names.COUNTER_UNCHANGED] += 1
        counts[names.COUNTER_UNCHANGED_BY_SITEMAP] += 1
        return Unchanged(entry, _visit(ctx, item, counts, False, None))
    sitemaps = ctx.sitemaps if entry.sitemap else None
    rules: RobotsRules | None = None
    fetched_now = False
    if ctx.obey_robots:
        rules = ctx.robots.get(origin(entry.url))
        fetched_now = rules is None
        if rules is None:
            rules = _read_robots(ctx, entry.url, counts)
        if rules is None:  # the network policy refuses the host itself: its URLs cannot be fetched either
            return _failed(ctx, item, "blocked_address", None, "", counts, requested=False)
        crawl_delay_s = rules.crawl_delay(ctx.robots_token)
        visit = Visit(requested=fetched_now, crawl_delay_s=crawl_delay_s, counts=counts)
        if rules.kind == "disallow_all" and entry.attempt < ctx.retry.retries:
            # RFC 9309: unreachable robots.txt means "disallow all" until it can be read. Wait
            # for the next read (the error stays cached that long), then try again.
            return Retry(_next_attempt(entry), "robots_unavailable", ctx.robots_retry_s, "host", visit=visit)
        if fetched_now and (ctx.pace_after_robots or crawl_delay_s):
            return RobotsFetched(entry, visit)  # the robots.txt request used this politeness slot
        if not rules.can_fetch(entry.url, ctx.robots_token):
            counts[names.COUNTER_ROBOTS_BLOCKED] += 1
            return RobotsBlocked(entry, _visit(ctx, item, counts, fetched_now, crawl_delay_s))
    if sitemaps is not None and is_discovery(entry.url):  # robots.txt names the sitemaps: no request of its own
        requested = fetched_now
        if rules is None:  # robots.txt not obeyed: read all the same for its Sitemap lines
            rules = ctx.robots.get(origin(entry.url))
            if rules is None:
                rules, requested = read_robots_rules(ctx, entry.url), True
        return sitemaps.discover(entry, rules, requested, counts)
    request = FetchRequest(
        url=entry.url,
        user_agent=ctx.identities.user_agent(),
        referer=ctx.identities.referer(),
        proxy=_draw_proxy(ctx),
        js_function=item.rule.js_function,
        wait_for=item.rule.wait_for,
        conditional=item.known.conditional_headers() if item.known is not None else {},
        networks=ctx.networks or None,
        headers=api_headers(item.rule, ctx.api_auth) if item.rule.page_type == "api" else {},
        follow_redirects=ctx.follow_redirects,
    )
    try:
        result = _fetch(ctx, item.rule.page_type, request, counts)
    except FetchFailed as exc:
        return _retry_or_fail(ctx, item, exc.reason, exc.retry_after_s, exc.http_status, counts, crawl_delay_s)
    except DownloadFailed as exc:
        return _failed(ctx, item, exc.reason, exc.http_status, str(exc), counts, crawl_delay_s=crawl_delay_s)
    if (
        item.rule.page_type == "api" and sitemaps is None
    ):  # the secret never reaches storage; the API's rate limit holds the host
        counts[names.COUNTER_FETCHED] += 1
        counts[f"{names.PREFIX_STATUS}{result.status}"] += 1
        result = masked_result(result, item.rule, ctx.api_auth)
        capture = _archive(ctx, item, result, counts) if ctx.warc is not None else None
        return with_rate_limit(_with_capture(_sort_response(ctx, item, result, counts, crawl_delay_s), capture),
                               result, ctx.clock(), ctx.retry.max_retry_after_s)  # fmt: skip
    capture = _archive(ctx, item, result, counts) if ctx.warc is not None else None
    if sitemaps is not None:  # not a page: counted as a sitemap, not as a page fetched
        read = sitemaps.read(entry, result, counts, crawl_delay_s)
        if read is not None:
            return read
    counts[names.COUNTER_FETCHED] += 1
    counts[f"{names.PREFIX_STATUS}{result.status}"] += 1
    return _with_capture(_sort_response(ctx, item, result, counts, crawl_delay_s), capture)


def _draw_proxy(ctx: FetchContext) -> str | None:
    """A proxy for one request: through the proxy bench when there is one (with the harvested proxies,
    for a pool that takes them), else blindly from the pool."""
    if ctx.proxies is None:
        return ctx.identities.proxy()
    return ctx.proxies.draw(ctx.identities.proxies, harvested=ctx.identities.harvested)


def stops_batch(outcome: FetchOutcome, obey_robots: bool = True) -> bool:
    """True when the host needs its pause before the batch's next URL."""
    if outcome.visit.host_wait_s > 0:
        return True
    match outcome:
        case Retry(scope="host") | RobotsFetched():
            return True
        case SitemapRead(found=found):  # the host's next URLs come after what it listed is queued, its hints kept
            return found > 0
        case Failed(host_wait_s=wait) if wait > 0:
            return True
    # A host with a Crawl-delay gets its pause after every request, even with politeness off.
    return obey_robots and outcome.visit.requested and bool(outcome.visit.crawl_delay_s)


def _fetch(ctx: FetchContext, page_type: str, request: FetchRequest, counts: Counter[str]) -> FetchResult:
    """Fetch with the page type's fetcher. Through a proxy, every page type's outcome is counted for
    the proxy and goes on the cluster's proxy bench, and a proxy's fault is raised as FetchFailed."""
    fetcher: Fetcher = ctx.fetcher  # api pages: plain HTTP, the static fetcher's guard and limits
    if page_type not in ("static", "api"):
        assert ctx.fetchers is not None, "a fetch context for other page types has a fetcher registry"
        fetcher = _RegistryFetcher(ctx.fetchers, page_type)
    if request.proxy is None:
        return fetcher.fetch(request)
    try:
        result = fetch_through(fetcher, request, ctx.proxies)
    except (FetchFailed, DownloadFailed) as exc:
        counts[proxy_counter(request.proxy, exc.reason)] += 1
        raise
    counts[proxy_counter(request.proxy, None)] += 1
    return result


@dataclass(frozen=True)
class _RegistryFetcher:
    """A page type's fetcher from the registry, held to the fetch step's rules.

    A plug-in's unexpected exception (from its factory or its fetch) fails that page, counted as
    ``<page_type>_failed``, instead of aborting the whole batch; a plug-in that followed a redirect
    although the request said not to has it handed back as one, so admission still sees the target.
    """

    registry: FetcherRegistry
    page_type: str

    def fetch(self, request: FetchRequest) -> FetchResult:
        """Fetch ``request`` with the page type's fetcher.

        Raises:
            FetchFailed: as the fetcher does.
            DownloadFailed: as the fetcher does, and ``<page_type>_failed`` for a plug-in's bug.
        """
        if self.page_type in BUILTIN_FETCHERS:
            return self.registry.get(self.page_type).fetch(request)
        try:
            result = self.registry.get(self.page_type).fetch(request)
        except (FetchFailed, DownloadFailed, UnknownComponent):
            raise
        # Third-party code can raise anything; this is where it enters the fetch step.
        except Exception as exc:
            logger.warning("page type %s failed on %s: %r", self.page_type, request.url, exc)
            raise DownloadFailed(request.url, f"{self.page_type}_failed") from exc
        if request.follow_redirects or result.final_url == request.url:
            return result
        logger.warning("page type %s followed %s to %s: handed back as a redirect", self.page_type, request.url,
                       result.final_url)  # fmt: skip
        return replace(result, final_url=request.url, status=302, headers={"location": result.final_url}, body=b"")


def _sort_response(
    ctx: FetchContext, item: FetchItem, result: FetchResult, counts: Counter[str], crawl_delay_s: float | None
) -> FetchOutcome:
    entry, known = item.entry, item.known
    if result.status == 304 and known is not None and known.fetched:
        counts[names.COUNTER_NOT_MODIFIED] += 1
        counts[names.COUNTER_UNCHANGED] += 1
        return Unchanged(entry, _visit(ctx, item, counts, True, crawl_delay_s, result))
    if result.status == 200:
        return _store(ctx, item, result, counts, crawl_delay_s)
    # A redirect or a final error of a scheduled job: asked again when due.
    remember = result if result.status not in RETRYABLE_STATUSES else None
    if result.status in _REDIRECTS and "location" in result.headers:
        if entry.redirects_left <= 0:
            return _failed(ctx, item, "too_many_redirects", result.status, "", counts, crawl_delay_s=crawl_delay_s,
                           result=remember)  # fmt: skip
        counts[names.COUNTER_REDIRECTS] += 1
        target = _join(result.final_url, result.headers["location"])  # admission filters a malformed one
        return Redirected(entry, target, result.status, _visit(ctx, item, counts, True, crawl_delay_s, remember))
    if result.status in RETRYABLE_STATUSES:
        retry_after = parse_retry_after(result.headers.get("retry-after"))
        return _retry_or_fail(ctx, item, f"http_{result.status}", retry_after, result.status, counts, crawl_delay_s)
    return _failed(ctx, item, f"http_{result.status}", result.status, "", counts, crawl_delay_s=crawl_delay_s,
                   result=remember)  # fmt: skip


def _store(
    ctx: FetchContext, item: FetchItem, result: FetchResult, counts: Counter[str], crawl_delay_s: float | None
) -> FetchOutcome:
    """Store a 200 body; in a scheduled job, a body with the known content hash is Unchanged."""
    entry, known = item.entry, item.known
    history: str | None = None
    if ctx.cycle is not None:
        digest = content_hash(result.body)
        if known is not None and known.content_hash == digest:
            counts[names.COUNTER_UNCHANGED] += 1
            return Unchanged(entry, _visit(ctx, item, counts, True, crawl_delay_s, result))
        changed = known is not None and bool(known.content_hash)  # else: its first page
        counts[names.COUNTER_CHANGED if changed else names.COUNTER_NEW] += 1
        history = _history_of(ctx.cycle, item, result, changed=True, digest=digest).encode()
    ctx.store.write_bytes(item.save_path, result.body)
    counts[names.COUNTER_STORED] += 1
    counts[names.COUNTER_BYTES] += len(result.body)
    page = FetchedPage(
        url=entry.url,
        final_url=result.final_url,
        save_path=item.save_path,
        http_status=result.status,
        bytes=len(result.body),
        content_type=result.content_type,
        elapsed_s=result.elapsed_s,
        headers={name: result.headers[name] for name in _KEPT_HEADERS if name in result.headers},
        depth=entry.depth,
        fetched_at=datetime.now(UTC).isoformat(timespec="seconds"),
        history=history,
        ip=result.ip,
    )
    return Stored(entry, page, Visit(requested=True, crawl_delay_s=crawl_delay_s, counts=counts))


def _retry_or_fail(
    ctx: FetchContext,
    item: FetchItem,
    reason: str,
    retry_after_s: float | None,
    http_status: int | None,
    counts: Counter[str],
    crawl_delay_s: float | None,
) -> FetchOutcome:
    """Another attempt, or a final failure when the URL's retries are spent.

    A host that is down or overloaded (or sent Retry-After) pauses as a whole, with backoff;
    a single URL's error (a 500 on one page) only sends that URL to the back of its host's
    queue, so the host's other pages go on.
    """
    entry = item.entry
    delay_s = ctx.retry.delay_for(entry.attempt + 1, retry_after_s)
    slow_host = False
    if reason in SLOW_REASONS:
        counts[names.COUNTER_SLOW] += 1
        slow_host = keeps_timing_out(ctx, entry.url, reason)
    throttling = reason in THROTTLED and ctx.retry_after == "auto" and throttles(ctx, entry)
    # politeness.retry_after "url": a Retry-After makes only this URL wait (a site throttling one
    # resource); the host goes on. Without Retry-After, a 429/503 still means the host is in trouble.
    # "auto": a 429/503 makes only its URL wait while the host's other requests are answered.
    # A slow URL waits its backoff behind the host's other URLs, which go on meanwhile.
    url_only = (
        (retry_after_s is not None and ctx.retry_after == "url")
        or (reason in THROTTLED and ctx.retry_after == "auto" and not throttling)
        or (reason in SLOW_REASONS and not slow_host)
    )
    if delay_s is None:
        # A host that asked for a long wait gets it, even though this URL gives up.
        host_wait_s = min(retry_after_s, _LONGEST_HOST_WAIT_S) if retry_after_s is not None and not url_only else 0.0
        if slow_host:  # over its failure budget: the host is slowed even when the URL gives up
            host_wait_s = max(host_wait_s, min(ctx.retry.backoff_max_s, ctx.retry.backoff_s * 2**entry.attempt))
        failed = _failed(ctx, item, reason, http_status, "", counts, crawl_delay_s=crawl_delay_s)
        if ctx.job_id:  # a job's URL spent its retries (refused, timeout, 5xx): worth a look, unlike a 404
            # (a single task's final failure is logged where its trail records it: engine.failures)
            logger.warning("job %s: %s failed for good after %d attempts: %s", ctx.job_id, entry.url,
                           entry.attempt + 1, reason)  # fmt: skip
        return replace(failed, host_wait_s=host_wait_s, gave_up=True)
    counts[names.COUNTER_RETRIES] += 1
    visit = Visit(requested=True, crawl_delay_s=crawl_delay_s, counts=counts)
    retry = _next_attempt(entry)
    if url_only:
        return Retry(replace(retry, not_before_s=ctx.clock() + delay_s), reason, delay_s, "url", http_status, visit)
    host_wide = retry_after_s is not None or reason in HOST_TROUBLE or slow_host or pool_exhausted(ctx, reason)
    return Retry(retry, reason, delay_s, "host" if host_wide else "queue", http_status, visit)


def _failed(
    ctx: FetchContext,
    item: FetchItem,
    reason: str,
    http_status: int | None,
    error: str,
    counts: Counter[str],
    *,
    requested: bool = True,
    crawl_delay_s: float | None = None,
    result: FetchResult | None = None,
) -> Failed:
    counts[f"{names.PREFIX_FAILED}{reason}"] += 1
    visit = _visit(ctx, item, counts, requested, crawl_delay_s, result)
    return Failed(item.entry, reason, http_status, error or reason, visit=visit)


def _visit(
    ctx: FetchContext,
    item: FetchItem,
    counts: Mapping[str, int],
    requested: bool,
    crawl_delay_s: float | None,
    result: FetchResult | None = None,
) -> Visit:
    """The Visit of a fetch that found nothing new; a scheduled job remembers it in the URL's history."""
    revisit = None if ctx.cycle is None else _history_of(ctx.cycle, item, result, changed=False)
    return Visit(requested=requested, crawl_delay_s=crawl_delay_s, counts=counts, revisit=revisit)


def _history_of(
    cycle: Cycle, item: FetchItem, result: FetchResult | None, *, changed: bool, digest: str | None = None
) -> UrlHistory:
    known = replace(item.known, depth=item.entry.depth) if item.known is not None else UrlHistory(item.entry.depth)
    return known.after_visit(
        cycle_started_s=cycle.started_s,
        revisit=cycle.revisit,
        status=result.status if result is not None else None,
        headers=result.headers if result is not None else None,
        changed=changed,
        digest=digest,
    )


def _next_attempt(entry: Entry) -> Entry:
    return replace(entry, attempt=entry.attempt + 1, not_before_s=0.0)


def read_robots_rules(ctx: FetchContext, url: str) -> RobotsRules | None:
    """Read and cache robots.txt of ``url``'s origin now; None when the network policy refuses the origin."""
    return _read_robots(ctx, url, Counter())


def _read_robots(ctx: FetchContext, url: str, counts: Counter[str]) -> RobotsRules | None:
    """Read and cache robots.txt of the URL's origin; alert when it is unreachable (its URLs wait)."""

    def get(target: str) -> RobotsResponse:
        request = FetchRequest(url=target, user_agent=ctx.identities.user_agent(), networks=ctx.networks or None)
        result = ctx.robots_fetcher.fetch(request)
        return RobotsResponse(result.status, result.final_url, result.headers, result.body)

    rules, status = read_robots(url, get)
    if rules is None:
        logger.info("job %s: %s refused by the network policy", ctx.job_id or "-", origin(url))
        return None
    ctx.robots.put(origin(url), rules)
    counts[names.COUNTER_ROBOTS_FETCHED] += 1
    if rules.kind == "disallow_all":  # unreachable or 5xx: the host's URLs wait (RFC 9309)
        logger.warning("job %s: robots.txt of %s unreachable (status %s): its URLs wait, asked again in %g s",
                       ctx.job_id or "-", origin(url), status, ctx.robots_retry_s)  # fmt: skip
    if rules.kind == "disallow_all" and ctx.alert is not None:
        where = f"job {ctx.job_id}" if ctx.job_id else "single tasks"
        ctx.alert(
            f"{ctx.job_id or 'single'}:robots:{origin(url)}",
            Alert(
                subject=f"robots.txt of {origin(url)} unreachable in {where}",
                text=f"{robots_url(url)} answered {status if status is not None else 'nothing'}: the host's URLs "
                f"wait and robots.txt is read again every {ctx.robots_retry_s:g} s.",
                details={"job": ctx.job_id or None, "origin": origin(url), "status": status},
            ),
        )
    logger.debug("robots.txt of %s: %s (status %s)", origin(url), rules.kind, status)
    return rules


def _archive(ctx: FetchContext, item: FetchItem, result: FetchResult, counts: Counter[str]) -> str | None:
    """Write the exchange to this process's WARC file of the job (a store failure is counted, not fatal).

    In a re-crawl cycle, a 304 or a 200 with the body of the URL's last archived capture is written
    as a ``revisit`` record referring to that capture. Returns the new capture of a 200 written as a
    ``response`` ("<timestamp> <digest>", for the URL's history), else None.
    """
    assert ctx.warc is not None
    entry, known = item.entry, item.known
    refers_to = _revisit_of(ctx, known, result)
    try:
        if refers_to is not None:
            timestamp, digest = refers_to.split(" ", 1)
            ctx.warc().write_revisit(
                entry.url,
                fetched_at=datetime.now(UTC),
                status=result.status,
                response_headers=result.headers,
                refers_to_uri=entry.url,
                refers_to_date=timestamp,
                digest=digest,
                not_modified=result.status == 304,
            )
            counts[names.COUNTER_WARC_RECORDS] += 1
            return None
        written = ctx.warc().write_exchange(
            entry.url,
            request_headers=result.request_headers,
            status=result.status,
            reason=result.reason,
            response_headers=result.headers,
            body=result.body,
            fetched_at=datetime.now(UTC),
            ip=result.ip or None,  # no WARC-IP-Address when unknown (through a proxy, the browser)
        )
        counts[names.COUNTER_WARC_RECORDS] += 1
    except (VcrawlError, OSError, ValueError) as exc:
        logger.warning("WARC write of %s failed: %r", entry.url, exc)
        counts[names.COUNTER_WARC_FAILED] += 1
        return None
    return f"{written.timestamp} {written.digest}" if result.status == 200 and ctx.cycle is not None else None


def _revisit_of(ctx: FetchContext, known: UrlHistory | None, result: FetchResult) -> str | None:
    """The capture an unchanged page's revisit record refers to (None: archive the response in full)."""
    if ctx.cycle is None or known is None or not known.fetched or not known.capture:
        return None
    if result.status == 304:
        return known.capture
    if result.status == 200 and known.content_hash == content_hash(result.body):
        return known.capture
    return None


def _with_capture(outcome: FetchOutcome, capture: str | None) -> FetchOutcome:
    """The outcome with ``capture`` (a WARC response just written) in the URL's history it carries."""
    if capture is None:
        return outcome
    if isinstance(outcome, Stored) and outcome.page.history:
        history = replace(UrlHistory.decode(outcome.page.history), capture=capture)
        return replace(outcome, page=replace(outcome.page, history=history.encode()))
    if outcome.visit.revisit is not None:  # an unchanged page archived in full: later revisits refer to it
        return replace(outcome, visit=replace(outcome.visit, revisit=replace(outcome.visit.revisit, capture=capture)))
    return outcome


def _join(base: str, location: str) -> str:
    """The redirect target; a Location urljoin cannot parse is kept as is, for admission to refuse."""
    try:
        return urljoin(base, location.strip())
    except ValueError:
        return location.strip()
