"""A proxy harvest: read the operator's proxy sources, check every candidate, keep the fastest.

One run (``harvest``), fired by beat every ``VCRAWL_PROXY_HARVEST_EVERY_S``:

1. takes a lock in Redis, so two firings never harvest at once (a second one is skipped);
2. asks the check URL directly for the crawler's own address (it fails: the run stops, the pool
   stays as it was);
3. fetches each proxy source with the static fetcher (its network guard, timeouts and body cap)
   and reads its candidates (``fetchers.proxy_lists``); a source that fails, or whose page cannot
   be parsed (``unreadable``), is logged and skipped;
4. checks the proxies already in the pool again, then the new candidates (at most
   ``VCRAWL_PROXY_CANDIDATES_MAX`` in all), ``VCRAWL_PROXY_CHECK_CONCURRENCY`` at a time
   (``fetchers.proxy_check``); checks not started within the run's budget are cancelled (the
   running ones end within their timeout): a pool member not checked keeps its place; a check
   that fails unexpectedly rejects its candidate only (``check_error``);
5. writes the pool: the fastest ``VCRAWL_PROXY_POOL_MAX`` that passed; the ones that failed are
   dropped, with their bench records (``fetchers.proxies``) unless they are ``VCRAWL_PROXIES``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from fetchers.base import Fetcher, FetchRequest, check_status
from fetchers.limits import cluster_limits, fetch_limits
from fetchers.netguard import NetworkPolicy
from fetchers.proxy_check import CheckUnusable, ProxyCheck, Verdict, check_proxy, own_addresses
from fetchers.proxy_lists import read_source
from fetchers.proxy_pool import HarvestedProxy, read_pool, write_pool
from fetchers.static import StaticFetcher, make_session
from vcrawl import redis_keys
from vcrawl.errors import DownloadFailed, FetchFailed
from vcrawl.proxy_sources import ProxySource
from vcrawl.settings import Settings

__all__ = ["CHECK_BODY_BYTES", "HarvestConfig", "HarvestReport", "harvest", "harvest_with_settings"]

logger = logging.getLogger(__name__)

CHECK_BODY_BYTES = 64 * 1024
"""A check answer is a small JSON object: a proxy sending more is not answering the check."""


@dataclass(frozen=True)
class HarvestConfig:
    """What a harvest reads and how it checks (the operator's settings)."""

    sources: tuple[ProxySource, ...]
    check: ProxyCheck
    pool_max: int = 50
    concurrency: int = 16
    candidates_max: int = 1000
    budget_s: float = 900.0  # a run stops checking after this long (its lock lasts a minute more)
    configured: tuple[str, ...] = ()  # VCRAWL_PROXIES: drawn whether harvested or not, so their bench records stay

    @classmethod
    def from_settings(cls, settings: Settings) -> HarvestConfig:
        """The harvest of ``VCRAWL_PROXY_SOURCES`` and the other ``VCRAWL_PROXY_*`` settings."""
        assert settings.proxy_check_url is not None or not settings.proxy_sources  # checked by Settings
        return cls(
            sources=settings.proxy_sources,
            check=ProxyCheck(settings.proxy_check_url or "", settings.proxy_max_latency_s, settings.user_agents[0]),
            pool_max=settings.proxy_pool_max,
            concurrency=settings.proxy_check_concurrency,
            candidates_max=settings.proxy_candidates_max,
            budget_s=settings.proxy_harvest_every_s,
            configured=settings.proxies,
        )


@dataclass(frozen=True)
class HarvestReport:
    """What one run did."""

    status: str  # "done", "skipped" (another run holds the lock), "no_sources", "check_unusable"
    sources: Mapping[str, int | str] = field(default_factory=dict)  # URL -> candidates read, or why it failed
    checked: int = 0
    rejected: Mapping[str, int] = field(default_factory=dict)  # reason -> candidates
    joined: tuple[str, ...] = ()  # new in the pool
    dropped: tuple[str, ...] = ()  # were in the pool, are not now
    pool: tuple[str, ...] = ()  # the pool after the run, fastest first
    problem: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (a task's result, the CLI's output)."""
        return {
            "status": self.status,
            "sources": dict(self.sources),
            "checked": self.checked,
            "rejected": dict(self.rejected),
            "joined": list(self.joined),
            "dropped": list(self.dropped),
            "pool": list(self.pool),
            "problem": self.problem,
        }


def harvest_with_settings(settings: Settings, client: Any) -> HarvestReport:
    """Run one harvest of the cluster's proxy sources, with its own connections (closed after).

    Sources are fetched like pages (the cluster's network policy, timeouts and body cap, redirects
    followed); checks give up at ``VCRAWL_PROXY_MAX_LATENCY_S`` and follow no redirect. Harvested
    proxies are not the cluster's trusted ``VCRAWL_PROXIES``: one at a non-public address must lie in
    ``VCRAWL_ALLOWED_NETWORKS``, as a job's proxy must.
    """
    config = HarvestConfig.from_settings(settings)
    if not config.sources:
        return HarvestReport("no_sources")
    policy = NetworkPolicy.from_settings(settings)
    source_limits = fetch_limits(cluster_limits(settings))  # a source is fetched like a page of a job
    latency_s = settings.proxy_max_latency_s
    # A check is cut at the latency bound, reads a small answer, and follows no redirect: a proxy
    # that redirects is not passing the check URL's answer on. The slow-body rule stays the cluster's.
    check_limits = replace(
        source_limits,
        connect_timeout_s=min(settings.connect_timeout_s, latency_s),
        read_timeout_s=latency_s,
        total_timeout_s=latency_s,
        max_body_bytes=CHECK_BODY_BYTES,
        max_redirects=0,
        follow_redirects=False,
    )
    session = make_session(pool_size=config.concurrency)
    try:
        return harvest(
            config,
            StaticFetcher(session, source_limits, policy=policy),
            StaticFetcher(session, check_limits, policy=policy),
            client,
        )
    finally:
        session.close()  # one proxy manager per candidate: not kept in a worker's shared session


def harvest(
    config: HarvestConfig,
    source_fetcher: Fetcher,
    check_fetcher: Fetcher,
    client: Any,
    clock: Callable[[], float] = time.time,
) -> HarvestReport:
    """Run one harvest (see the module's docstring); ``check_fetcher`` gives up at the latency bound."""
    if not config.sources:
        return HarvestReport("no_sources")
    lock = client.lock(redis_keys.proxy_harvest_lock(), timeout=config.budget_s + 60, blocking=False)
    if not lock.acquire():
        logger.info("proxy harvest skipped: another run holds the lock")
        return HarvestReport("skipped")
    try:
        return _harvest(config, source_fetcher, check_fetcher, client, clock)
    finally:
        try:
            lock.release()
        except redis.exceptions.LockError:  # it ran out: a later run may hold it now
            logger.warning("proxy harvest outlasted its lock (%.0f s)", config.budget_s + 60)


def _harvest(
    config: HarvestConfig, source_fetcher: Fetcher, check_fetcher: Fetcher, client: Any, clock: Callable[[], float]
) -> HarvestReport:
    started = time.monotonic()
    try:
        own = own_addresses(check_fetcher, config.check)
    except CheckUnusable as exc:
        logger.warning("proxy harvest stopped, the pool is left as it is: %s", exc)
        return HarvestReport("check_unusable", problem=str(exc))
    listed, read = _read_sources(config, source_fetcher)
    old = {entry.proxy: entry for entry in read_pool(client)}
    candidates = list(dict.fromkeys([*old, *listed]))[: config.candidates_max]  # the pool's first: re-checked
    verdicts = _check_all(config, check_fetcher, candidates, own, started + config.budget_s)
    now = clock()
    passed = [
        HarvestedProxy(v.proxy, v.latency_s or 0.0, v.anonymity, listed.get(v.proxy) or _source(old, v.proxy), now)
        for v in verdicts.values()
        if v.passed
    ]
    # Pool members not checked (no time left, or beyond candidates_max) keep their place and last check.
    passed += [entry for proxy, entry in old.items() if proxy not in verdicts]
    pool = sorted(passed, key=lambda entry: entry.latency_s)[: config.pool_max]
    kept = tuple(entry.proxy for entry in pool)
    dropped = tuple(proxy for proxy in old if proxy not in kept)
    write_pool(client, pool, forget=[proxy for proxy in dropped if proxy not in config.configured])
    rejected = Counter(v.reason for v in verdicts.values() if v.reason is not None)
    report = HarvestReport(
        "done",
        sources=read,
        checked=len(verdicts),
        rejected=dict(rejected),
        joined=tuple(proxy for proxy in kept if proxy not in old),
        dropped=dropped,
        pool=kept,
    )
    logger.info("proxy harvest: %d checked, %d in the pool (%d joined, %d dropped), rejected %s",
                report.checked, len(kept), len(report.joined), len(report.dropped), dict(rejected))  # fmt: skip
    return report


def _source(old: Mapping[str, HarvestedProxy], proxy: str) -> str:
    entry = old.get(proxy)
    return entry.source if entry is not None else ""


def _read_sources(config: HarvestConfig, fetcher: Fetcher) -> tuple[dict[str, str], dict[str, int | str]]:
    """(candidate -> the first source listing it, source URL -> candidates read or why it failed)."""
    listed: dict[str, str] = {}
    read: dict[str, int | str] = {}
    for source in config.sources:
        try:
            result = fetcher.fetch(FetchRequest(url=source.url, user_agent=config.check.user_agent))
            check_status(result)
        except (FetchFailed, DownloadFailed) as exc:
            logger.warning("proxy source %s not read: %s", source.url, exc.reason)
            read[source.url] = exc.reason
            continue
        try:
            found = read_source(source, result.body)
        except Exception as exc:  # a page read_source trips on (a bug) fails its source, not the run
            logger.warning("proxy source %s not read: its page could not be parsed: %r", source.url, exc, exc_info=exc)
            read[source.url] = "unreadable"
            continue
        read[source.url] = len(found)
        for proxy in found:
            listed.setdefault(proxy, source.url)
    return listed, read


def _check_all(
    config: HarvestConfig, fetcher: Fetcher, candidates: Sequence[str], own: frozenset[str], deadline: float
) -> dict[str, Verdict]:
    """Check ``candidates`` (at most ``candidates_max``: the caller cuts them), ``config.concurrency``
    at a time, starting checks until ``deadline`` (time.monotonic).

    At the deadline the checks not started are cancelled and the running ones are waited for: each
    gives up at the check fetcher's timeout (the latency bound), so a run's checks take at most the
    budget plus one check's timeout. A check that finishes meanwhile keeps its verdict.
    """
    verdicts: dict[str, Verdict] = {}
    errors: list[Exception] = []
    pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="proxy-check")
    try:
        futures = {pool.submit(check_proxy, fetcher, config.check, proxy, own): proxy for proxy in candidates}
        _, not_done = wait(futures, timeout=max(0.0, deadline - time.monotonic()))
        if not_done:
            logger.warning("proxy harvest: budget of %.0f s spent; %d checks not done (the running ones may "
                           "finish, the others are cancelled)", config.budget_s, len(not_done))  # fmt: skip
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    for future, proxy in futures.items():
        if future.cancelled():
            continue
        try:
            verdicts[proxy] = future.result()
        except Exception as exc:  # a bug or an unwrapped error in one check fails that candidate, not the run
            logger.debug("proxy check of %s failed unexpectedly: %r", proxy, exc)
            errors.append(exc)
            verdicts[proxy] = Verdict(proxy, "check_error")
    if errors:  # once per run: a broken check would otherwise log once per candidate
        logger.warning("proxy harvest: %d checks failed unexpectedly, their candidates rejected (check_error); "
                       "the first: %r", len(errors), errors[0], exc_info=errors[0])  # fmt: skip
    return verdicts
