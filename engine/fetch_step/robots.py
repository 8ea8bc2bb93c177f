"""The fetch step's first phase: robots.txt read when its origin's rules are not cached (RFC 9309),
and what they say of the URL: go on, wait for robots.txt, or refuse it."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass

from engine.fetch_step.context import FetchContext, FetchItem
from engine.fetch_step.request import metered
from engine.fetch_step.response import retry_or_fail
from engine.fetch_step.visits import failed, next_attempt, visit_of
from engine.outcomes import FetchOutcome, Retry, RobotsBlocked, RobotsFetched, Visit
from fetchers import FetchRequest
from frontier import RobotsResponse, RobotsRules, origin, read_robots, robots_url
from telemetry.alerts import Alert
from vcrawl import names
from vcrawl.errors import FetchFailed

__all__ = ["Cleared", "check_robots", "read_robots_rules"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cleared:
    """robots.txt lets the URL through, or is not obeyed: what the fetch goes on with."""

    rules: RobotsRules | None = None  # None: robots.txt not obeyed
    fetched_now: bool = False  # robots.txt was read for this URL (a request to its host)
    crawl_delay_s: float | None = None


def check_robots(ctx: FetchContext, item: FetchItem, counts: Counter[str]) -> Cleared | FetchOutcome:
    """Read robots.txt if needed and judge the URL by it: ``Cleared`` to go on, else the URL's outcome."""
    policy, entry = ctx.policy, item.entry
    if not policy.obey_robots:
        return Cleared()
    rules = ctx.services.robots.get(origin(entry.url))
    fetched_now = rules is None
    if rules is None:
        try:
            rules = _read_robots(ctx, entry.url, counts, unresolved_fails=True)
        except FetchFailed as exc:  # its host name does not resolve: the URL is retried, then fails, as its fetch
            return retry_or_fail(ctx, item, exc.reason, None, None, counts, None)
    if rules is None:  # the network policy refuses the host itself: its URLs cannot be fetched either
        return failed(ctx, item, "blocked_address", None, "", counts, requested=False)
    crawl_delay_s = rules.crawl_delay(policy.robots_token)
    visit = Visit(requested=fetched_now, crawl_delay_s=crawl_delay_s, counts=counts)
    if rules.kind == "disallow_all" and entry.attempt < policy.retry.retries:
        # RFC 9309: unreachable robots.txt means "disallow all" until it can be read. Wait
        # for the next read (the error stays cached that long), then try again.
        return Retry(next_attempt(entry), "robots_unavailable", policy.robots_retry_s, "host", visit=visit)
    if fetched_now and (policy.pace_after_robots or crawl_delay_s):
        return RobotsFetched(entry, visit)  # the robots.txt request used this politeness slot
    if not rules.can_fetch(entry.url, policy.robots_token):
        counts[names.COUNTER_ROBOTS_BLOCKED] += 1
        return RobotsBlocked(entry, visit_of(ctx, item, counts, fetched_now, crawl_delay_s))
    return Cleared(rules, fetched_now, crawl_delay_s)


def read_robots_rules(ctx: FetchContext, url: str) -> RobotsRules | None:
    """Read and cache robots.txt of ``url``'s origin now; None when the network policy refuses the origin."""
    return _read_robots(ctx, url, Counter())


def _read_robots(
    ctx: FetchContext, url: str, counts: Counter[str], unresolved_fails: bool = False
) -> RobotsRules | None:
    """Read and cache robots.txt of the URL's origin; alert when it is unreachable (its URLs wait).

    Raises:
        FetchFailed: with ``unresolved_fails``, the origin's name did not resolve (``dns_error``);
            otherwise that counts as unreachable.
    """
    services, policy = ctx.services, ctx.policy

    def get(target: str) -> RobotsResponse:
        request = FetchRequest(
            url=target, user_agent=services.identities.user_agent(), networks=policy.networks or None
        )
        started, result = time.monotonic(), None
        try:
            result = services.robots_fetcher.fetch(request)
        finally:
            metered(services.meter, target, result, time.monotonic() - started)
        return RobotsResponse(result.status, result.final_url, result.headers, result.body)

    try:
        rules, status = read_robots(url, get)
    except FetchFailed:
        if unresolved_fails:
            raise
        rules, status = RobotsRules.from_response(None, None), None
    if rules is None:
        logger.info("job %s: %s refused by the network policy", ctx.job_id or "-", origin(url))
        return None
    services.robots.put(origin(url), rules)
    counts[names.COUNTER_ROBOTS_FETCHED] += 1
    if rules.kind == "disallow_all":  # unreachable or 5xx: the host's URLs wait (RFC 9309)
        logger.warning("job %s: robots.txt of %s unreachable (status %s): its URLs wait, asked again in %g s",
                       ctx.job_id or "-", origin(url), status, policy.robots_retry_s)  # fmt: skip
        _alert_unreachable(ctx, url, status)
    logger.debug("robots.txt of %s: %s (status %s)", origin(url), rules.kind, status)
    return rules


def _alert_unreachable(ctx: FetchContext, url: str, status: int | None) -> None:
    """Tell an operator (once per alert window) that an origin's URLs wait for its robots.txt."""
    if ctx.services.alert is None:
        return
    job_id = ctx.job_id
    where = f"job {job_id}" if job_id else "single tasks"
    ctx.services.alert(
        f"{job_id or 'single'}:robots:{origin(url)}",
        Alert(
            subject=f"robots.txt of {origin(url)} unreachable in {where}",
            text=f"{robots_url(url)} answered {status if status is not None else 'nothing'}: the host's URLs "
            f"wait and robots.txt is read again every {ctx.policy.robots_retry_s:g} s.",
            details={"job": job_id or None, "origin": origin(url), "status": status},
        ),
    )
