"""Per-process clients and components, made lazily on first use.

Nothing here connects at import time. A pool child gets fresh clients after fork
(``worker_process_init`` calls ``reset``), so no socket is shared between processes.

One module past ~500 lines on purpose: it is the composition root, one short factory per
component; split, every factory would import the others' modules and the wiring would be harder
to see in one place.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import requests

from celeryconfig import DOWNLOAD_QUEUE
from cluster.holdings import Holdings
from cluster.members import NodeRegistry, RingView
from cluster.membership import NodeWatcher, RingKeeper, registration_for
from cluster.outputs import OutputLedger, OutputShipper
from engine.crawl_env import CrawlEnv
from engine.fetch_step import FetchContext, FetchPolicy, FetchServices
from engine.jobs import RuntimeCache, robots_limits
from engine.pump import FrontierPump
from engine.single import SingleEnv
from engine.trail import StatusTrail
from fetchers import (
    BrowserConfig,
    DnsCache,
    FetcherContext,
    FetcherRegistry,
    IdentityPool,
    NetworkPolicy,
    ProxyHealth,
    StaticFetcher,
    make_session,
)
from fetchers.limits import cluster_limits, fetch_limits
from fetchers.netguard import connections_opened
from frontier import Batch, Frontier, History, HostGate, RobotsCache
from storage import Storage, job_fetch_log_location, job_records_location, job_warc_location
from storage.records import RecordWriter
from storage.records import recover_spools as recover_record_spools
from storage.warc import WarcWriter
from storage.warc import recover_spools as recover_warc_spools
from tasks.app import app
from tasks.broker.queues import move_queue
from tasks.redis_clients import make_redis_client
from telemetry.alerts import Alert, Alerter
from vcrawl import redis_keys
from vcrawl.policies import PolitenessPolicy, RetryPolicy
from vcrawl.settings import Settings

logger = logging.getLogger(__name__)

__all__ = [
    "alert",
    "alerter",
    "analysis_retry",
    "batch_analysis_retry",
    "close_warc",
    "crawl_env",
    "dns_cache",
    "fetch_log",
    "fetch_retry",
    "fetchers",
    "first_in_window",
    "flush_records",
    "frontier",
    "history",
    "host_gate",
    "identities",
    "job_completed",
    "node_registry",
    "note_output",
    "output_ledger",
    "output_shipper",
    "politeness",
    "proxy_health",
    "pump",
    "records",
    "redis_client",
    "reset",
    "ring_keeper",
    "ring_queue",
    "ring_view",
    "robots",
    "runtimes",
    "session",
    "settings",
    "single_context",
    "single_env",
    "start_batch_analyzers",
    "storage",
    "trail",
    "warc",
]

_lock = threading.RLock()
_settings: Settings | None = None
_made: dict[str, Any] = {}


def reset(new_settings: Settings | None = None) -> None:
    """Forget every client; the next use builds them again (from ``new_settings`` if given)."""
    global _settings
    with _lock:
        if (shipper := _made.get("output_shipper")) is not None:
            shipper.stop(timeout_s=0)  # its writers are forgotten with the rest
        _made.clear()
        _settings = new_settings


def settings() -> Settings:
    """Return this process's settings (read from the environment on first use)."""
    global _settings
    with _lock:
        if _settings is None:
            _settings = Settings.from_env()
        return _settings


def _once(name: str, build: Any) -> Any:
    made = _made.get(name)
    if made is None:
        with _lock:
            made = _made.get(name)
            if made is None:
                made = _made[name] = build()
    return made


def redis_client() -> redis.Redis:
    """Return the Redis client for vcrawl's own keys (status trail, politeness)."""
    return _once("redis", lambda: make_redis_client(settings()))


def storage() -> Storage:
    """Return the storage router for the configured data location."""
    return _once("storage", lambda: Storage.from_settings(settings()))


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

    return _once("fetchers", build)


def session() -> requests.Session:
    """Return this process's pooled HTTP session (shared by single tasks and jobs)."""
    return _once("session", lambda: make_session(pool_size=64, resolver=dns_cache()))


def dns_cache() -> DnsCache:
    """Return this process's DNS cache: every connection of its threads resolves through it."""
    return _once("dns_cache", lambda: DnsCache.from_settings(settings()))


