"""A bundle of paced hosts' fetch batches, run in one task: while one host waits its pace, the others fetch.

A paced host's batch holds several of its URLs, fetched one pause apart (``engine.fetch_batch``).
Run alone, such a batch would keep a worker process waiting most of the time; a bundle runs the
batches of many hosts side by side in one task, always the one whose next request is due first,
so a process fetches as fast as with politeness off while every host keeps its pace. Each batch
keeps its own lease and release, as if it had come alone; the batches released within a moment
of each other go to analysis together (``AnalysisGatherer``): their links are admitted in one
call per partition they reach, not one per batch and partition.
"""

from __future__ import annotations

import heapq
import itertools
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from engine.crawl_env import CrawlEnv
from engine.fetch_batch import StartedFetch, finish_fetch, start_fetch
from engine.redis_wait import ride_out
from frontier import Batch
from frontier.partitions import batch_partition
from frontier.queue import RENEWAL_HOLDS_S
from telemetry.log_context import log_context

__all__ = ["AnalysisGatherer", "run_fetch_bundle"]


REFILL_EVERY_S = 0.05
"""While its batches wait, a bundle asks the frontier for more due hosts at most this often."""
REFILL_MOST_WAIT_S = 0.25
"""A refill that found no due host says when the next one is due; the bundle asks again then, or
after this at most (a newly admitted host is due at once)."""
REFILL_AHEAD_S = 0.25
"""A refill leases the hosts due within this much too, each started at its due time: one frontier
call for all the hosts falling due meanwhile, not one per host."""
REFILL_IDLE_S = 0.02
"""A bundle asks for more due hosts when its next request is at least this far away."""


GATHER_MOST_BATCHES = 8
"""Released batches whose analyses a bundle sends together at most."""
GATHER_MOST_S = 0.5
"""How long a released batch waits at most for others to go to analysis with it: links found
later are admitted later (a breadth-first crawl meets its next level later), by this much."""


class AnalysisGatherer:
    """What released batches hand to analysis, gathered by partition (an admission finishes the
    batches of one partition: ``frontier.queue.admit``) and sent together (``send``, given one or
    more hand-overs): when ``most`` are there, when the first has waited ``most_s`` (``send_due``,
    called as the bundle goes round), and at the bundle's end (``send_all``). What a release hands
    on stays in the frontier until analysed: a bundle that dies first loses none of it
    (``tasks.broker.lost_analyses`` sends it)."""

    def __init__(self, send: Callable[[list[dict[str, Any]]], None], clock: Callable[[], float] = time.monotonic,
                 most: int = GATHER_MOST_BATCHES, most_s: float = GATHER_MOST_S) -> None:  # fmt: skip
        self._send, self._clock, self._most, self._most_s = send, clock, most, most_s
        # (cycle, partition) -> (when its first came, its hand-overs)
        self._groups: dict[tuple[int, str], tuple[float, list[dict[str, Any]]]] = {}

    def add(self, result: dict[str, Any]) -> None:
        """Gather a released batch's hand-over (one with nothing to analyse is not sent)."""
        if not (result.get("pages") or result.get("redirects")):
            return
        key = (int(result.get("cycle") or 0), batch_partition(str(result.get("batch", ""))))
        group = self._groups.setdefault(key, (self._clock(), []))[1]
        group.append(result)
        if len(group) >= self._most:
            self._send(self._groups.pop(key)[1])

    def send_due(self) -> None:
        """Send each group whose first hand-over has waited long enough."""
        now = self._clock()
        for key in [key for key, (since, _) in self._groups.items() if now - since >= self._most_s]:
            self._send(self._groups.pop(key)[1])

    def send_all(self) -> None:
        """Send everything gathered."""
        while self._groups:
            self._send(self._groups.pop(next(iter(self._groups)))[1])


class _Renewals:
    """A bundle's lease renewals: a batch about to make a request renews its lease together with every
    batch whose next request is due within ``RENEWAL_HOLDS_S`` (one frontier call for them all); a
    yes holds that long, any other answer for good."""

    def __init__(self, env: CrawlEnv, job_id: str, due_by: Callable[[float], list[StartedFetch]]) -> None:
        self._env, self._job_id, self._due_by = env, job_id, due_by
        self._answers: dict[str, tuple[str, float]] = {}  # batch id -> (answer, asked at)

    def held(self, batch: Batch, token: str) -> str:
        now = self._env.clock()
        answer, asked_at = self._answers.get(batch.batch_id, ("", 0.0))
        if answer and (answer != "go" or now - asked_at <= RENEWAL_HOLDS_S):
            return answer
        group = {batch.batch_id: (batch.cycle, token)}
        for started in self._due_by(now + RENEWAL_HOLDS_S):
            group.setdefault(started.batch.batch_id, (started.batch.cycle, started.token))
        items = [(batch_id, cycle, owner) for batch_id, (cycle, owner) in group.items()]
        renew = partial(self._env.frontier.queue.renew_leases, self._job_id, items)
        for (batch_id, _, _), code in zip(items, ride_out(renew, f"renewal of {len(items)} batch(es)"), strict=True):
            self._answers[batch_id] = (code, now)  # asked before the call: held from then on
        return self._answers[batch.batch_id][0]

    def forget(self, batch: Batch) -> None:
        self._answers.pop(batch.batch_id, None)


