"""The words a crawl job and a task are kept in: their states, a job's meta-hash fields, counters and queue scores.

A job lives in one Redis hash (``redis_keys.job``): its spec, state, timestamps, the
frontier's bookkeeping and the counters of what happened. Python and the frontier's Lua
both read and write it, so every name is spelled here once; the Lua gets these values
substituted for its ``{{NAME}}`` placeholders when the scripts are loaded (``vcrawl.lua``). A
single task's status trail (``engine.trail``) and a batch analysis run (``batch_analysis.runs``)
have states of their own, here too.
"""

from __future__ import annotations

__all__ = [
    "ACTIVE_STATES",
    "COUNTER_ANALYSED",
    "COUNTER_BYTES",
    "COUNTER_CHANGED",
    "COUNTER_DUPLICATES",
    "COUNTER_FETCHED",
    "COUNTER_HANDED_OVER",
    "COUNTER_LEASE_EXPIRED",
    "COUNTER_NEW",
    "COUNTER_NOT_DUE",
    "COUNTER_NOT_HTML",
    "COUNTER_NOT_MODIFIED",
    "COUNTER_RECORDS",
    "COUNTER_REDIRECTS",
    "COUNTER_RETRIES",
    "COUNTER_ROBOTS_BLOCKED",
    "COUNTER_ROBOTS_FETCHED",
    "COUNTER_SITEMAPS_LISTED",
    "COUNTER_SITEMAPS_READ",
    "COUNTER_SITEMAP_URLS",
    "COUNTER_SLOW",
    "COUNTER_STORED",
    "COUNTER_UNCHANGED",
    "COUNTER_UNCHANGED_BY_SITEMAP",
    "COUNTER_WARC_FAILED",
    "COUNTER_WARC_RECORDS",
    "DAY_COUNTERS",
    "FINAL_STATES",
    "HOST_BYTES",
    "HOST_DONE",
    "HOST_FAILED",
    "HOST_FETCHED",
    "HOST_SLOW",
    "HOST_STORED",
    "HOST_THROTTLED",
    "INLINK_BONUS",
    "INLINK_CAP",
    "META_ADMITTED",
    "META_BATCH_SEQ",
    "META_CREATED_AT",
    "META_CYCLE",
    "META_DISPATCHED",
    "META_ERROR",
    "META_FINISHED_AT",
    "META_FIRING",
    "META_LAST_SKIPPED_AT",
    "META_PARTITIONED",
    "META_PARTITIONS",
    "META_PAUSED_AT",
    "META_PENDING",
    "META_PROGRESS_AT",
    "META_QUEUED_NOW",
    "META_SEQ",
    "META_SKIPPED_FIRINGS",
    "META_SPEC",
    "META_SPEC_REV",
    "META_STARTED_AT",
    "META_STARTING",
    "META_STATE",
    "META_STRATEGY",
    "PREFIX_ANALYSIS_FAILED",
    "PREFIX_FAILED",
    "PREFIX_FILTERED",
    "PREFIX_SITEMAP_PROBLEM",
    "PREFIX_STATUS",
    "REASON_DNS_ERROR",
    "REASON_FETCH_TASK_FAILED",
    "REASON_LEASE_EXPIRED",
    "REASON_MAX_PAGES",
    "RUN_DONE",
    "RUN_FAILED",
    "RUN_RUNNING",
    "SCORE_BACK_OF_QUEUE",
    "SCORE_DEPTH",
    "SCORE_HUNDREDTH",
    "SCORE_INLINK",
    "SCORE_SITEMAP_FIRST",
    "STATE_CANCELLED",
    "STATE_COMPLETED",
    "STATE_FAILED",
    "STATE_PAUSED",
    "STATE_RUNNING",
    "STRATEGIES",
    "STRATEGY_BREADTH_FIRST",
    "STRATEGY_DEPTH_FIRST",
    "STRATEGY_PRIORITY",
    "TASK_ANALYSIS_FAILED",
    "TASK_ANALYZED",
    "TASK_ANALYZING",
    "TASK_DOWNLOADED",
    "TASK_DOWNLOADING",
    "TASK_DOWNLOAD_FAILED",
    "TASK_FINAL_STATES",
    "TASK_QUEUED",
    "TASK_ROBOTS_BLOCKED",
    "TASK_STATES",
    "TEXT_FIELDS",
]

# Job states. A running or paused job is active: its links are still admitted; only a
# running one is dispatched. A final job never changes state again (a scheduled job's next
# cycle starts afresh).

STATE_RUNNING = "running"
STATE_PAUSED = "paused"
STATE_COMPLETED = "completed"
"""Every admitted URL was finished."""
STATE_CANCELLED = "cancelled"
"""Stopped on request; what was queued stays unfetched."""
STATE_FAILED = "failed"
"""Stopped by an error no retry can mend (a configuration error inside a task); see ``META_ERROR``."""

ACTIVE_STATES = (STATE_RUNNING, STATE_PAUSED)
FINAL_STATES = (STATE_COMPLETED, STATE_CANCELLED, STATE_FAILED)

