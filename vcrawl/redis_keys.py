"""Every Redis key vcrawl uses, in one place."""

from __future__ import annotations

__all__ = ["PREFIX", "alert_sent", "host_gate", "task_status"]

PREFIX = "vcrawl"


def task_status(trail_id: str) -> str:
    """Hash with the status trail of one submitted task."""
    return f"{PREFIX}:task:{trail_id}"


# A host's gate keys share the hash tag {host}: one script reads and writes them together.


def host_gate(host: str) -> str:
    """String: the next time (ms) a single task may start a request to ``host``."""
    return f"{PREFIX}:gate:{{{host}}}"


def host_free(host: str) -> str:
    """String: a pause after the last single-task request to ``host`` ended (ms)."""
    return f"{PREFIX}:free:{{{host}}}"


def host_busy(host: str) -> str:
    """String that exists while a single task's request to ``host`` runs."""
    return f"{PREFIX}:busy:{{{host}}}"


def robots(origin: str) -> str:
    """String: the cached robots.txt rules of an origin (``scheme://host[:port]``)."""
    return f"{PREFIX}:robots:{origin}"


def bloom_segment(name: str, index: int) -> str:
    """String: one segment of a stand-alone Bloom filter (one hash tag per segment)."""
    return f"{PREFIX}:bloom:{{{name}:{index}}}"


def alert_sent(trail_id: str, stage: str) -> str:
    """Marker that the admin alert for ``stage`` of a task went out (sent once)."""
    return f"{PREFIX}:alerted:{trail_id}:{stage}"


# Crawl jobs. Every key of one job carries the hash tag {job}, so a job's keys share a
# Redis Cluster slot and its Lua scripts may touch them together.


def job(job_id: str) -> str:
    """Hash: a job's spec, state, timestamps and counters."""
    return f"{PREFIX}:job:{{{job_id}}}"


def job_ready(job_id: str) -> str:
    """Sorted set: host -> earliest next fetch time (ms); only hosts with queued URLs."""
    return f"{PREFIX}:job:{{{job_id}}}:ready"


def job_next(job_id: str) -> str:
    """Hash: host -> not-before time (ms) of its next fetch, kept while its queue is empty."""
    return f"{PREFIX}:job:{{{job_id}}}:next"


def job_busy(job_id: str) -> str:
    """Hash: host -> fetch batches in flight."""
    return f"{PREFIX}:job:{{{job_id}}}:busy"


def job_delays(job_id: str) -> str:
    """Hash: host -> its robots.txt Crawl-delay (ms); such hosts get one request at a time."""
    return f"{PREFIX}:job:{{{job_id}}}:delays"


def job_leases(job_id: str) -> str:
    """Hash: batch id -> the leased entries, host and lease deadline (JSON)."""
    return f"{PREFIX}:job:{{{job_id}}}:leases"


def job_holds(job_id: str) -> str:
    """Hash: host -> the end (ms, Redis time) of the hold its Retry-After (or spent rate limit) asked for
    (``hold.lua``): no batch of the host is leased, started or fetching until then."""
    return f"{PREFIX}:job:{{{job_id}}}:holds"


def job_renewals(job_id: str) -> str:
    """Counter: paced batches' lease renewals, the small write that fences each (``renew_leases.lua``)."""
    return f"{PREFIX}:job:{{{job_id}}}:renewals"


def job_placed_hosts(job_id: str) -> str:
    """String: a split job's seed hosts, JSON, in order: the n-th is in partition n mod their number
    (``frontier.partitions``); apart from the job's hash, which status reads often."""
    return f"{PREFIX}:job:{{{job_id}}}:placed-hosts"


def job_sitemap_hints(job_id: str) -> str:
    """Hash: canonical URL -> what the job's sitemaps said of it, and in which cycle (JSON)."""
    return f"{PREFIX}:job:{{{job_id}}}:sitemap-hints"


def job_released(job_id: str) -> str:
    """Hash: batch id -> what a released fetch batch hands to its analysis (JSON), until analysed."""
    return f"{PREFIX}:job:{{{job_id}}}:released"


def job_queued_urls(job_id: str) -> str:
    """Hash: URL -> its entry while it waits in a per-host queue (priority jobs: an in-link finds it)."""
    return f"{PREFIX}:job:{{{job_id}}}:queued-urls"


def job_inlinks(job_id: str) -> str:
    """Hash: URL -> links to it seen while it was queued (priority jobs: they raise its score)."""
    return f"{PREFIX}:job:{{{job_id}}}:inlinks"


def job_queue_prefix(job_id: str) -> str:
    """Prefix of the per-host queues (sorted sets, ordered by the job's strategy)."""
    return f"{PREFIX}:job:{{{job_id}}}:q:"


def job_queue(job_id: str, host: str) -> str:
    """Sorted set: the URL entries waiting for ``host``."""
    return job_queue_prefix(job_id) + host


JOBS = f"{PREFIX}:jobs"
"""Sorted set: every job id -> creation time."""

JOBS_RUNNING = f"{PREFIX}:jobs:running"
"""Set: ids of running jobs (what the frontier pumps look at)."""

