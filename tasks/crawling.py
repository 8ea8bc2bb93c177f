"""One fetch batch and one analysis batch of a crawl job, as plain functions.

A fetch batch holds URLs of one host leased from the frontier. Its fetches go out one
after another; the batch ends by releasing the lease, which sets the host's next
allowed time. Pages (200) are stored and handed to the analysis batch, which extracts
links and records and admits the links through one atomic admission call.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urljoin, urlsplit

from analyzers import Page, followed_links, run_analysis
from fetchers import (
    RETRYABLE_STATUSES,
    FetcherRegistry,
    FetchRequest,
    FetchResult,
    ProxyHealth,
    fetch_through,
    is_proxy_fault,
    parse_retry_after,
    proxy_counter,
)
from frontier import (
    Batch,
    BatchRelease,
    Entry,
    Frontier,
    History,
    RobotsCache,
    RobotsRules,
    UrlHistory,
    content_hash,
    next_interval,
    origin,
    parse_http_date,
    robots_url,
)
from storage import Storage, page_location
from storage.records import RecordWriter
from storage.warc import WarcWriter
from tasks.alerts import Alert, Alerter
from tasks.jobs import JobRuntime, RuntimeCache, admit_links, lease_ms
from vcrawl.errors import DownloadFailed, FetchFailed, MissingPage, VcrawlError
from vcrawl.jobs import Rule
from vcrawl.payloads import FieldRule

__all__ = ["CrawlEnv", "abandon_analysis", "run_analyze_batch", "run_fetch_batch"]

logger = logging.getLogger(__name__)

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_ROBOTS_REDIRECTS = 5  # RFC 9309 §2.3.1.2
_STATE_CHECK_S = 0.2  # a running batch notices a cancel or pause within this (plus one fetch)


@dataclass(frozen=True)
class CrawlEnv:
    """The per-process services a crawl batch uses."""

    frontier: Frontier
    runtimes: RuntimeCache
    robots: RobotsCache
    storage: Storage
    alerter: Alerter
    alert_once: Callable[[str], bool]
    fetchers: FetcherRegistry | None = None
    records: Callable[[str], RecordWriter] | None = None  # job id -> this process's record writer
    warc: Callable[[str], WarcWriter] | None = None  # job id -> this process's WARC writer
    history: History | None = None  # URL history of scheduled jobs
    robots_retry_s: float = 600.0
    clock: Callable[[], float] = time.time
    host_alert: tuple[float, int] = (0.5, 20)  # alert when this share of a host's URLs failed, after this many
    proxies: ProxyHealth | None = None  # the cluster's proxy bench; None: draw from the pool blindly


@dataclass
class _BatchRun:
    """What happened in one fetch batch, to release and to hand on."""

    pages: list[dict[str, Any]]
    redirects: list[dict[str, Any]]
    requeue: list[Entry]
    counters: Counter[str]
    requeue_back: list[Entry] = field(default_factory=list)
    done: int = 0
    last_start: float | None = None
    host_delay_until: float = 0.0
    crawl_delay_s: float | None = None
    known: dict[str, UrlHistory] = field(default_factory=dict)  # scheduled jobs: history of the batch's URLs
    revisited: dict[str, UrlHistory] = field(default_factory=dict)  # history to write when the batch ends
    failures: list[tuple[str, str]] = field(default_factory=list)  # (url, reason) of final failures


def run_fetch_batch(env: CrawlEnv, job_id: str, batch: Batch) -> dict[str, Any]:
    """Fetch a leased batch, store its pages, release the lease; return what analysis needs."""
    runtime = env.runtimes.get(job_id, batch.cycle)
    nothing: dict[str, Any] = {"job": job_id, "batch": batch.batch_id, "pages": [], "redirects": []}
    if batch.cycle:
        nothing["cycle"] = batch.cycle
    run = _BatchRun([], [], [], Counter())
    started = env.frontier.queue.start_lease(job_id, batch.batch_id, lease_ms(runtime))
    if started == "stale":
        handed_on = env.frontier.queue.handed_on(job_id, batch.batch_id)
        if handed_on is not None:  # released, but its worker died before it sent the analysis
            logger.warning("job %s: batch %s was fetched before; its analysis goes again", job_id, batch.batch_id)
            return handed_on
        logger.warning("job %s: batch %s came after its lease ran out; skipped", job_id, batch.batch_id)
        return nothing  # its URLs went back to the queue
    if started == "stopped":  # cancelled while the batch waited in the queue: give it back
        env.frontier.queue.release(
            job_id, batch, BatchRelease(pause_ms=0, done=0, requeue=batch.entries, fetched=False)
        )
        return nothing
    if runtime.cycle:
        assert env.history is not None, "a crawl environment for scheduled jobs keeps URL history"
        run.known = env.history.load(job_id, [entry.url for entry in batch.entries])
    checked_at = env.clock()
    for index, entry in enumerate(batch.entries):
        # Cancel or pause stops the batch before its next URL; asked at most every _STATE_CHECK_S,
        # which spares a Redis round trip per URL when the host answers fast.
        if index > 0 and env.clock() - checked_at >= _STATE_CHECK_S:
            checked_at = env.clock()
            if not env.frontier.jobs.is_running(job_id, batch.cycle):  # hand the rest back
                run.requeue.extend(batch.entries[index:])
                break
        if entry.not_before_s > env.clock():  # a retry still in its Retry-After: the host's other URLs go first
            run.requeue_back.append(entry)
            continue
        if _fetch_entry(env, runtime, entry, run):
            run.requeue.extend(batch.entries[index + 1 :])
            break
    pause, host_delay_s = _host_wait_s(env, runtime, run)
    result = {**nothing, "pages": run.pages, "redirects": run.redirects}
    handed_on = json.dumps(result, separators=(",", ":")) if run.pages or run.redirects else ""
    released = env.frontier.queue.release(
        job_id,
        batch,
        BatchRelease(
            pause_ms=pause * 1000,
            host_delay_ms=host_delay_s * 1000,
            done=run.done,
            requeue=tuple(run.requeue),
            requeue_back=tuple(run.requeue_back),
            counters=run.counters,
            crawl_delay_s=run.crawl_delay_s if runtime.spec.politeness.obey_robots else None,
            history=run.revisited,
            failures=tuple({"url": url, "reason": reason, "at": round(env.clock(), 3)} for url, reason in run.failures),
            host_done=run.done + len(run.pages) + len(run.redirects),
            fetched=run.last_start is not None,  # else its Crawl-delay (or unknown robots.txt) still holds
            handed_on=handed_on,
        ),
    )
    if released is None:  # reclaimed meanwhile: its URLs are queued again, this run does not count
        return nothing
    if run.failures:
        _check_host(env, runtime, batch.host, run.failures)
    return result


def _host_wait_s(env: CrawlEnv, runtime: JobRuntime, run: _BatchRun) -> tuple[float, float]:
    """(pause after the batch's start, wait from now) before the host's next request; retries
    still waiting for their Retry-After are moved behind the host's other URLs on the way."""
    # A retry still waiting for its Retry-After goes behind the host's other URLs even when the
    # batch hands its rest back (cancel, pause, a host pause): at the front it would hold the host.
    now = env.clock()
    if any(entry.not_before_s > now for entry in run.requeue):
        run.requeue_back.extend(entry for entry in run.requeue if entry.not_before_s > now)
        run.requeue = [entry for entry in run.requeue if entry.not_before_s <= now]
    if run.last_start is None and run.requeue_back:
        # Only waiting retries were leased: the host has nothing due before the first of them.
        waiting_until = min((entry.not_before_s for entry in run.requeue_back), default=0.0)
        run.host_delay_until = max(run.host_delay_until, waiting_until)
    pause = runtime.politeness.pause_s()
    if run.crawl_delay_s is not None and runtime.spec.politeness.obey_robots:
        pause = max(pause, run.crawl_delay_s)
    host_delay_s = max(0.0, run.host_delay_until - env.clock())
    if pause > 0 and run.last_start is not None:
        # The frontier counts the pause from the lease's start, but a request may go out some
        # milliseconds later (a busy thread, the robots.txt lookup), and the next one faster: 2.6 %
        # of Scrapy's gaps are short by that much. Counted from the release (Redis time, after the
        # last response ended), the next request to the host can never come early.
        host_delay_s = max(host_delay_s, pause)
    return pause, host_delay_s


def _check_host(env: CrawlEnv, runtime: JobRuntime, host: str, failures: list[tuple[str, str]]) -> None:
    """Alert (once per window) when most of a host's URLs fail: the site is down or blocking us."""
    rate, at_least = env.host_alert
    done, failed = env.frontier.stats.host_totals(runtime.job_id, host)
    if done < at_least or failed < rate * done:
        return
    reasons = Counter(reason for _, reason in failures)
    _alert(
        env,
        f"{runtime.job_id}:host:{host}",
        Alert(
            subject=f"host {host} failing in job {runtime.job_id}",
            text=f"{failed} of {done} URLs of {host} failed for good (recent reasons: {dict(reasons)}). "
            f"Further alerts for this host in this job are held back for the alert window.",
            details={
                "job": runtime.job_id,
                "host": host,
                "done": done,
                "failed": failed,
                "example": failures[-1][0],
                "reasons": dict(reasons),
            },
        ),
    )


def _alert(env: CrawlEnv, cause: str, alert: Alert) -> None:
    """Send ``alert`` unless one for ``cause`` went out in the alert window."""
    if env.alert_once(cause):
        env.alerter.send(alert)


def _fetch_entry(env: CrawlEnv, runtime: JobRuntime, entry: Entry, run: _BatchRun) -> bool:
    """Fetch one URL of the batch; return True to stop the batch (the host needs a pause)."""
    spec = runtime.spec
    if spec.politeness.obey_robots:
        rules = env.robots.get(origin(entry.url))
        fetched_robots = rules is None
        if rules is None:
            rules = _fetch_robots(env, runtime, entry.url, run)
        if rules is None:  # the network policy refuses the host itself: its URLs cannot be fetched either
            _remember(runtime, entry, run)
            return _final_failure(run, "blocked_address", entry.url)
        run.crawl_delay_s = rules.crawl_delay(spec.politeness.robots_token)
        if rules.kind == "disallow_all" and entry.attempt < runtime.limits.retries:
            # RFC 9309: unreachable robots.txt means "disallow all" until it can be read. Wait
            # for the next read (the error stays cached that long), then try again.
            run.requeue.append(Entry(entry.url, entry.depth, entry.attempt + 1, entry.redirects_left))
            run.host_delay_until = max(run.host_delay_until, env.clock() + env.robots_retry_s)
            return True
        if fetched_robots and (not runtime.eager or run.crawl_delay_s):
            run.requeue.append(entry)  # the robots.txt request used this politeness slot
            return True
        if not rules.can_fetch(entry.url, spec.politeness.robots_token):
            run.counters["robots_blocked"] += 1
            run.done += 1
            _remember(runtime, entry, run)
            return False
    rule = spec.rule_for(entry.url)
    run.last_start = env.clock()
    request = FetchRequest(
        url=entry.url,
        user_agent=runtime.identities.user_agent(),
        referer=runtime.identities.referer(),
        proxy=runtime.identities.proxy() if env.proxies is None else env.proxies.draw(runtime.identities.proxies),
        js_function=rule.js_function,
        wait_for=rule.wait_for,
        conditional=run.known[entry.url].conditional_headers() if entry.url in run.known else {},
        networks=runtime.networks or None,
    )
    try:
        if rule.page_type == "static":
            fetcher = runtime.fetcher
        else:
            assert env.fetchers is not None, "a crawl environment with browser work has a fetcher registry"
            fetcher = env.fetchers.get(rule.page_type)
        result = _fetch_static(env, runtime, request, run) if rule.page_type == "static" else fetcher.fetch(request)
    except FetchFailed as exc:
        return _retry_or_fail(env, runtime, entry, run, exc.reason, exc.retry_after_s)
    except DownloadFailed as exc:
        _remember(runtime, entry, run)
        return _final_failure(run, exc.reason, entry.url)
    run.counters["fetched"] += 1
    run.counters[f"status:{result.status}"] += 1
    if spec.warc:
        _archive(env, runtime, entry, result, run)
    stop = _handle_response(env, runtime, entry, run, result, rule)
    # A host with a Crawl-delay gets its pause after every request, even with politeness off.
    return stop or bool(run.crawl_delay_s and spec.politeness.obey_robots)


def _archive(env: CrawlEnv, runtime: JobRuntime, entry: Entry, result: FetchResult, run: _BatchRun) -> None:
    """Write the exchange to this process's WARC file of the job (a store failure is counted, not fatal)."""
    assert env.warc is not None, "a crawl environment for WARC jobs has WARC writers"
    try:
        env.warc(runtime.job_id).write_exchange(
            entry.url,
            request_headers=result.request_headers,
            status=result.status,
            reason=result.reason,
            response_headers=result.headers,
            body=result.body,
            fetched_at=datetime.now(UTC),
        )
        run.counters["warc_records"] += 1
    except (VcrawlError, OSError, ValueError) as exc:
        logger.warning("WARC write of %s failed: %r", entry.url, exc)
        run.counters["warc_failed"] += 1


def _handle_response(
    env: CrawlEnv, runtime: JobRuntime, entry: Entry, run: _BatchRun, result: FetchResult, rule: Rule
) -> bool:
    known = run.known.get(entry.url)
    if result.status == 304 and known is not None and known.fetched:
        run.counters["not_modified"] += 1
        run.counters["unchanged"] += 1
        run.done += 1
        _remember(runtime, entry, run, result)
        return False
    if result.status == 200:
        job_id = runtime.job_id
        revisit: UrlHistory | None = None
        if runtime.cycle:
            digest = content_hash(result.body)
            if known is not None and known.content_hash == digest:
                run.counters["unchanged"] += 1
                run.done += 1
                _remember(runtime, entry, run, result)
                return False
            changed = known is not None and bool(known.content_hash)  # else: its first page
            run.counters["changed" if changed else "new"] += 1
            revisit = _visit(runtime, entry, known, result, changed=True, digest=digest)
        # A scheduled job keeps every version: one folder per cycle.
        version = f"cycle-{runtime.cycle}/" if runtime.cycle else ""
        save_path = f"jobs/{job_id}/{version}{page_location(entry.url)}"
        env.storage.write_bytes(save_path, result.body)
        run.counters["stored"] += 1
        run.counters["bytes"] += len(result.body)
        run.pages.append(
            {
                "url": entry.url,
                "final_url": result.final_url,
                "save_path": save_path,
                "content_type": result.content_type,
                "depth": entry.depth,
                "analyzer": rule.analyzer,
                "fields": {n: r.to_dict() for n, r in rule.fields.items()} if rule.fields else None,
                "fetched_at": datetime.now(UTC).isoformat(timespec="seconds"),
                **({"history": revisit.encode()} if revisit is not None else {}),
            }
        )
        return False
    if runtime.cycle and result.status not in RETRYABLE_STATUSES:
        _remember(runtime, entry, run, result)  # a redirect or a final error: asked again when due
    if result.status in _REDIRECTS and "location" in result.headers:
        if entry.redirects_left <= 0:
            return _final_failure(run, "too_many_redirects", entry.url)
        target = _join(result.final_url, result.headers["location"])  # admission filters a malformed one
        run.counters["redirects"] += 1
        run.redirects.append({"url": entry.url, "target": target, "depth": entry.depth,
                              "redirects_left": entry.redirects_left - 1})  # fmt: skip
        return False
    if result.status in RETRYABLE_STATUSES:
        retry_after = parse_retry_after(result.headers.get("retry-after"))
        return _retry_or_fail(env, runtime, entry, run, f"http_{result.status}", retry_after)
    return _final_failure(run, f"http_{result.status}", entry.url)


# Signals that the host itself is down or overloaded: the whole host waits.
_HOST_TROUBLE = frozenset({"http_429", "http_503", "connection_error", "timeout", "total_timeout"})


def _retry_or_fail(
    env: CrawlEnv, runtime: JobRuntime, entry: Entry, run: _BatchRun, reason: str, retry_after_s: float | None
) -> bool:
    """Requeue the URL for another attempt, or count it failed when its retries are spent.

    A host that is down or overloaded (or sent Retry-After) pauses as a whole, with backoff;
    a single URL's error (a 500 on one page) only sends that URL to the back of its host's
    queue, so the host's other pages go on.
    """
    delay_s = runtime.retry.delay_for(entry.attempt + 1, retry_after_s)
    # politeness.retry_after "url": a Retry-After makes only this URL wait (a site throttling one
    # resource); the host goes on. Without Retry-After, a 429/503 still means the host is in trouble.
    url_only = retry_after_s is not None and runtime.spec.politeness.retry_after == "url"
    host_wide = not url_only and (
        retry_after_s is not None or reason in _HOST_TROUBLE or _pool_exhausted(env, runtime, reason)
    )
    if delay_s is None:
        _final_failure(run, reason, entry.url)
        _remember(runtime, entry, run)
        # A host that asked for a long wait gets it, even though this URL gives up.
        if retry_after_s is not None and not url_only:
            run.host_delay_until = max(run.host_delay_until, env.clock() + min(retry_after_s, 3600.0))
            return True
        return False
    run.counters["retries"] += 1
    retry = Entry(entry.url, entry.depth, entry.attempt + 1, entry.redirects_left)
    if url_only:
        run.requeue_back.append(replace(retry, not_before_s=env.clock() + delay_s))
        return False
    if not host_wide:
        run.requeue_back.append(retry)
        return False
    run.requeue.append(retry)
    run.host_delay_until = max(run.host_delay_until, env.clock() + delay_s)
    return True  # the host is struggling: the rest of the batch waits with it


def _fetch_static(env: CrawlEnv, runtime: JobRuntime, request: FetchRequest, run: _BatchRun) -> FetchResult:
    """A static fetch. Through a proxy, its outcome is counted for the proxy (job stats) and goes
    on the cluster's proxy bench, and a proxy's fault (a 407, ...) is raised as FetchFailed."""
    if request.proxy is None:
        return runtime.fetcher.fetch(request)
    try:
        result = fetch_through(runtime.fetcher, request, env.proxies)
    except (FetchFailed, DownloadFailed) as exc:
        run.counters[proxy_counter(request.proxy, exc.reason)] += 1
        raise
    run.counters[proxy_counter(request.proxy, None)] += 1
    return result


def _pool_exhausted(env: CrawlEnv, runtime: JobRuntime, reason: str) -> bool:
    """A proxy's fault pauses the host only when no proxy of the pool is left to retry through:
    with one left, the URL goes to the back of its host's queue and its retry draws that one."""
    if not is_proxy_fault(reason):
        return False
    return env.proxies is None or not env.proxies.has_healthy(runtime.identities.proxies)


def _visit(
    runtime: JobRuntime,
    entry: Entry,
    known: UrlHistory | None,
    result: FetchResult | None,
    *,
    changed: bool,
    digest: str | None = None,
) -> UrlHistory:
    """The URL's history after this visit: a new interval, and the validators of a response."""
    previous = known if known is not None and known.fetched else None
    etag, modified = (previous.etag, previous.last_modified_s) if previous else ("", 0)
    if result is not None and result.status == 200:  # a new representation: its validators only
        etag, modified = result.headers.get("etag", ""), parse_http_date(result.headers.get("last-modified"))
    elif result is not None and result.status == 304:  # RFC 9110 §15.4.5: may refresh the validators
        etag = result.headers.get("etag") or etag
        modified = parse_http_date(result.headers.get("last-modified")) or modified
    return UrlHistory(
        depth=entry.depth,
        fetched_cycle_s=runtime.cycle_started_s,
        interval_s=next_interval(previous.interval_s if previous else None, changed, runtime.spec.revisit),
        etag=etag,
        last_modified_s=modified,
        content_hash=digest if digest is not None else (previous.content_hash if previous else ""),
    )


def _remember(runtime: JobRuntime, entry: Entry, run: _BatchRun, result: FetchResult | None = None) -> None:
    """Scheduled jobs: note a visit that found nothing new (written when the batch ends)."""
    if runtime.cycle:
        run.revisited[entry.url] = _visit(runtime, entry, run.known.get(entry.url), result, changed=False)


def _final_failure(run: _BatchRun, reason: str, url: str) -> bool:
    run.counters[f"failed:{reason}"] += 1
    run.failures.append((url, reason))
    run.done += 1
    return False


def _fetch_robots(env: CrawlEnv, runtime: JobRuntime, url: str, run: _BatchRun) -> RobotsRules | None:
    """Fetch robots.txt of the URL's origin (RFC 9309: 5 redirects, 500 KiB) and cache it.

    Redirects are followed here, hop by hop, and every hop obeys the network policy. Returns
    None (nothing cached) when the policy refuses the origin's own address. A redirect to a
    refused address leaves robots.txt unavailable (RFC 9309 §2.3.1.3: allow all), like a
    malformed one.
    """
    run.last_start = env.clock()
    target, status, body = robots_url(url), None, None
    try:
        for hop in range(_ROBOTS_REDIRECTS + 1):
            request = FetchRequest(
                url=target, user_agent=runtime.identities.user_agent(), networks=runtime.networks or None
            )
            try:
                result = runtime.robots_fetcher.fetch(request)
            except DownloadFailed as exc:
                if exc.reason != "blocked_address":
                    raise
                if hop == 0:
                    logger.info("job %s: %s refused by the network policy", runtime.job_id, origin(url))
                    return None
                logger.debug("robots.txt of %s redirects to a refused address (%s)", origin(url), target)
                status, body = 404, None
                break
            status, body = result.status, result.body
            if result.status not in _REDIRECTS or "location" not in result.headers:
                break
            target = _join(result.final_url, result.headers["location"])
            try:
                if urlsplit(target).scheme not in ("http", "https"):
                    break
            except ValueError:  # a malformed Location: robots.txt as if unavailable
                status, body = 404, None
                break
    except (DownloadFailed, FetchFailed):
        status, body = None, None
    rules = RobotsRules.from_response(status, body)
    env.robots.put(origin(url), rules)
    run.counters["robots_fetched"] += 1
    if rules.kind == "disallow_all":  # unreachable or 5xx: the host's URLs wait (RFC 9309)
        _alert(
            env,
            f"{runtime.job_id}:robots:{origin(url)}",
            Alert(
                subject=f"robots.txt of {origin(url)} unreachable in job {runtime.job_id}",
                text=f"{robots_url(url)} answered {status if status is not None else 'nothing'}: the host's URLs "
                f"wait and robots.txt is read again every {env.robots_retry_s:g} s.",
                details={"job": runtime.job_id, "origin": origin(url), "status": status},
            ),
        )
    logger.debug("robots.txt of %s: %s (status %s)", origin(url), rules.kind, status)
    return rules


def _join(base: str, location: str) -> str:
    """The redirect target; a Location urljoin cannot parse is kept as is, for admission to refuse."""
    try:
        return urljoin(base, location.strip())
    except ValueError:
        return location.strip()


def run_analyze_batch(env: CrawlEnv, fetched: dict[str, Any]) -> dict[str, Any]:
    """Extract links and records from a fetch batch's pages and admit the links in one call."""
    job_id = fetched["job"]
    runtime = env.runtimes.get(job_id, fetched.get("cycle", 0))
    counters: Counter[str] = Counter()
    links: list[tuple[str, int, int]] = []
    max_redirects = runtime.limits.max_redirects
    failed_pages: set[str] = set()
    for page in fetched["pages"]:
        found, analysed = _analyze_page(env, runtime, page, counters)
        links.extend((url, page["depth"] + 1, max_redirects) for url in found)
        if not analysed:
            failed_pages.add(page["url"])
    for redirect in fetched["redirects"]:
        links.append((redirect["target"], redirect["depth"], redirect["redirects_left"]))
    done = len(fetched["pages"]) + len(fetched["redirects"])
    admission = admit_links(
        runtime,
        env.frontier,
        links,
        done=done,
        token=f"a:{fetched['batch']}",
        counters=counters,
        history=_page_history(fetched["pages"], failed_pages),
        analysed_batch=str(fetched["batch"]),
    )
    return {"job": job_id, "batch": fetched["batch"], "admitted": admission.admitted,
            "completed": admission.completed}  # fmt: skip


def _analyze_page(
    env: CrawlEnv, runtime: JobRuntime, page: dict[str, Any], counters: Counter[str]
) -> tuple[list[str], bool]:
    """Run the page's analyzer (if its rule names one); return the links to follow and whether
    the page was analysed without failure."""
    try:
        body = env.storage.read_bytes(page["save_path"])
    except MissingPage:
        counters["analysis_failed:missing_page"] += 1
        return [], False
    counters["analysed"] += 1
    parsed = Page(url=page["final_url"], body=body, content_type=page["content_type"])
    found: list[str] = []
    if _is_html(page["content_type"]):
        found, skipped = followed_links(parsed)
        for reason, count in skipped.items():  # javascript:, mailto:, empty ... : counted as filtered
            counters[f"filtered:{reason}"] += count
    else:
        counters["not_html"] += 1
    if page["analyzer"] is not None:
        rules = {n: FieldRule.from_value(n, r) for n, r in page["fields"].items()} if page["fields"] else None
        try:
            result = run_analysis(parsed, page["analyzer"], rules)
            assert env.records is not None, "a crawl environment that runs analyzers has record writers"
            env.records(runtime.job_id).append(
                {
                    "url": page["url"],
                    "final_url": page["final_url"],
                    "fetched_at": page["fetched_at"],
                    "job": runtime.job_id,
                    "analyzer": page["analyzer"],
                    "data": result,
                }
            )
            counters["records"] += 1
        except VcrawlError as exc:
            counters[f"analysis_failed:{exc.reason}"] += 1
            _alert_analysis(env, runtime, page, exc)
            return found, False
        except Exception as exc:  # an analyzer plugin's bug must not stop the crawl
            counters["analysis_failed:error"] += 1
            _alert_analysis(env, runtime, page, exc)
            return found, False
    return found, True


def _alert_analysis(env: CrawlEnv, runtime: JobRuntime, page: dict[str, Any], exc: Exception) -> None:
    logger.warning("analysis of %s with %s failed: %r", page["url"], page["analyzer"], exc)
    _alert(
        env,
        f"{runtime.job_id}:{page['analyzer']}",
        Alert(
            subject=f"analyzer {page['analyzer']} failing in job {runtime.job_id}",
            text=f"Analyzer {page['analyzer']} failed on {page['url']}: {type(exc).__name__}: {exc}. "
            "Later failures of this analyzer in this job are counted; alerted again after the alert window.",
            details={"job": runtime.job_id, "url": page["url"], "analyzer": page["analyzer"], "error": str(exc)},
        ),
    )


def _is_html(content_type: str | None) -> bool:
    if content_type is None:
        return True  # no header: sniffing would be guessing; lxml copes with anything
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind in ("text/html", "application/xhtml+xml", "text/plain", "") or kind.endswith("+xml")


def abandon_analysis(env: CrawlEnv, fetched: dict[str, Any], error: str) -> None:
    """Finish a batch whose analysis failed for good: count it and release its pages' pending."""
    runtime = env.runtimes.get(fetched["job"], fetched.get("cycle", 0))
    done = len(fetched["pages"]) + len(fetched["redirects"])
    counters: Counter[str] = Counter({"analysis_failed:batch": len(fetched["pages"])})
    logger.error("analysis of batch %s of job %s failed for good: %s", fetched["batch"], fetched["job"], error)
    # The same token as the analysis: if it did admit before failing, this changes nothing.
    history = _page_history(fetched["pages"], {page.get("url", "") for page in fetched["pages"]})
    admit_links(runtime, env.frontier, [], done=done, token=f"a:{fetched['batch']}", counters=counters,
                history=history, analysed_batch=str(fetched["batch"]))  # fmt: skip


def _page_history(pages: list[dict[str, Any]], not_analysed: set[str]) -> dict[str, UrlHistory]:
    """Scheduled jobs: the pages' new history records. A page that was not analysed keeps no
    content hash or validators, so the next cycle fetches it in full and analyses it."""
    records = {page["url"]: UrlHistory.decode(page["history"]) for page in pages if page.get("history")}
    return {
        url: replace(record, etag="", last_modified_s=0, content_hash="") if url in not_analysed else record
        for url, record in records.items()
    }