def frontier() -> Frontier:
    """Return the crawl frontier (per-host queues and their scripts)."""
    return _once("frontier", lambda: Frontier(redis_client(), stats_ttl_s=settings().stats_retention_s,
                                              day_stats_ttl_s=settings().stats_retention_days * 86400,
                                              replica_wait_ms=settings().redis_replica_wait_ms))  # fmt: skip


def runtimes() -> RuntimeCache:
    """Return the per-job runtime cache."""
    return _once("runtimes", lambda: RuntimeCache(frontier(), settings(), session(), redis_client()))


def single_context() -> FetchContext:
    """What the one fetch step needs for a single ``crawl.delay`` task: the cluster's settings as its policy."""

    def build() -> FetchContext:
        current = settings()
        robots_txt = robots_limits(fetch_limits(cluster_limits(current)))
        services = FetchServices(
            fetcher=fetchers().get("static"),
            robots_fetcher=StaticFetcher(session(), robots_txt, policy=NetworkPolicy.from_settings(current)),
            identities=identities(),
            robots=robots(),
            store=storage(),
            fetchers=fetchers(),
            proxies=proxy_health(),
            alert=alert,
            api_auth=dict(current.api_auth),
        )
        return FetchContext(services, FetchPolicy(retry=fetch_retry(), robots_retry_s=current.robots_error_ttl_s))

    return _once("single_context", build)


def single_env() -> SingleEnv:
    """What a single task's fetch uses: the fetch step's context, the host gate, the trail, the pause."""
    return SingleEnv(single_context(), host_gate(), trail(), politeness())


def politeness() -> PolitenessPolicy:
    """The cluster's per-host pause for single tasks (a job's own politeness applies to its hosts)."""
    current = settings()
    return PolitenessPolicy(current.min_interval_s, current.interval_jitter)


def history() -> History:
    """URL history of scheduled jobs."""
    return _once("history", lambda: History(redis_client()))


def robots() -> RobotsCache:
    """Return the robots.txt cache (Redis, with an in-process layer)."""
    current = settings()
    return _once("robots", lambda: RobotsCache(redis_client(), current.robots_ttl_s, current.robots_error_ttl_s))


def crawl_env() -> CrawlEnv:
    """Return what crawl batches use."""

    retry_robots_s = settings().robots_error_ttl_s
    return _once(
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
        ),
    )


def _per_job(kind: str, job_id: str, build: Callable[[Settings], Any]) -> Any:
    """This process's one ``kind`` writer for ``job_id``, made on first use."""
    writers: dict[str, Any] = _once(kind, dict)
    with _lock:
        if job_id not in writers:
            writers[job_id] = build(settings())
        return writers[job_id]


def records(job_id: str) -> RecordWriter:
    """Return this process's record writer for ``job_id`` (one part file at a time per job)."""
    return _per_job(
        "records",
        job_id,
        lambda current: RecordWriter(
            storage(),
            job_records_location(job_id),
            max_part_bytes=current.records_part_bytes,
            max_part_age_s=current.records_flush_s,
            spool_dir=spool_dir(current, "records"),
            on_open=lambda _writer_id: note_output(job_id),
        ),
    )


# A job's fetch log part ships once no line came for this long: right after the job ends, so
# batch analysis started then finds it whole.
FETCH_LOG_IDLE_S = 2.0