FRONTIER_WAKE = f"{PREFIX}:frontier:wake"
"""List: a token pushed when URLs are admitted, so an idle pump wakes at once."""


def job_admit_tokens(job_id: str) -> str:
    """Set: tokens of admission calls already applied (a retried analysis admits once)."""
    return f"{PREFIX}:job:{{{job_id}}}:admitted"


def job_bloom_segment(job_id: str, index: int) -> str:
    """String: one segment of the job's Bloom filter (same hash tag: admission is one script)."""
    return f"{PREFIX}:job:{{{job_id}}}:bloom:{index}"


# Scheduled jobs: what carries over from one cycle to the next.


def job_history(job_id: str) -> str:
    """Hash: URL -> what the job learned of it (see ``frontier.history``)."""
    return f"{PREFIX}:job:{{{job_id}}}:hist"


def job_due(job_id: str) -> str:
    """Sorted set: URL -> the time (s) it is due for a revisit."""
    return f"{PREFIX}:job:{{{job_id}}}:due"


def job_todo(job_id: str) -> str:
    """Sorted set: the URLs the current cycle took as due when it started."""
    return f"{PREFIX}:job:{{{job_id}}}:todo"


def job_cycles(job_id: str) -> str:
    """List: JSON summaries of the job's finished cycles, oldest first."""
    return f"{PREFIX}:job:{{{job_id}}}:cycles"


SCHEDULE_PREFIX = f"{PREFIX}:schedule:"
"""Key prefix of the RedBeat schedule entries (and its lock and index keys)."""


# Operations: what the job API and dashboard read.


def job_stats_bucket(job_id: str, minute: int) -> str:
    """Hash: a job's fetch counters in one minute (``minute`` since the epoch); expires."""
    return f"{PREFIX}:job:{{{job_id}}}:stats:{minute}"


def job_day_stats(job_id: str, day: str) -> str:
    """Hash: a job's counters (``names.DAY_COUNTERS``, ``failed:<reason>``) on one UTC day (``YYYY-MM-DD``); expires."""
    return f"{PREFIX}:job:{{{job_id}}}:day:{day}"


def job_day_host_stats(job_id: str, day: str) -> str:
    """Hash: ``fetched|<host>``, ``stored|<host>``, ``bytes|<host>``, ``failed|<host>`` on one UTC day; expires."""
    return f"{PREFIX}:job:{{{job_id}}}:day:{day}:hosts"


def job_host_stats(job_id: str) -> str:
    """Hash: ``fetched|<host>`` and ``failed|<host>`` -> totals of the job."""
    return f"{PREFIX}:job:{{{job_id}}}:hosts"


def job_failures(job_id: str) -> str:
    """List: the job's most recent final failures (JSON: url, reason, at), newest first."""
    return f"{PREFIX}:job:{{{job_id}}}:failures"


# Proxies: their health is the cluster's, not a job's.


def proxy_health() -> str:
    """Hash: masked proxy URL -> ``<until ms>:<strikes>`` of its cool-off after failing (Redis clock)."""
    return f"{PREFIX}:proxies:health"


def proxy_pool() -> str:
    """Sorted set: harvested proxy URL -> its latency in ms at its last check (fastest first)."""
    return f"{PREFIX}:proxies:harvested"


def proxy_pool_info() -> str:
    """Hash: harvested proxy URL -> JSON of its last check (latency_s, anonymity, source, checked_at)."""
    return f"{PREFIX}:proxies:harvested:info"


def proxy_harvest_lock() -> str:
    """String with a TTL: held while a harvest runs, so two firings never harvest at once."""
    return f"{PREFIX}:proxies:harvest-lock"


# The host ring (cluster/members.py): ring nodes, their heartbeats, and those declared down. The
# hash tag {nodes} keeps them in one Redis Cluster slot, for the scripts that touch them together.

NODES = f"{PREFIX}:{{nodes}}"
"""Hash: node name -> JSON of its registration (weight, queue, pid, started)."""

NODE_BEATS = f"{PREFIX}:{{nodes}}:beats"
"""Sorted set: node name -> time of its last heartbeat (ms, Redis clock)."""

NODES_DOWN = f"{PREFIX}:{{nodes}}:down"
"""Hash: node name -> JSON of when it was declared down and what was handed over."""

NODE_PAGES = f"{PREFIX}:{{nodes}}:pages"
"""Hash: node name -> pages its fetch batches stored (for pages/s)."""

HOLDERS = f"{PREFIX}:{{nodes}}:holders"
"""Hash: member name -> JSON of the delivery tags it holds unacknowledged, and when it said so (Redis clock)."""

HOLDINGS_SWEEP_LOCK = f"{PREFIX}:{{nodes}}:sweep-lock"
"""String: held by the one worker that puts back messages nobody holds now."""


def node_handover(name: str, last_beat_ms: int) -> str:
    """String: the claim of the one watcher that hands a dead node's work over (one per death)."""
    return f"{PREFIX}:{{nodes}}:handover:{name}:{last_beat_ms}"


