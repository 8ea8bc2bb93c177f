"""On RabbitMQ, the fetch batches each worker runs, said with each heartbeat: a dead member's leases go back.

RabbitMQ hands a closed connection's unacknowledged messages back itself, at once for a killed worker. The
copy of a fetch message that comes back then finds its batch started by the dead run (``start_lease`` says
"taken": a copy must not fetch while the first may still run, as after a broker restart) and does nothing.
Without a word of who ran it, the batch's lease, and its host, then waited until the lease ran out (a paced
batch's: 9 minutes at the shipped limits). So each worker, with each heartbeat (``RingKeeper``), writes the
task ids of the fetches it holds (running or reserved; they name their job and batches, ``fetch_task_id``),
and when it is declared down the watcher hands their leases back (``NodeWatcher``): their URLs go back to
the queue, as on the Redis broker. Nothing is put back on a queue here: the broker does that, when it
notices; ``restore`` sends again at once the analyses the dead member's messages stood for.

A bundle's refills (the hosts it leased for itself while it ran, ``tasks.broker.bundle_ledger``) go back
with it: ``held_by`` reads them from the bundle's ledger. Otherwise they waited for RabbitMQ to hand the
bundle's message back, which for a worker cut off by a partition is when RabbitMQ notices the silence:
2 to 3 heartbeats (60-90 s at the shipped node timeout), 30-60 s after the worker was declared down, with
the job held up meanwhile (measured in ``tests/faults/test_partition.py``: completed 84 s after the cut).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Collection
from types import SimpleNamespace
from typing import Any

from celery.worker import state as worker_state

from cluster.holdings import HeldMessage, Holder
from cluster.members import Membership
from engine.analyze_batch import ANALYSIS_ID_PREFIX
from engine.fetch_batch import BUNDLE_SEPARATOR, FETCH_ID_PREFIX
from frontier import Frontier
from tasks import batches, deps
from vcrawl import redis_keys
from vcrawl.redis_replies import text

__all__ = ["AmqpHoldings", "held_fetch_ids"]


def held_fetch_ids(requests: Collection[Any]) -> set[str]:
    """The task ids of the fetch and analysis requests among ``requests`` (Celery's ``Request`` objects)."""
    ids = {str(getattr(request, "id", "") or "") for request in requests}
    return {task_id for task_id in ids if task_id.startswith((FETCH_ID_PREFIX, ANALYSIS_ID_PREFIX))}


class AmqpHoldings:
    """The ``Holdings`` of a worker on RabbitMQ: which fetch batches it holds, in Redis; nothing to sweep."""

    def __init__(
        self,
        client: Callable[[], Any] | None = None,
        requests: Callable[[], Collection[Any]] | None = None,
        send_analysis: Callable[[dict[str, Any]], None] | None = None,
        frontier: Callable[[], Frontier] | None = None,
    ) -> None:
        """``requests``: the requests this worker holds now (Celery's worker state by default);
        ``send_analysis``: how an analysis is sent again (``tasks.batches.send_analysis``)."""
        self._client = client or deps.redis_client
        self._requests = requests or _worker_requests
        self._send_analysis = send_analysis or batches.send_analysis
        self._frontier = frontier or deps.frontier

    def report(self, name: str, at_ms: int, also: Collection[str] = ()) -> None:
        """Say which fetches and analyses this worker holds as of ``at_ms`` (the heartbeat just written, Redis
        clock); ``also``: a task id just received, not among Celery's requests yet."""
        held = held_fetch_ids(self._requests()) | held_fetch_ids([SimpleNamespace(id=task_id) for task_id in also])
        holder = Holder(name, at_ms, frozenset(held), os.getpid(), socket.gethostname())
        self._client().hset(redis_keys.HOLDERS, name, holder.to_json())

    def held_by(self, name: str) -> list[HeldMessage]:
        """The fetches member ``name`` said it holds (a task id stands for its message), with the batches each
        bundle among them leased for itself."""
        raw = self._client().hget(redis_keys.HOLDERS, name)
        if raw is None:
            return []
        try:
            holder = Holder.from_json(name, text(raw))
        except (ValueError, TypeError):
            return []  # written by a version this one cannot read: it claims nothing here
        task_ids = sorted(holder.tags)
        pipe = self._client().pipeline(transaction=False)
        for task_id in task_ids:
            pipe.smembers(redis_keys.bundle_ledger(task_id))
        refills = pipe.execute() if task_ids else []
        return [HeldMessage(task_id, task_id, "", tuple(sorted(text(batch_id) for batch_id in noted)))
                for task_id, noted in zip(task_ids, refills, strict=True)]  # fmt: skip

    def restore(self, tags: Collection[str]) -> int:
        """Send again now the analyses a dead member's messages stood for; return how many were sent.

        RabbitMQ hands the messages back itself, but only once it notices the connection is dead: at once
        for a killed worker, 60-90 s after a partition cut. Their fetch leases went back already
        (``NodeWatcher``); what would still wait for RabbitMQ is the analyses: those the member held, and
        those of the batches its fetches (bundles, with their refills) released but had not sent on yet.
        Each batch released and not admitted is sent once more (an analysis sent twice admits nothing twice).
        """
        frontier = self._frontier()
        sent = 0
        for job_id, batch_ids in self._batches_of(tags).items():
            for batch_id in batch_ids:
                if (handed := frontier.queue.handed_on(job_id, batch_id)) is not None:
                    self._send_analysis(handed)
                    sent += 1
        return sent

    def _batches_of(self, tags: Collection[str]) -> dict[str, list[str]]:
        """Job id -> the batches the held task ids name, a bundle's refills (its ledger) included."""
        found: dict[str, list[str]] = {}
        for tag in tags:
            prefix = next((p for p in (FETCH_ID_PREFIX, ANALYSIS_ID_PREFIX) if tag.startswith(p)), None)
            job_id, _, joined = tag.removeprefix(prefix or "").rpartition(":")
            if prefix is None or not job_id:
                continue
            refills = self._client().smembers(redis_keys.bundle_ledger(tag)) if prefix == FETCH_ID_PREFIX else ()
            found.setdefault(job_id, []).extend([*joined.split(BUNDLE_SEPARATOR), *(text(b) for b in refills)])
        return found

    def orphans(self, membership: Membership) -> list[HeldMessage]:
        """None: no message is off its queue unnoted on RabbitMQ."""
        return []

    def forget(self, name: str) -> None:
        self._client().hdel(redis_keys.HOLDERS, name)


def _worker_requests() -> list[Any]:
    return [*worker_state.requests.values(), *worker_state.active_requests, *worker_state.reserved_requests]
