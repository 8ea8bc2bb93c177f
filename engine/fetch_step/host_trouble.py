"""How a fetch's trouble is judged against its host: the host down, throttling, or too slow.

The fetch step (``engine.fetch_step.response``) asks these when a request fails: whether the whole
host should pause or only the URL should wait (``politeness.retry_after``, the failure budget of
slow hosts), and whether a proxy's fault leaves any proxy to retry through. A single task has no
record of its host (no ``JobHooks``): its URL waits alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.fetch_step.context import FetchContext
from engine.outcomes import FetchOutcome, Retry
from fetchers import is_proxy_fault
from fetchers.base import SLOW_REASONS
from frontier import Entry, host_key
from telemetry.alerts import Alert
from vcrawl import names

__all__ = [
    "HOST_TROUBLE",
    "SLOW_HOST_BUDGET",
    "SLOW_REASONS",
    "THROTTLED",
    "THROTTLE_STREAK",
    "keeps_timing_out",
    "pool_exhausted",
    "throttle_tail",
    "throttles",
]

# Signals that the host itself is down or overloaded, or that its name does not resolve (every URL of
# it would fail alike): the whole host waits.
HOST_TROUBLE = frozenset({"http_429", "http_503", names.REASON_DNS_ERROR, "connection_error", "connect_timeout"})
# SLOW_REASONS (fetchers.base) are a URL's own time trouble (a tarpit, a huge slow page): it waits
# behind its host's other URLs, unless most of the host's requests end this way (the host's failure
# budget, SLOW_HOST_BUDGET).
# politeness.retry_after "auto" (the default): a 429/503 with Retry-After holds the whole host for
# it (``response.origin_hold_s``); one without makes only its URL wait, unless the host answered the
# first requests of THROTTLE_STREAK URLs in a row with one: then it is throttling the crawl and
# pauses as a whole.
THROTTLED = frozenset({"http_429", "http_503"})
THROTTLE_STREAK = 3
SLOW_HOST_BUDGET = 5
"""Requests of a host given up for time, at least as many as its responses, after which its
timeouts pause the whole host (with backoff) and an operator is alerted."""


def throttles(ctx: FetchContext, entry: Entry) -> bool:
    """True when this 429/503 to a URL's first request makes ``THROTTLE_STREAK`` of the host's
    answers to first requests in a row (``throttle_tail``)."""
    if ctx.job is None or entry.attempt > 0:
        return False
    return ctx.job.host_throttle(host_key(entry.url)) + 1 >= THROTTLE_STREAK


def keeps_timing_out(ctx: FetchContext, url: str, reason: str) -> bool:
    """True when the host spent its failure budget: at least ``SLOW_HOST_BUDGET`` requests given up
    for time, as many as it answered. Alerts once per alert window when it is."""
    if ctx.job is None:
        return False
    host = host_key(url)
    slow, answered = ctx.job.host_slowness(host)
    slow += 1  # this one is counted with the batch's release
    if slow < SLOW_HOST_BUDGET or slow < answered:
        return False
    if ctx.services.alert is not None:
        ctx.services.alert(
            f"{ctx.job_id}:slow:{host}",
            Alert(
                subject=f"host {host} keeps timing out in job {ctx.job_id}",
                text=f"{slow} requests to {host} were given up for time ({reason} the last), against {answered} "
                "answered: the host is paused with backoff after each of them.",
                details={"job": ctx.job_id, "host": host, "slow": slow, "answered": answered, "example": url},
            ),
        )
    return True


def pool_exhausted(ctx: FetchContext, reason: str) -> bool:
    """A proxy's fault pauses the host only when no proxy of the pool is left to retry through:
    with one left, the URL goes to the back of its host's queue and its retry draws that one."""
    if not is_proxy_fault(reason):
        return False
    services = ctx.services
    return services.proxies is None or not services.proxies.has_healthy(
        services.identities.proxies, harvested=services.identities.harvested
    )


def throttle_tail(outcomes: Sequence[FetchOutcome]) -> tuple[bool, int]:
    """(whether some response was not a 429/503, how many first requests of a URL were answered
    429/503 after the last one that was). A retry's 429/503 says nothing new about the host: a
    host whose only URLs left are a few throttled ones is not throttling the crawl."""
    answered, tail = False, 0
    for outcome in outcomes:
        statuses = [name for name in outcome.visit.counts if name.startswith(names.PREFIX_STATUS)]
        for name in statuses:
            if name not in _THROTTLE_STATUSES:
                answered, tail = True, 0
            elif _first_request(outcome):
                tail += outcome.visit.counts[name]
    return answered, tail


def _first_request(outcome: FetchOutcome) -> bool:
    """True if the outcome is of a URL's first request (a Retry carries the next attempt)."""
    return outcome.entry.attempt == (1 if isinstance(outcome, Retry) else 0)


_THROTTLE_STATUSES = frozenset(f"{names.PREFIX_STATUS}{status}" for status in (429, 503))
