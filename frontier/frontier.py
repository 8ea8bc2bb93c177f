"""The frontier of crawl jobs as one object: its queue, its job lifecycle and its statistics."""

from __future__ import annotations

import redis

from frontier.lifecycle import JobLifecycle
from frontier.partitions import JobPartitions
from frontier.queue import FrontierQueue
from frontier.scripts import ReplicaWait, ScriptLoader
from frontier.statistics import FrontierStats

__all__ = ["Frontier"]


class Frontier:
    """The three rooms of the frontier over one Redis client and one script loader.

    ``queue``: admission, leasing batches, their release and reclaim (``FrontierQueue``);
    ``jobs``: create, cycles, pause, resume, cancel, fail, state (``JobLifecycle``);
    ``stats``: per-minute and per-day counters, per-host totals, failures (``FrontierStats``).
    One instance per process is enough.
    """

    def __init__(
        self,
        client: redis.Redis,
        stats_ttl_s: int = 3 * 86400,
        day_stats_ttl_s: int = 90 * 86400,
        replica_wait_ms: int = 0,
    ) -> None:
        # replica_wait_ms > 0: admissions and releases wait that long at most for a replica (ReplicaWait).
        wait = ReplicaWait(client, replica_wait_ms) if replica_wait_ms > 0 else None
        self.scripts = ScriptLoader(client, wait)
        self.partitions = JobPartitions(self.scripts)  # a job split over a cluster's primaries
        self.queue = FrontierQueue(self.scripts, stats_ttl_s=stats_ttl_s, day_stats_ttl_s=day_stats_ttl_s,
                                   partitions=self.partitions)  # fmt: skip
        self.jobs = JobLifecycle(self.scripts, self.partitions)
        self.stats = FrontierStats(client, self.partitions)
