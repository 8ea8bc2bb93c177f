"""What the engine's steps and batches are handed in this process: a single task's fetch context and
environment, the crawl environment of jobs' batches, what happens when a job completes, the pump."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis

from engine.crawl_env import CrawlEnv
from engine.fetch_step import FetchContext, FetchPolicy, FetchServices
from engine.jobs import robots_limits
from engine.pump import FrontierPump
from engine.single import SingleEnv
from fetchers import NetworkPolicy, StaticFetcher
from fetchers.limits import cluster_limits, fetch_limits
from frontier import Batch
from tasks.app import app
from tasks.deps.clients import alert, alerter, first_in_window, once, session, settings, storage
from tasks.deps.keepers import output_ledger, ring_queue
from tasks.deps.outputs import fetch_log, records, warc
from tasks.deps.pipeline import (
    fetch_retry,
    fetchers,
    frontier,
    history,
    host_gate,
    identities,
    node_meter,
    origin_holds,
    politeness,
    proxy_health,
    robots,
    runtimes,
    trail,
)

__all__ = ["crawl_env", "job_completed", "pump", "single_context", "single_env", "start_batch_analyzers"]

logger = logging.getLogger(__name__)


def single_context() -> FetchContext:
    """What the one fetch step needs for a single ``crawl.delay`` task: the cluster's settings as its policy."""

    def build() -> FetchContext:
        current = settings()
        limits, policy = fetch_limits(cluster_limits(current)), NetworkPolicy.from_settings(current)
        services = FetchServices(
            # Its own, not the registry's: built again from the cluster's live timeouts (clients.LIVE_DERIVED).
            fetcher=StaticFetcher(session(), limits, policy=policy),
            robots_fetcher=StaticFetcher(session(), robots_limits(limits), policy=policy),
            identities=identities(),
            robots=robots(),
            store=storage(),
            fetchers=fetchers(),
            proxies=proxy_health(),
            alert=alert,
            api_auth=dict(current.api_auth),
            meter=node_meter(),
        )
        return FetchContext(services, FetchPolicy(retry=fetch_retry(), robots_retry_s=current.robots_error_ttl_s))

    return once("single_context", build)


def single_env() -> SingleEnv:
    """What a single task's fetch uses: the fetch step's context, the host gate, the trail, the pause."""
    return SingleEnv(single_context(), host_gate(), trail(), politeness())


def crawl_env() -> CrawlEnv:
    """Return what crawl batches use."""

    retry_robots_s = settings().robots_error_ttl_s
    return once(
        "crawl_env",
        lambda: CrawlEnv(
            frontier(),
            runtimes(),
            robots(),
            storage(),
            alerter(),
            first_in_window,
            fetchers(),
            records,
            warc,
            history(),
            retry_robots_s,
            host_alert=(settings().alert_host_failure_rate, settings().alert_host_min_fetches),
            proxies=proxy_health(),
            fetch_log=fetch_log,
            on_completed=job_completed,
            holds=origin_holds(),  # listening from before this process's first batch starts
            meter=node_meter(),
        ),
    )


def job_completed(job_id: str, cycle: int) -> None:
    """The job (or its cycle) just completed: every worker ships its output of it, then its batch analyzers go."""
    try:
        output_ledger().announce(job_id, cycle)
    except redis.RedisError as exc:  # the shippers' poll finds the completion within seconds anyway
        logger.warning("job %s: could not announce its completion to the output shippers: %r", job_id, exc)
    start_batch_analyzers(job_id, cycle)


def start_batch_analyzers(job_id: str, cycle: int) -> None:
    """Send the job's own batch analyzers (its ``batch_analyzers``) for the job or cycle that just completed."""
    spec = runtimes().get(job_id, cycle).spec
    for analyzer in spec.batch_analyzers:
        # By name: this module is below the task modules.
        app.send_task("vcrawl.start_batch_analysis", args=(job_id, analyzer, cycle or None))
        logger.info("job %s: batch analyzer %s sent for cycle %d", job_id, analyzer, cycle)


def pump(dispatch: Callable[[str, list[Batch], Any], None]) -> FrontierPump:
    """Return this process's frontier pump (not started); ``dispatch`` sends a pump call's leased batches."""

    def producer() -> Any:
        # Bounded: a pool drained by publishes waiting for a restarting Redis must not hang the pump.
        return app.producer_pool.acquire(block=True, timeout=10)

    def paced_bundles() -> bool:  # paced batches go in bundles to the shared queue while no ring node is alive
        return ring_queue("") is None

    return once("pump", lambda: FrontierPump(frontier(), runtimes(), dispatch, settings(), producer, alert=alert,
                                             paced_bundles=paced_bundles))  # fmt: skip