def run_fetch_bundle(
    env: CrawlEnv,
    job_id: str,
    batches: Sequence[Batch],
    budget_s: float,
    refill: Callable[[str], tuple[Sequence[Batch], float | None, bool]] = lambda _owner: ((), None, False),
    refill_span_s: float = 0.0,
    finished: Callable[[dict[str, Any]], None] = lambda _: None,
    unfinished: list[Batch] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    going_round: Callable[[], None] = lambda: None,
) -> list[dict[str, Any]]:
    """Fetch the batches side by side, each at its host's pace; release each; return what each hands
    to analysis, in the order they finished. No request starts after ``budget_s``: what is left is
    handed back with its batch's release (a task's time is bounded).

    While its batches wait their pace, the bundle leases more due batches of its job (``refill``, given
    this run's owner token: the batches, each due ``Batch.due_in_s`` from now, in how many seconds the
    next host is due, and whether their leases are started for that owner already), up to
    ``refill_span_s`` (a batch's longest span) before its budget ends: a worker process stays
    busy with as many hosts as keep it so, not with the few one pump call found due. ``finished``
    gets each batch's result as soon as it is released (its analysis need not wait for the bundle).
    When a batch raises, the batches not released yet are added to ``unfinished`` (to hand back).
    ``going_round`` is called each time round (e.g. ``AnalysisGatherer.send_due``).
    """
    with log_context(job=job_id):
        stop_at = env.clock() + budget_s
        results: list[dict[str, Any]] = []
        due: list[tuple[float, int, StartedFetch]] = []  # (not before, order, batch): the earliest first
        order = itertools.count()
        owner = uuid.uuid4().hex  # the run the refills' leases are started for
        renewals = _Renewals(env, job_id, lambda until: [started for at, _, started in due if at <= until])

        def add(new: Sequence[Batch], started_for: str = "") -> None:
            for batch in new:
                result, started = start_fetch(env, job_id, batch, stop_at, started_for, renewals.held)
                if started is None:
                    results.append(result)
                    finished(result)
                else:
                    heapq.heappush(due, (env.clock() + batch.due_in_s, next(order), started))

        add(batches)
        refill_at = env.clock() + REFILL_EVERY_S
        stepping: StartedFetch | None = None
        try:
            while due:
                going_round()
                now = env.clock()
                refilling = now < stop_at - refill_span_s
                if refilling and due[0][0] - now >= REFILL_IDLE_S and now >= refill_at:
                    more, next_due_s, started_for_owner = refill(owner)
                    add(more, owner if started_for_owner else "")
                    # Ask again when the next host not leased yet is due, less what a call leases
                    # ahead (none waits: the longest).
                    wait_s = REFILL_MOST_WAIT_S if next_due_s is None else next_due_s - REFILL_AHEAD_S
                    refill_at = now + min(REFILL_MOST_WAIT_S, max(REFILL_EVERY_S, wait_s))
                    continue
                if (wait := due[0][0] - now) > 0:  # the next request is not due yet
                    sleep(min(wait, REFILL_EVERY_S) if refilling else wait)
                    continue
                _, rank, started = heapq.heappop(due)
                stepping = started  # out of the heap while it fetches: handed back too if it raises
                try:
                    heapq.heappush(due, (next(started.steps), rank, started))
                except StopIteration as done:
                    try:
                        results.append(finish_fetch(env, started, done.value))
                    finally:
                        started.discard()
                        renewals.forget(started.batch)
                    finished(results[-1])
                stepping = None
        except BaseException:
            if unfinished is not None:
                unfinished.extend([stepping.batch] if stepping is not None else [])
                unfinished.extend(started.batch for _, _, started in due)
            raise
        finally:
            for _, _, started in due:  # an error in one batch: the others are fetched again
                started.discard()
            if stepping is not None:
                stepping.discard()
        return results
