"""What a crawl job's batches use in a worker process: ``CrawlEnv``, made once per process
(``tasks.deps.crawl_env``), read by the fetch batch (``engine.fetch_batch``) and the analysis batch
(``engine.analyze_batch``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.fetch_step import PageTypeFetchers, ProxyBench, RobotsRulesCache
from engine.jobs import Runtimes
from engine.node_meter import NodeMeter
from frontier import Frontier, History, OriginHolds
from storage import Storage
from storage.records import RecordWriter
from storage.warc import WarcWriter
from telemetry.alerts import Alert, Alerter

__all__ = ["CrawlEnv", "RecordSink", "Runtimes"]


class RecordSink(Protocol):
    """Where a job's records go: JSON Lines parts (``storage.records.RecordWriter``) or a PostgreSQL
    table (``storage.postgres_records.PostgresRecords``)."""

    def write(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Store an analysis batch's records, all of them or (raising) none that counts; return how many.

        Raises:
            RetryableError, OSError: not stored now; the batch is retried.
        """
        ...


@dataclass(frozen=True)
class CrawlEnv:
    """The per-process services a crawl batch uses."""

    frontier: Frontier
    runtimes: Runtimes
    robots: RobotsRulesCache
    storage: Storage
    alerter: Alerter
    alert_once: Callable[[str], bool]
    fetchers: PageTypeFetchers | None = None
    records: Callable[[str], RecordSink] | None = None  # job id -> where this process writes its records
    warc: Callable[[str], WarcWriter] | None = None  # job id -> this process's WARC writer
    history: History | None = None  # URL history of scheduled jobs
    robots_retry_s: float = 600.0
    clock: Callable[[], float] = time.time
    host_alert: tuple[float, int] = (0.5, 20)  # alert when this share of a host's URLs failed, after this many
    proxies: ProxyBench | None = None  # the cluster's proxy bench; None: draw from the pool blindly
    fetch_log: Callable[[str], RecordWriter] | None = None  # job id -> this process's fetch log writer
    on_completed: Callable[[str, int], None] | None = None  # (job, cycle): the job or cycle just completed
    holds: OriginHolds | None = None  # this process's copy of the hosts held (Retry-After); None: not looked at
    meter: NodeMeter | None = None  # this process's wire counters (its node's statistics); None: not counted

    def alert(self, cause: str, alert: Alert) -> bool:
        """Send ``alert`` unless one for ``cause`` went out in the alert window."""
        if not self.alert_once(cause):
            return False
        self.alerter.send(alert)
        return True
