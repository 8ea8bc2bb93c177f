"""The response sorted into an outcome: stored, unchanged, redirected, retried or failed.

A retry says how far its trouble reaches: the whole host (down, throttling, Retry-After, out of
proxies), the URL behind its host's others (its own 5xx), or only the URL until a time (a 429/503
while the host answers the rest, a slow URL) (``host_trouble``).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace

import ada_url

from engine.fetch_step.context import FetchContext, FetchItem, FetchPolicy
from engine.fetch_step.host_trouble import (
    HOST_TROUBLE,
    SLOW_REASONS,
    THROTTLED,
    keeps_timing_out,
    pool_exhausted,
    throttles,
)
from engine.fetch_step.store import store_page
from engine.fetch_step.visits import failed, next_attempt, visit_of
from engine.outcomes import FetchOutcome, Redirected, Retry, Unchanged, Visit
from fetchers import RETRYABLE_STATUSES, FetchResult, parse_retry_after
from fetchers.base import NOT_RETRIED_REASONS
from vcrawl import names

__all__ = ["origin_hold_s", "retry_or_fail", "sort_response"]

logger = logging.getLogger(__name__)

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_LONGEST_HOST_WAIT_S = 3600.0


def sort_response(
    ctx: FetchContext, item: FetchItem, result: FetchResult, counts: Counter[str], crawl_delay_s: float | None
) -> FetchOutcome:
    """The outcome of a response (any status).

    Raises:
        StorageFailed: a 200 body could not be stored.
    """
    entry, known = item.entry, item.known
    if result.status == 304 and known is not None and known.fetched:
        counts[names.COUNTER_NOT_MODIFIED] += 1
        counts[names.COUNTER_UNCHANGED] += 1
        return Unchanged(entry, visit_of(ctx, item, counts, True, crawl_delay_s, result))
    if result.status == 200:
        return store_page(ctx, item, result, counts, crawl_delay_s)
    # A redirect or a final error of a scheduled job: asked again when due.
    remember = result if result.status not in RETRYABLE_STATUSES else None
    if result.status in _REDIRECTS and "location" in result.headers:
        if entry.redirects_left <= 0:
            return failed(ctx, item, "too_many_redirects", result.status, "", counts, crawl_delay_s=crawl_delay_s,
                          result=remember)  # fmt: skip
        counts[names.COUNTER_REDIRECTS] += 1
        target = _join(result.final_url, result.headers["location"])  # admission filters a malformed one
        return Redirected(entry, target, result.status, visit_of(ctx, item, counts, True, crawl_delay_s, remember))
    if result.status in RETRYABLE_STATUSES:
        retry_after = parse_retry_after(result.headers.get("retry-after"))
        return retry_or_fail(ctx, item, f"http_{result.status}", retry_after, result.status, counts, crawl_delay_s)
    return failed(ctx, item, f"http_{result.status}", result.status, "", counts, crawl_delay_s=crawl_delay_s,
                  result=remember)  # fmt: skip


def retry_or_fail(
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
    entry, policy = item.entry, ctx.policy
    # A tarpit trickling its head would hold a retry as long again: it fails at its first attempt.
    delay_s = None if reason in NOT_RETRIED_REASONS else policy.retry.delay_for(entry.attempt + 1, retry_after_s)
    slow_host = False
    if reason in SLOW_REASONS:
        counts[names.COUNTER_SLOW] += 1
        slow_host = keeps_timing_out(ctx, entry.url, reason)
    # politeness.retry_after "auto" (the default) and "host": a Retry-After holds the whole origin for
    # that long, at every worker at once (the visit's host_wait_s, announced by the batch): RFC 6585 §4
    # and RFC 9110 §10.2.3 say how long to wait before making a new request. "url": a Retry-After
    # makes only this URL wait (a site known to send it for one throttled resource). Without one, a
    # 429/503 under "auto" makes only its URL wait while the host's other requests are answered,
    # until a streak of them says the host is throttling the crawl; under "host" or "url" it pauses
    # the host. A slow URL waits its backoff behind the host's other URLs, which go on meanwhile.
    hold_s = origin_hold_s(policy, retry_after_s)
    unasked = reason in THROTTLED and policy.retry_after == "auto" and retry_after_s is None
    throttling = unasked and throttles(ctx, entry)
    url_only = (
        (retry_after_s is not None and policy.retry_after == "url")
        or (unasked and not throttling)
        or (reason in SLOW_REASONS and not slow_host)
    )
    if delay_s is None:
        return _give_up(ctx, item, reason, retry_after_s if not url_only else None, slow_host, http_status, counts,
                        crawl_delay_s, hold_s)  # fmt: skip
    counts[names.COUNTER_RETRIES] += 1
    visit = Visit(requested=True, crawl_delay_s=crawl_delay_s, counts=counts, host_wait_s=hold_s)
    retry = next_attempt(entry)
    if url_only:
        until = ctx.services.clock() + delay_s
        return Retry(replace(retry, not_before_s=until), reason, delay_s, "url", http_status, visit)
    host_wide = retry_after_s is not None or reason in HOST_TROUBLE or slow_host or pool_exhausted(ctx, reason)
    return Retry(retry, reason, delay_s, "host" if host_wide else "queue", http_status, visit)


def origin_hold_s(policy: FetchPolicy, retry_after_s: float | None) -> float:
    """How long a Retry-After holds its whole origin (0: not at all): what it asks, at most
    ``max_retry_after_s``, unless ``politeness.retry_after`` is ``url``.

    >>> origin_hold_s(FetchPolicy(), 3.0), origin_hold_s(FetchPolicy(retry_after="url"), 3.0)
    (3.0, 0.0)
    >>> origin_hold_s(FetchPolicy(), 7200.0)  # RetryPolicy's max_retry_after_s: 600 s
    600.0
    """
    if retry_after_s is None or policy.retry_after == "url":
        return 0.0
    return max(0.0, min(retry_after_s, policy.retry.max_retry_after_s))


def _give_up(
    ctx: FetchContext,
    item: FetchItem,
    reason: str,
    host_asked_s: float | None,
    slow_host: bool,
    http_status: int | None,
    counts: Counter[str],
    crawl_delay_s: float | None,
    hold_s: float = 0.0,
) -> FetchOutcome:
    """The URL's retries are spent: a final failure, with the wait its host still needs (``hold_s``:
    the origin's hold its Retry-After asked for, announced to every worker)."""
    entry, retry = item.entry, ctx.policy.retry
    # A host that asked for a long wait gets it, even though this URL gives up.
    host_wait_s = min(host_asked_s, _LONGEST_HOST_WAIT_S) if host_asked_s is not None else 0.0
    if slow_host:  # over its failure budget: the host is slowed even when the URL gives up
        host_wait_s = max(host_wait_s, min(retry.backoff_max_s, retry.backoff_s * 2**entry.attempt))
    gone = failed(ctx, item, reason, http_status, "", counts, crawl_delay_s=crawl_delay_s)
    if ctx.job_id:  # a job's URL spent its retries (refused, timeout, 5xx): worth a look, unlike a 404
        # (a single task's final failure is logged where its trail records it: engine.failures)
        logger.warning("job %s: %s failed for good after %d attempts: %s", ctx.job_id, entry.url,
                       entry.attempt + 1, reason)  # fmt: skip
    return replace(gone, host_wait_s=host_wait_s, gave_up=True, visit=replace(gone.visit, host_wait_s=hold_s))


def _join(base: str, location: str) -> str:
    """The redirect target, resolved as a browser resolves it; a Location that is no URL is kept as
    is, for admission to refuse."""
    try:
        return ada_url.join_url(base, location)
    except ValueError:
        return location.strip()
