"""What a fetch bundle leased for itself, kept under its message until the run ends: a redelivered bundle
takes over what its dead run left.

A bundle (``engine.fetch_bundle``) leases more due hosts while its batches wait their pace. Those
refills are in no message: a worker killed mid-bundle leaves their leases held until they run out
(minutes), and the batches it released but whose analyses it had not sent yet (``AnalysisGatherer``
sends them together, half a second later) pending for good. On Redis's broker the watchdogs find
both (``tasks.broker.lost_fetches``, ``lost_analyses``), looking for their messages in kombu's lists.
RabbitMQ's queues cannot be read that way, but it hands the dead run's bundle message back at once.
So each refill's batch ids are noted under the bundle's task id (its message's), and a run that finds
a note at its start took over a dead run: the leases still held go back to the frontier (each host
waits its interval), and the released batches not admitted yet have their analyses sent (an analysis
sent twice admits nothing twice). The note goes when the run ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from frontier import Frontier
from vcrawl import redis_keys
from vcrawl.redis_replies import text

__all__ = ["BundleLedger"]

logger = logging.getLogger(__name__)


class BundleLedger:
    """The refills of one bundle message (``task_id``) of ``job_id``, in Redis for ``keep_s`` at most."""

    def __init__(self, client: Any, frontier: Frontier, job_id: str, task_id: str, keep_s: float,
                 enabled: bool = True) -> None:  # fmt: skip
        """``enabled`` False: every call does nothing (Redis's broker, whose watchdogs find both)."""
        self._on = enabled
        self._client = client
        self._frontier = frontier
        self._job_id = job_id
        self._key = redis_keys.bundle_ledger(task_id)
        self._keep_ms = int(keep_s * 1000)

    def note(self, batch_ids: Iterable[str]) -> None:
        """Note batches this run leased for itself (before it fetches any of them)."""
        ids = list(batch_ids) if self._on else []
        if ids:
            pipe = self._client.pipeline(transaction=False)
            pipe.sadd(self._key, *ids)
            pipe.pexpire(self._key, self._keep_ms)
            pipe.execute()

    def take_over(self, interval_ms: float, send_analysis: Callable[[dict[str, Any]], None]) -> tuple[int, int]:
        """What an earlier run of this message noted and left: hand back its leases, send its unsent analyses.

        Returns (batches handed back, analyses sent).
        """
        noted = sorted(text(batch_id) for batch_id in self._client.smembers(self._key)) if self._on else []
        if not noted:
            return 0, 0
        queue = self._frontier.queue
        leased = queue.leased_hosts(self._job_id)
        held = [batch_id for batch_id in noted if batch_id in leased]
        if held:
            queue.hand_over(self._job_id, held, interval_ms)
        sent = 0
        for batch_id in noted:
            if batch_id not in leased and (handed := queue.handed_on(self._job_id, batch_id)) is not None:
                send_analysis(handed)
                sent += 1
        self.close()
        if held or sent:
            logger.warning("job %s: a bundle's earlier run stopped: %d leased batch(es) handed back, %d analysis(es) "
                           "sent", self._job_id, len(held), sent)  # fmt: skip
        return len(held), sent

    def close(self) -> None:
        """The run ended: what it leased is released or handed back by itself."""
        if self._on:
            self._client.delete(self._key)