# Batch analysis (``batch_analysis.steps``): a job's runs, and its fetch log's unshipped parts.
def job_log_writers(job_id: str) -> str:
    """Hash: writer id -> when its open fetch log part got its first line (parts not shipped yet)."""
    return f"{PREFIX}:job:{{{job_id}}}:logw"


def job_output_writers(job_id: str) -> str:
    """Hash: writer (worker process) -> the cycle it noted: it holds output of the job not shipped yet."""
    return f"{PREFIX}:job:{{{job_id}}}:outw"


def output_writer_alive(writer: str) -> str:
    """String that exists while the worker process ``writer`` lives (its output shipper beats)."""
    return f"{PREFIX}:outputs:alive:{writer}"


def outputs_channel() -> str:
    """Pub/sub channel: ``{"job", "cycle"}`` of every job or cycle that completed (cluster.outputs)."""
    return f"{PREFIX}:outputs:completed"


def holds_channel() -> str:
    """Pub/sub channel: ``{"job", "host", "ms"}`` of every origin hold just set (frontier.holds): each worker
    process's batches in flight make no request to that host for that long."""
    return f"{PREFIX}:holds"


def job_analyses(job_id: str) -> str:
    """Sorted set: a job's batch analysis runs by start time."""
    return f"{PREFIX}:job:{{{job_id}}}:runs"


def analysis_run(job_id: str, run_id: str) -> str:
    """Hash: one batch analysis run (analyzer, state, chunks, result, ...)."""
    return f"{PREFIX}:job:{{{job_id}}}:run:{run_id}"


def analysis_chunks_done(job_id: str, run_id: str) -> str:
    """Set: the indexes of a run's chunks whose map finished."""
    return f"{PREFIX}:job:{{{job_id}}}:run:{run_id}:done"


def analyses_running() -> str:
    """Set: ``<job>\\t<run>`` of every batch analysis run not finished yet (the workers' watchdog)."""
    return f"{PREFIX}:analyses:running"


def primary_watch() -> str:
    """Hash: the Redis primary's run_id and when a worker last saw it (tasks/broker/primary_watch.py)."""
    return f"{PREFIX}:primary-watch"


def primary_watch_lock() -> str:
    """String: held by the one worker that looks at the primary now."""
    return f"{PREFIX}:primary-watch:lock"


def lost_analyses_lock() -> str:
    """String: held by the one worker that looks for lost analysis messages now."""
    return f"{PREFIX}:lost-analyses:lock"


def lost_fetches_lock() -> str:
    """String: held by the one worker that looks for lost fetch batch messages now."""
    return f"{PREFIX}:lost-fetches:lock"


def lost_fetches_watch() -> str:
    """Hash: "<job> <batch>" -> when a leased batch was first seen by the watch (Unix seconds)."""
    return f"{PREFIX}:lost-fetches:watch"


def bundle_ledger(task_id: str) -> str:
    """Set: the batches a fetch bundle's run leased for itself, by its message's task id
    (``tasks.broker.bundle_ledger``)."""
    return f"{PREFIX}:bundle-ledger:{task_id}"


def lost_analyses_watch() -> str:
    """Hash: "<job> <batch>" -> when to look at a released batch's analysis message next (JSON)."""
    return f"{PREFIX}:lost-analyses:watch"


def analyses_watch() -> str:
    """String: held by the one worker whose watchdog looks at the runs now."""
    return f"{PREFIX}:analyses:watch"


def log_stream() -> str:
    """Stream: the cluster's log lines (``telemetry.log_stream``), capped near ``VCRAWL_LOG_MAXLEN`` entries."""
    return f"{PREFIX}:logs"


def log_levels() -> str:
    """Hash: logger name -> the level from which its lines go to the log stream (``vcrawl log-level``)."""
    return f"{PREFIX}:logs:levels"


def job_log_stream(job_id: str) -> str:
    """Stream: the log stream's lines about one job (``vcrawl logs --job``), capped and expiring on their own."""
    return f"{PREFIX}:logs:job:{{{job_id}}}"


def live_settings() -> str:
    """Hash: settings field -> the value set live for the whole cluster (``vcrawl config set``)."""
    return f"{PREFIX}:config:live"


def live_settings_rev() -> str:
    """Counter: bumped at each change of the live settings; workers read the hash again when it moves."""
    return f"{PREFIX}:config:live:rev"


# A node's statistics (cluster/node_stats.py): its totals since it joined, its minutes, its hosts.
def node_stats(name: str) -> str:
    """Hash: a node's totals since it joined: requests, successes, failures, bytes, busy_ms, joined_ms."""
    return f"{PREFIX}:{{nodes}}:stats:{name}"


def node_stats_minute(name: str, minute: int) -> str:
    """Hash: a node's counters of one minute (``minute``: epoch seconds // 60), kept an hour."""
    return f"{PREFIX}:{{nodes}}:stats:{name}:m:{minute}"


def node_hosts(name: str) -> str:
    """HyperLogLog: the hosts a node has requested since it joined."""
    return f"{PREFIX}:{{nodes}}:hosts:{name}"
