"""The crawl pipeline's components in this process: the frontier, its origin holds, job runtimes, fetchers,
robots.txt, URL history, identities, the proxy bench, the host gate, the status trail, and the policies."""

from __future__ import annotations

from engine.node_meter import NodeMeter
from engine.runtime_cache import RuntimeCache
from engine.trail import StatusTrail
from fetchers import BrowserConfig, FetcherContext, FetcherRegistry, IdentityPool, NetworkPolicy, ProxyHealth
from fetchers.limits import cluster_limits, fetch_limits
from frontier import Frontier, History, HostGate, OriginHolds, RobotsCache
from tasks.deps.clients import dns_cache, frontier_client, once, redis_client, session, settings
from vcrawl.policies import PolitenessPolicy, RetryPolicy

__all__ = [
    "analysis_retry",
    "batch_analysis_retry",
    "fetch_retry",
    "fetchers",
    "frontier",
    "history",
    "host_gate",
    "identities",
    "node_meter",
    "origin_holds",
    "politeness",
    "proxy_health",
    "robots",
    "runtimes",
    "trail",
]


def fetchers() -> FetcherRegistry:
    """Return the page type -> fetcher registry: the ``vcrawl.fetchers`` entry points (built-ins and plug-ins).

    Raises:
        ConfigError: a page type's name is taken twice, or a plug-in fails to load.
    """

    def build() -> FetcherRegistry:
        current = settings()
        browser = BrowserConfig(
            chromium_path=current.chromium_path,
            chromedriver_path=current.chromedriver_path,
            page_timeout_s=current.browser_page_timeout_s,
            lazy_timeout_s=current.browser_lazy_timeout_s,
            max_pages=current.browser_max_pages,
            max_body_bytes=current.max_body_bytes,
        )
        context = FetcherContext(
            limits=fetch_limits(cluster_limits(current)),
            policy=NetworkPolicy.from_settings(current),  # public addresses, plus VCRAWL_ALLOWED_NETWORKS
            browser=browser,
            session=session,
            resolver=dns_cache(),
        )
        return FetcherRegistry.from_entry_points(context)

    return once("fetchers", build)


def node_meter() -> NodeMeter:
    """This process's wire counters: every fetch adds to them; its node's heartbeat writes them."""
    return once("node_meter", NodeMeter)


def frontier() -> Frontier:
    """Return the crawl frontier (per-host queues and their scripts)."""
    return once("frontier", lambda: Frontier(frontier_client(), stats_ttl_s=settings().stats_retention_s,
                                             day_stats_ttl_s=settings().stats_retention_days * 86400,
                                             replica_wait_ms=settings().redis_replica_wait_ms))  # fmt: skip


def origin_holds() -> OriginHolds:
    """Return this process's copy of the hosts held for a Retry-After, listening to every other process's."""
    return once("origin_holds", lambda: OriginHolds(frontier_client()).start())


def runtimes() -> RuntimeCache:
    """Return the per-job runtime cache."""
    # settings(), not its value: a live change of the cluster's settings rebuilds each job's runtime.
    return once("runtimes", lambda: RuntimeCache(frontier(), settings, session(), frontier_client()))


def politeness() -> PolitenessPolicy:
    """The cluster's per-host pause for single tasks (a job's own politeness applies to its hosts)."""
    current = settings()
    return PolitenessPolicy(current.min_interval_s, current.interval_jitter)


def history() -> History:
    """URL history of scheduled jobs."""
    return once("history", lambda: History(frontier_client()))


def robots() -> RobotsCache:
    """Return the robots.txt cache (Redis, with an in-process layer)."""
    current = settings()
    return once("robots", lambda: RobotsCache(frontier_client(), current.robots_ttl_s, current.robots_error_ttl_s))


def identities() -> IdentityPool:
    """Return the User-Agent / Referer / proxy pool."""
    current = settings()
    return once(
        "identities",
        lambda: IdentityPool(
            current.user_agents, current.referers, current.proxies, harvested=bool(current.proxy_sources)
        ),
    )


def proxy_health() -> ProxyHealth:
    """Return the cluster's proxy bench (cool-offs in Redis, cached here for a second)."""
    return once("proxy_health", lambda: ProxyHealth.from_settings(settings(), redis_client()))


def host_gate() -> HostGate:
    """Return the cluster-wide per-host politeness gate."""
    current = settings()
    return once("host_gate", lambda: HostGate(frontier_client(), politeness(), busy_s=current.total_timeout_s + 30))


def trail() -> StatusTrail:
    """Return the status trail store."""
    return once("trail", lambda: StatusTrail(redis_client(), settings().status_ttl_s))


def fetch_retry() -> RetryPolicy:
    """Return the retry policy for downloads."""
    current = settings()
    return RetryPolicy(
        current.fetch_retries, current.fetch_backoff_s, current.fetch_backoff_max_s, current.max_retry_after_s
    )


def batch_analysis_retry() -> RetryPolicy:
    """Return the retry policy for a job's analysis batches (``VCRAWL_BATCH_ANALYSIS_RETRIES``): at the
    default, long enough to outlast a Redis restart."""
    return RetryPolicy(retries=settings().batch_analysis_retries, backoff_s=1.0, backoff_max_s=60.0)


def analysis_retry() -> RetryPolicy:
    """Return the retry policy for analyses."""
    current = settings()
    return RetryPolicy(current.analysis_retries, current.analysis_backoff_s, current.fetch_backoff_max_s)