# A single task's states (its status trail), in the order a task goes through them. A retry waits
# in the state before the one it interrupts; no other move goes back (engine/lua/trail_transition.lua).

TASK_QUEUED = "queued"
TASK_DOWNLOADING = "downloading"
TASK_DOWNLOADED = "downloaded"
TASK_DOWNLOAD_FAILED = "download_failed"
TASK_ROBOTS_BLOCKED = "robots_blocked"
TASK_ANALYZING = "analyzing"
TASK_ANALYZED = "analyzed"
TASK_ANALYSIS_FAILED = "analysis_failed"
TASK_STATES = (TASK_QUEUED, TASK_DOWNLOADING, TASK_DOWNLOADED, TASK_DOWNLOAD_FAILED, TASK_ROBOTS_BLOCKED,
               TASK_ANALYZING, TASK_ANALYZED, TASK_ANALYSIS_FAILED)  # fmt: skip
TASK_FINAL_STATES = (TASK_DOWNLOAD_FAILED, TASK_ROBOTS_BLOCKED, TASK_ANALYZED, TASK_ANALYSIS_FAILED)

# A batch analysis run's states (batch_analysis.runs).

RUN_RUNNING = "running"
RUN_DONE = "done"
RUN_FAILED = "failed"

# Fields of a job's meta hash that are not counters.

META_SPEC = "spec"
"""The job spec (JSON)."""
META_STATE = "state"
"""One of the ``STATE_*`` values."""
META_ERROR = "error"
"""Why a ``failed`` job failed (text)."""
META_CREATED_AT = "created_at"
META_STARTED_AT = "started_at"
"""When the current cycle of a scheduled job started (epoch seconds)."""
META_FINISHED_AT = "finished_at"
META_PAUSED_AT = "paused_at"
META_PROGRESS_AT = "progress_at"
"""When a fetch batch was last released (epoch seconds): how the pump tells a stuck job."""
META_SPEC_REV = "spec_rev"
"""How many times the spec was changed while the job ran."""
META_CYCLE = "cycle"
"""A scheduled job's current cycle (absent: a one-off job)."""
META_FIRING = "firing"
"""The schedule firing that started the current cycle."""
META_STARTING = "starting"
"""Set while a cycle's seeds and due URLs are being admitted."""
META_SKIPPED_FIRINGS = "skipped_firings"
META_LAST_SKIPPED_AT = "last_skipped_at"
META_STRATEGY = "strategy"
"""The spec's crawl strategy, where the frontier's scripts read it (absent: breadth-first)."""
META_PARTITIONS = "partitions"
"""A job split over a Redis Cluster's primaries: its partitions' ids, JSON (``frontier.partitions``)."""
META_PARTITIONED = "partitioned"
"""On each partition of a split job: a partition idle is not the job completed (``_common.lua``'s settle)."""

# Crawl strategies: the order of a job's URLs in its per-host queues (docs/strategies.md).

STRATEGY_BREADTH_FIRST = "breadth-first"
"""Shallower first, first come first served within a depth (the default)."""
STRATEGY_DEPTH_FIRST = "depth-first"
"""Deeper first, last come first served within a depth."""
STRATEGY_PRIORITY = "priority"
"""Higher priority score first (the job's priorities, the sitemap, depth, in-links), also across hosts."""
STRATEGIES = (STRATEGY_BREADTH_FIRST, STRATEGY_DEPTH_FIRST, STRATEGY_PRIORITY)

# Queue scores (lowest first), spelled here once for Python and the frontier's scripts
# (frontier/lua/admit.lua has the formula per strategy).

SCORE_DEPTH = 1e12
"""A score's unit per link followed from a seed: a depth's URLs share one band (``arrival`` sequence within)."""
SCORE_BACK_OF_QUEUE = 2000 * SCORE_DEPTH
"""Added to requeue a URL behind everything its host has queued: deeper than any depth a job allows."""
SCORE_SITEMAP_FIRST = -1001 * SCORE_DEPTH
"""A sitemap to read in a depth-first or priority job: ahead of every depth (max_depth <= 1000) and priority."""
SCORE_HUNDREDTH = 1e10
"""A priority job's score per hundredth of a URL's priority (higher priority: lower score)."""
INLINK_BONUS = 0.1
"""What each link to a queued URL found later adds to its priority (``frontier/lua/admit.lua``)."""
INLINK_CAP = 10
"""In-links counted at most: a hub linked from every page gains ``INLINK_CAP * INLINK_BONUS``."""
SCORE_INLINK = round(INLINK_BONUS * 100) * SCORE_HUNDREDTH
"""``INLINK_BONUS`` in score units: what one in-link takes off a queued URL's score."""

# The frontier's bookkeeping in the meta hash (numbers, reported with the counters).

META_PENDING = "pending"
"""URLs admitted and not yet finished; the job completes when it reaches 0."""
META_ADMITTED = "admitted"
"""URLs admitted so far (held to the job's ``max_pages``)."""
META_QUEUED_NOW = "queued_now"
"""URLs waiting in the per-host queues (not leased)."""
META_DISPATCHED = "dispatched"
"""URLs leased to fetch batches so far."""
META_SEQ = "seq"
"""Arrival sequence of admitted URLs (FIFO within a depth)."""
META_BATCH_SEQ = "batch_seq"
"""The last fetch batch id handed out."""