def fetch_log(job_id: str) -> RecordWriter:
    """Return this process's fetch log writer for ``job_id`` (``engine.fetch_log``).

    Its open parts are listed in Redis until shipped, so batch analysis knows to wait for them.
    """
    pending = redis_keys.job_log_writers(job_id)

    def opened(writer_id: str) -> None:
        _best_effort(lambda: redis_client().hset(pending, writer_id, round(time.time(), 3)))
        note_output(job_id)

    def shipped(writer_id: str) -> None:
        _best_effort(lambda: redis_client().hdel(pending, writer_id))

    return _per_job(
        "fetch_log",
        job_id,
        lambda current: RecordWriter(
            storage(),
            job_fetch_log_location(job_id),
            max_part_bytes=current.records_part_bytes,
            max_part_age_s=current.records_flush_s,
            spool_dir=spool_dir(current, "records"),
            on_open=opened,
            on_ship=shipped,
            idle_s=FETCH_LOG_IDLE_S,
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


def _best_effort(call: Callable[[], Any]) -> None:
    # A hint for readers (batch analysis waits less); a failure must not fail the fetch batch.
    try:
        call()
    except redis.RedisError as exc:
        logger.warning("fetch log: could not note a part in Redis: %r", exc)


def spool_dir(current: Settings, kind: str) -> str:
    """Where ``kind`` (records, warc) writers spool: ``VCRAWL_<KIND>_SPOOL_DIR``, else one directory
    per store.

    Per store, because a worker that finds a dead writer's spool ships it into its own store.
    """
    configured = current.records_spool_dir if kind == "records" else current.warc_spool_dir
    if configured:
        return configured
    data = current.data
    if "://" not in data or data.startswith("file://"):
        return os.path.join(data.removeprefix("file://"), ".spool", kind)
    tag = hashlib.sha1(data.encode(), usedforsecurity=False).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"vcrawl-spool-{os.getuid()}", tag, kind)


def recover_spools() -> list[str]:
    """Ship the records and WARC files killed workers of this store left in the spools (at worker start)."""
    current = settings()
    return [
        *recover_record_spools(storage(), spool_dir(current, "records")),
        *recover_warc_spools(storage(), spool_dir(current, "warc")),
    ]


def warc(job_id: str) -> WarcWriter:
    """Return this process's WARC writer for ``job_id``: one writer per process, so no file has two."""
    return _per_job(
        "warc",
        job_id,
        lambda current: WarcWriter(
            storage(),
            job_warc_location(job_id),
            max_file_bytes=current.warc_file_bytes,
            spool_dir=spool_dir(current, "warc"),
            on_open=lambda: note_output(job_id),
        ),
    )


def close_warc() -> None:
    """Ship every job's open WARC file and its index into the store (at worker shutdown)."""
    for writer in list(_made.get("warc", {}).values()):
        writer.close()


def flush_records() -> None:
    """Ship every job's pending records and fetch log lines into the store (at worker shutdown, or on demand)."""
    for kind in ("records", "fetch_log"):
        for writer in list(_made.get(kind, {}).values()):
            writer.flush()


def output_ledger() -> OutputLedger:
    """Which worker processes hold a job's output not shipped yet (a process is dead after the node timeout)."""
    return _once("output_ledger", lambda: OutputLedger(redis_client(), settings().node_timeout_s))


class _ProcessOutputs:
    """This process's WARC, record and fetch log writers, by job (``cluster.outputs.LocalOutputs``)."""

    _KINDS = ("warc", "records", "fetch_log")

    def jobs(self) -> list[str]:
        return sorted({job_id for kind in self._KINDS for job_id in list(_made.get(kind, {}))})

    def has_pending(self, job_id: str) -> bool:
        return any(writer.pending for writer in self._writers(job_id))

    def ship(self, job_id: str) -> None:
        # Every writer gets its turn even when one fails; the first failure is raised after.
        failure: Exception | None = None
        for writer in self._writers(job_id):
            try:
                writer.roll() if isinstance(writer, WarcWriter) else writer.flush()
            except Exception as exc:
                logger.warning("job %s: shipping %r failed (kept for the next try): %r", job_id, writer, exc)
                failure = failure or exc
        if failure is not None:
            raise failure

    def _writers(self, job_id: str) -> list[Any]:
        return [writer for kind in self._KINDS if (writer := _made.get(kind, {}).get(job_id)) is not None]


def output_shipper() -> OutputShipper:
    """This process's output shipper (not started): ships a job's output when the job completes."""
    return _once(
        "output_shipper", lambda: OutputShipper(output_ledger(), _ProcessOutputs(), frontier().jobs.state_and_cycle)
    )


def note_output(job_id: str) -> None:
    """A writer of ``job_id`` in this process opened a file: note it in the ledger, and make sure this
    process's shipper runs (a prefork child has its own writers, so its own shipper)."""
    try:
        output_shipper().start().note(job_id)
    except redis.RedisError as exc:  # the shipper's next round notes it again
        logger.warning("job %s: could not note this process's open output in Redis: %r", job_id, exc)


def pump(dispatch: Callable[[str, Batch, Any], None]) -> FrontierPump:
    """Return this process's frontier pump (not started); ``dispatch`` sends a leased batch."""

    def producer() -> Any:
        # Bounded: a pool drained by publishes waiting for a restarting Redis must not hang the pump.
        return app.producer_pool.acquire(block=True, timeout=10)

    return _once("pump", lambda: FrontierPump(frontier(), runtimes(), dispatch, settings(), producer, alert=alert))


def node_registry() -> NodeRegistry:
    """The ring's membership in this process's Redis."""
    return _once("node_registry", lambda: NodeRegistry(frontier().scripts, settings().node_timeout_s))


def ring_view() -> RingView:
    """This process's view of the ring (read again at most every second)."""
    return _once("ring_view", lambda: RingView(node_registry()))


def ring_queue(host: str) -> str | None:
    """The queue of ``host``'s ring node now (None: no ring node alive; use the shared queue)."""
    return ring_view().current().queue_of(host)


def ring_keeper(node_name: str | None, holdings: Holdings | None = None) -> RingKeeper:
    """This worker's membership thread (not started): it beats as ``node_name`` (a ring node with
    ``VCRAWL_NODE_WEIGHT`` / ``VCRAWL_RING``, else a plain worker of weight 0), says what it holds,
    watches for dead members and sweeps orphaned messages (with ``holdings``)."""

    def build() -> RingKeeper:
        current = settings()
        # A dead node's messages (and those its unacknowledged ones come back as, after the visibility
        # timeout) go to the shared queue; whoever takes one passes it on to its host's owner now.
        watcher = NodeWatcher(frontier(), node_registry(), runtimes(),
                              lambda name: move_queue(redis_client(), name, DOWNLOAD_QUEUE), alert=alert,
                              holdings=holdings)  # fmt: skip
        registration = registration_for(node_name, max(0, current.ring_weight)) if node_name else None
        beat_s = min(2.0, current.node_timeout_s / 5)
        return RingKeeper(node_registry(), watcher, registration, beat_s, ring_view(), counters=_process_counters,
                          holdings=holdings)  # fmt: skip

    return _once("ring_keeper", build)


def _process_counters() -> dict[str, int]:
    dns = dns_cache().stats()
    return {"connections_opened": connections_opened(), "dns_lookups": dns.lookups, "dns_hits": dns.hits}


def first_in_window(cause: str) -> bool:
    """True once per ``cause`` per ``VCRAWL_ALERT_WINDOW_S``: a broken site does not send a thousand emails."""
    window_s = max(1, int(settings().alert_window_s))
    return bool(redis_client().set(redis_keys.alert_sent(cause, "job"), 1, nx=True, ex=window_s))


def alert(cause: str, message: Alert) -> bool:
    """Send ``message`` unless an alert for ``cause`` went out within the alert window."""
    if not first_in_window(cause):
        return False
    alerter().send(message)
    return True


def identities() -> IdentityPool:
    """Return the User-Agent / Referer / proxy pool."""
    current = settings()
    return _once(
        "identities",
        lambda: IdentityPool(
            current.user_agents, current.referers, current.proxies, harvested=bool(current.proxy_sources)
        ),
    )


def proxy_health() -> ProxyHealth:
    """Return the cluster's proxy bench (cool-offs in Redis, cached here for a second)."""
    return _once("proxy_health", lambda: ProxyHealth.from_settings(settings(), redis_client()))


def host_gate() -> HostGate:
    """Return the cluster-wide per-host politeness gate."""
    current = settings()
    return _once("host_gate", lambda: HostGate(redis_client(), politeness(), busy_s=current.total_timeout_s + 30))


def trail() -> StatusTrail:
    """Return the status trail store."""
    return _once("trail", lambda: StatusTrail(redis_client(), settings().status_ttl_s))


def alerter() -> Alerter:
    """Return the admin alert sender."""
    return _once("alerter", lambda: Alerter.from_settings(settings()))


def fetch_retry() -> RetryPolicy:
    """Return the retry policy for downloads."""
    current = settings()
    return RetryPolicy(
        current.fetch_retries, current.fetch_backoff_s, current.fetch_backoff_max_s, current.max_retry_after_s
    )


def batch_analysis_retry() -> RetryPolicy:
    """Return the retry policy for a job's analysis batches: long enough to outlast a Redis restart."""
    return RetryPolicy(retries=10, backoff_s=1.0, backoff_max_s=60.0)


def analysis_retry() -> RetryPolicy:
    """Return the retry policy for analyses."""
    current = settings()
    return RetryPolicy(current.analysis_retries, current.analysis_backoff_s, current.fetch_backoff_max_s)
