"""This process's cluster keepers: the output ledger and shipper (a job's output shipped when it
completes), the ring's membership (registry, view, the keeper thread)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celeryconfig import DOWNLOAD_QUEUE
from cluster.holdings import Holdings
from cluster.live_settings import LiveSettingsKeeper, LiveSettingsStore
from cluster.members import NodeRegistry, RingView
from cluster.membership import NodeWatcher, RingKeeper, registration_for
from cluster.node_stats import NodeStats, NodeStatsWriter
from cluster.outputs import OutputLedger, OutputShipper
from fetchers.netguard import connections_opened
from frontier.scripts import ScriptLoader
from storage.warc import WarcWriter
from tasks.broker.amqp import amqp_move_queue
from tasks.broker.queues import move_queue
from tasks.deps.clients import (
    alert,
    base_settings,
    celery_app,
    dns_cache,
    made,
    once,
    redis_client,
    settings,
    take_up_settings,
)
from tasks.deps.pipeline import frontier, node_meter, runtimes

__all__ = [
    "OUTPUT_KINDS",
    "live_settings",
    "live_settings_keeper",
    "node_registry",
    "node_stats",
    "node_stats_writer",
    "output_ledger",
    "output_shipper",
    "ring_keeper",
    "ring_queue",
    "ring_view",
]

logger = logging.getLogger(__name__)

OUTPUT_KINDS = ("warc", "records", "fetch_log")
"""The kinds of per-job writers a process holds (``tasks.deps.outputs``), by their name in the cache."""


def live_settings() -> LiveSettingsStore:
    """The cluster's live settings (``vcrawl config``), checked against this process's own."""
    return LiveSettingsStore(redis_client(), base_settings())


def live_settings_keeper() -> LiveSettingsKeeper:
    """This process's thread taking up the cluster's live settings (not started)."""
    return once("live_settings_keeper", lambda: LiveSettingsKeeper(redis_client, base_settings(), take_up_settings))


def output_ledger() -> OutputLedger:
    """Which worker processes hold a job's output not shipped yet (a process is dead after the node timeout)."""
    return once("output_ledger", lambda: OutputLedger(redis_client(), settings().node_timeout_s))


class _ProcessOutputs:
    """This process's WARC, record and fetch log writers, by job (``cluster.outputs.LocalOutputs``)."""

    def jobs(self) -> list[str]:
        return sorted({job_id for kind in OUTPUT_KINDS for job_id in list(made(kind) or {})})

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
        return [writer for kind in OUTPUT_KINDS if (writer := (made(kind) or {}).get(job_id)) is not None]


def output_shipper() -> OutputShipper:
    """This process's output shipper (not started): ships a job's output when the job completes."""
    return once(
        "output_shipper", lambda: OutputShipper(output_ledger(), _ProcessOutputs(), frontier().jobs.state_and_cycle)
    )


def node_registry() -> NodeRegistry:
    """The ring's membership in this process's Redis."""
    return once("node_registry", lambda: NodeRegistry(ScriptLoader(redis_client()), settings().node_timeout_s))


def node_stats() -> NodeStats:
    """The nodes' fetch statistics in this process's Redis."""
    return once("node_stats", lambda: NodeStats(redis_client()))


def node_stats_writer() -> NodeStatsWriter:
    """This process's fetch counters and where they are written (with each heartbeat of its node)."""
    return once("node_stats_writer", lambda: NodeStatsWriter(node_meter(), node_stats()))


def ring_view() -> RingView:
    """This process's view of the ring (read again at most every second)."""
    return once("ring_view", lambda: RingView(node_registry()))


def ring_queue(host: str) -> str | None:
    """The queue of ``host``'s ring node now (None: no ring node alive; use the shared queue)."""
    return ring_view().current().queue_of(host)


def ring_keeper(
    node_name: str | None, holdings: Holdings | None = None, pool_size: Callable[[], int] | None = None
) -> RingKeeper:
    """This worker's membership thread (not started): it beats as ``node_name`` (a ring node with
    ``VCRAWL_NODE_WEIGHT`` / ``VCRAWL_RING``, else a plain worker of weight 0) with its pool's size now
    (``pool_size``) and its fetch counters, says what it holds, watches for dead members and sweeps
    orphaned messages (with ``holdings``)."""

    def build() -> RingKeeper:
        current = settings()
        # A dead node's messages (and those its unacknowledged ones come back as, after the visibility
        # timeout) go to the shared queue; whoever takes one passes it on to its host's owner now.
        watcher = NodeWatcher(frontier(), node_registry(), runtimes(), _drain_to_shared_queue, alert=alert,
                              holdings=holdings)  # fmt: skip
        registration = registration_for(node_name, max(0, current.ring_weight)) if node_name else None
        beat_s = min(2.0, current.node_timeout_s / 5)

        def counters() -> dict[str, int]:
            return {**_process_counters(), "concurrency": pool_size() if pool_size is not None else 0}

        return RingKeeper(node_registry(), watcher, registration, beat_s, ring_view(), counters=counters,
                          holdings=holdings, stats=node_stats_writer())  # fmt: skip

    return once("ring_keeper", build)


def _drain_to_shared_queue(node_queue: str) -> int:
    """Move a dead ring node's queue onto the shared download queue (whichever broker holds them)."""
    if settings().amqp_broker:
        return amqp_move_queue(celery_app(), node_queue, DOWNLOAD_QUEUE)
    return move_queue(redis_client(), node_queue, DOWNLOAD_QUEUE)


def _process_counters() -> dict[str, int]:
    dns = dns_cache().stats()
    return {"connections_opened": connections_opened(), "dns_lookups": dns.lookups, "dns_hits": dns.hits}
