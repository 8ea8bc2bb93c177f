"""Per-process clients and components, made lazily on first use: the composition root.

Nothing here connects at import time. A pool child gets fresh clients after fork
(``worker_process_init`` calls ``reset``), so no socket is shared between processes. Every
component is made once per process through one cache and one lock (``clients.once``), and
``reset`` forgets them all. Another cluster's components (``vcrawl serve`` over several) are made in that
cluster's ``Scope``, entered with ``scoped`` (``tasks.clusters``).

By floor, each module built only from those before it:

- ``clients``: settings, the cache (``reset``), Redis, storage, the HTTP session and DNS cache, alerts.
- ``pipeline``: the crawl pipeline's components: frontier, job runtimes, fetchers, robots.txt,
  URL history, identities, the proxy bench, the host gate, the status trail, the policies.
- ``keepers``: the cluster's keepers in this process: the output ledger and shipper, the ring's membership,
  the live settings.
- ``outputs``: jobs' record, WARC and fetch log writers, their spools, shipping them.
- ``envs``: what the engine is handed: a single task's fetch context, the crawl environment, the pump.

Use it as ``from tasks import deps; deps.frontier()``: every name lives here too.
"""

from __future__ import annotations

from tasks.deps.clients import (
    Scope,
    alert,
    alerter,
    base_settings,
    celery_app,
    dns_cache,
    first_in_window,
    frontier_client,
    on_settings_change,
    redis_client,
    reset,
    scoped,
    session,
    settings,
    storage,
    take_up_settings,
)
from tasks.deps.envs import crawl_env, job_completed, pump, single_context, single_env, start_batch_analyzers
from tasks.deps.keepers import (
    live_settings,
    live_settings_keeper,
    node_registry,
    node_stats,
    node_stats_writer,
    output_ledger,
    output_shipper,
    ring_keeper,
    ring_queue,
    ring_view,
)
from tasks.deps.outputs import (
    FETCH_LOG_IDLE_S,
    close_warc,
    fetch_log,
    flush_records,
    note_output,
    records,
    records_database,
    recover_spools,
    spool_dir,
    warc,
)
from tasks.deps.pipeline import (
    analysis_retry,
    batch_analysis_retry,
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

__all__ = [
    "FETCH_LOG_IDLE_S",
    "Scope",
    "alert",
    "alerter",
    "analysis_retry",
    "base_settings",
    "batch_analysis_retry",
    "celery_app",
    "close_warc",
    "crawl_env",
    "dns_cache",
    "fetch_log",
    "fetch_retry",
    "fetchers",
    "first_in_window",
    "flush_records",
    "frontier",
    "frontier_client",
    "history",
    "host_gate",
    "identities",
    "job_completed",
    "live_settings",
    "live_settings_keeper",
    "node_meter",
    "node_registry",
    "node_stats",
    "node_stats_writer",
    "note_output",
    "on_settings_change",
    "origin_holds",
    "output_ledger",
    "output_shipper",
    "politeness",
    "proxy_health",
    "pump",
    "records",
    "records_database",
    "recover_spools",
    "redis_client",
    "reset",
    "ring_keeper",
    "ring_queue",
    "ring_view",
    "robots",
    "runtimes",
    "scoped",
    "session",
    "settings",
    "single_context",
    "single_env",
    "spool_dir",
    "start_batch_analyzers",
    "storage",
    "take_up_settings",
    "trail",
    "warc",
]