TEXT_FIELDS = (
    META_SPEC,
    META_STATE,
    META_ERROR,
    META_CREATED_AT,
    META_FINISHED_AT,
    META_STARTED_AT,
    META_FIRING,
    META_LAST_SKIPPED_AT,
    META_PAUSED_AT,
    META_PROGRESS_AT,
    META_STRATEGY,
)
"""Meta fields that are never counters, whatever their value looks like."""

# Counters in the meta hash (and, for a fetch batch's, in the per-minute statistics).

COUNTER_FETCHED = "fetched"
"""Responses received."""
COUNTER_STORED = "stored"
COUNTER_BYTES = "bytes"
COUNTER_ROBOTS_BLOCKED = "robots_blocked"
COUNTER_ROBOTS_FETCHED = "robots_fetched"
COUNTER_REDIRECTS = "redirects"
COUNTER_RETRIES = "retries"
COUNTER_SLOW = "slow"
"""Requests given up for time: no answer in time, too slow a body, the total budget spent."""
COUNTER_DUPLICATES = "duplicates"
COUNTER_LINKS_TRUNCATED = "links_truncated"
"""Links of pages past the job's ``max_links_per_page``: counted, not read nor admitted."""
COUNTER_NOT_DUE = "not_due"
"""Links to URLs a scheduled job knows, left to their due time."""
COUNTER_LEASE_EXPIRED = "lease_expired"
"""URLs requeued because their batch's lease ran out."""
COUNTER_HANDED_OVER = "handed_over"
"""URLs requeued because the ring node their batch was sent to went down (cluster/members.py)."""
COUNTER_ANALYSED = "analysed"
COUNTER_RECORDS = "records"
COUNTER_NOT_HTML = "not_html"
COUNTER_NOT_MODIFIED = "not_modified"
COUNTER_UNCHANGED = "unchanged"
COUNTER_CHANGED = "changed"
COUNTER_NEW = "new"
COUNTER_SITEMAPS_READ = "sitemaps_read"
"""Sitemap files read (url sets, indexes, text)."""
COUNTER_SITEMAPS_LISTED = "sitemaps_listed"
"""Sitemaps that sitemap indexes listed."""
COUNTER_SITEMAP_URLS = "sitemap_urls"
"""Page URLs that sitemaps listed (before scope, filters and dedup)."""
COUNTER_UNCHANGED_BY_SITEMAP = "unchanged_by_sitemap"
"""Known URLs not fetched again: this cycle's sitemap dates their last change before their last fetch."""
COUNTER_WARC_RECORDS = "warc_records"
COUNTER_WARC_FAILED = "warc_failed"

# Counter families: the prefix, then a reason or a status code.

PREFIX_FAILED = "failed:"
"""URLs that failed for good, by reason (``failed:timeout``)."""
PREFIX_FILTERED = "filtered:"
"""Links dropped by the filters, by reason (``filtered:max_pages``)."""
PREFIX_STATUS = "status:"
"""Responses by HTTP status (``status:200``)."""
PREFIX_SITEMAP_PROBLEM = "sitemap_problem:"
"""Sitemaps that could not be read whole, by reason (``sitemap_problem:malformed``, ``:http_404``)."""
PREFIX_ANALYSIS_FAILED = "analysis_failed:"
"""Pages whose analysis failed, by reason."""

REASON_DNS_ERROR = "dns_error"
"""A fetch's reason when its host name did not resolve (no such name, or no answer from the resolver)."""
REASON_MAX_PAGES = "max_pages"
"""The filter reason of a link over the job's page limit."""
REASON_LEASE_EXPIRED = "lease_expired"
"""The failure reason of a URL whose leases ran out too often."""
REASON_FETCH_TASK_FAILED = "fetch_task_failed"
"""The failure reason of a URL whose fetch batch task failed for good too often (its ``link_error``)."""

# Fields of a job's per-host totals hash (``redis_keys.job_host_stats``): the prefix, then the host.

HOST_FETCHED = "fetched|"
HOST_DONE = "done|"
HOST_FAILED = "failed|"
HOST_SLOW = "slow|"
"""Requests to the host given up for time (``COUNTER_SLOW``): its failure budget."""
HOST_THROTTLED = "throttled|"
"""The host's latest run of 429/503 answers in a row (``politeness.retry_after: auto``)."""

# Per-day statistics (``redis_keys.job_day_stats``): these counters and every ``failed:<reason>``
# of a fetch batch, per job and UTC day; per host and day (``redis_keys.job_day_host_stats``)
# ``HOST_FETCHED``, ``HOST_STORED``, ``HOST_BYTES`` and ``HOST_FAILED`` (all reasons together).

DAY_COUNTERS = (COUNTER_FETCHED, COUNTER_STORED, COUNTER_BYTES, COUNTER_NEW, COUNTER_CHANGED, COUNTER_UNCHANGED)
HOST_STORED = "stored|"
HOST_BYTES = "bytes|"
