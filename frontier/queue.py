"""The Mercator-style frontier in Redis: per-host queues and a ready-time heap of hosts.

A job's URLs wait in one sorted set per host, scored by the job's strategy (``admit.lua``;
breadth-first: depth, then arrival).
A host is in the job's ``ready`` heap, scored with the time it may next be fetched,
while it has queued URLs and a free slot. Pumps pop due hosts atomically (Lua), lease
their URLs as a batch, and the fetch that ran the batch releases the lease, which sets
the host's next time. Every state change is one script (``frontier/lua/``), so any number
of pumps and workers on any number of machines keep it exact. All of a job's keys share
one hash tag, so the scripts also work on a Redis Cluster.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from frontier.history import UrlHistory
from frontier.partitions import PARTITION_MARK, JobPartitions
from frontier.records import Admission, AdmitRequest, Batch, BatchRelease, Candidate, Entry, PumpResult
from frontier.scripts import ScriptLoader, job_keys
from frontier.statistics import stats_day, stats_minute
from vcrawl import names, redis_keys
from vcrawl.redis_replies import text

__all__ = ["RENEWAL_HOLDS_S", "FrontierQueue"]

logger = logging.getLogger(__name__)

# Breadth-first score = depth * SCORE_DEPTH + arrival sequence: FIFO within a depth (admit.lua has the
# other strategies'). A requeue at the front of its depth: depth * SCORE_DEPTH (depth-first and
# priority jobs: release.lua gives it back the score it was leased with); at the back: plus
# SCORE_BACK_OF_QUEUE.
RENEWAL_HOLDS_S = 0.1
"""A lease renewal's yes holds this long: a bundle renews the batches due within it in one call
(``engine.fetch_bundle``); a hand-over keeps each host away that much longer than its pause."""
_ALREADY_RELEASED = -2  # release.lua: this release ran before (a retried call)


class FrontierQueue:
    """A job's URLs from admission to release: queue, lease as batches, requeue, reclaim."""

    def __init__(self, scripts: ScriptLoader, stats_ttl_s: int = 3 * 86400, day_stats_ttl_s: int = 90 * 86400,
                 partitions: JobPartitions | None = None) -> None:  # fmt: skip
        self._scripts = scripts
        self._redis = scripts.client
        self._parts = partitions if partitions is not None else JobPartitions(scripts)
        self._quiet_looked: dict[str, float] = {}  # split job -> when the pump last asked if it is done
        self._stats_ttl_s = stats_ttl_s  # how long per-minute statistics are kept
        self._day_stats_ttl_s = day_stats_ttl_s  # per-day ones: after their day

    def admit(self, job_id: str, request: AdmitRequest, wake: bool = True) -> Admission:
        """Dedup and queue candidates, apply counters, mark ``done`` URLs finished: one round trip
        (one per partition a split job's candidates fall in, the analysed batch's own last).
        ``wake``: wake a waiting pump when there are candidates (a paced job's pumps need not hurry)."""
        parts = self._parts.of(job_id)
        if len(parts) == 1:
            return self._admit_in(job_id, job_id, request, wake)
        owners = {self._parts.for_batch(job_id, batch_id) for batch_id, _ in request.analysed}
        if len(owners) > 1:
            raise ValueError(f"the batches one admission finishes must be of one partition, got {sorted(owners)}")
        own = owners.pop() if owners else job_id
        by_part: dict[str, list[Candidate]] = {}
        for candidate in request.candidates:
            by_part.setdefault(self._parts.for_host(job_id, candidate.host), []).append(candidate)
        share = -(-request.max_pages // len(parts))  # each partition stops at its share of the page limit
        idle, total = False, Admission(False, False, 0, 0, 0)
        for part, candidates in by_part.items():
            if part != own:  # links only: they are queued before the pages that found them are finished
                other = replace(request, candidates=candidates, max_pages=share, done=0, counters={}, history={},
                                token=f"{request.token}{PARTITION_MARK}{part}" if request.token else "",
                                analysed=())  # fmt: skip
                admission = self._admit_in(job_id, part, other, wake)
                idle, total = idle or admission.completed, _sum(total, admission)
        last = self._admit_in(job_id, own, replace(request, candidates=by_part.get(own, []), max_pages=share), wake)
        completed = (idle or last.completed) and self._parts.complete_if_quiet(job_id)
        return replace(_sum(total, last), completed=completed, repeated=last.repeated)

    def _admit_in(self, job_id: str, part: str, request: AdmitRequest, wake: bool) -> Admission:
        keys, args = _admit_call(part, request)
        reply = self._scripts.run_with_wake("admit", keys, args, wake=wake and bool(request.candidates))
        completed, fresh, duplicates, over, known, *rest = (int(x) for x in reply)
        if rest and rest[0]:
            logger.warning("job %s: %d of batches %s were released on a Redis primary whose last writes a failover "
                           "lost; their URLs are fetched and finished again", job_id, rest[0],
                           " ".join(batch_id for batch_id, _ in request.analysed))  # fmt: skip
        # A completed job leaves the running set on the next pump round (forget_if_stopped).
        return Admission(completed == 1, completed < 0, fresh, duplicates, over, known)  # -2: another cycle

    def pump(
        self,
        job_id: str,
        *,
        max_batches: int,
        batch_size: int,
        per_host: int,
        interval_ms: float,
        lease_ms: float,
        cap: int,
        ahead_ms: float = 0.0,
        owner: str = "",
    ) -> PumpResult:
        """Lease due hosts' URLs as batches (at most ``cap`` batches in flight per job, per partition of a
        split job).

        ``ahead_ms``: hosts due that much later are leased too, each batch saying in how many seconds
        its host is due (``Batch.due_in_s``): its caller must not start it earlier. ``owner``: the
        leases are started by that run (``start_lease``), each at its host's due time.
        """
        shape = {
            "max_batches": max_batches,
            "batch_size": batch_size,
            "per_host": per_host,
            "interval_ms": interval_ms,
            "lease_ms": lease_ms,
            "cap": cap,
            "ahead_ms": ahead_ms,
            "owner": owner,
        }
        parts = self._parts.of(job_id)
        results = [self._pump_in(job_id, part, **shape) for part in parts]  # type: ignore[arg-type]
        if results[0].stopped or len(results) == 1:  # a split job's state is its own hash's
            return results[0]
        dues = [result.next_due_s for result in results if result.next_due_s is not None]
        batches = tuple(batch for result in results for batch in result.batches)
        if not batches and not dues and time.monotonic() - self._quiet_looked.get(job_id, -60.0) >= 2.0:
            self._quiet_looked[job_id] = time.monotonic()  # at most every 2 s: most such rounds have URLs in flight
            if self._parts.complete_if_quiet(job_id):  # e.g. its last URLs failed in a reclaim
                return PumpResult((), None, stopped=True)
        return PumpResult(batches, min(dues) if dues else None)

    def _pump_in(self, job_id: str, part: str, *, max_batches: int, batch_size: int, per_host: int,
                 interval_ms: float, lease_ms: float, cap: int, ahead_ms: float, owner: str) -> PumpResult:  # fmt: skip
        args = _pump_argv(
            max_batches=max_batches,
            batch_size=batch_size,
            per_host=per_host,
            interval_ms=interval_ms,
            lease_ms=lease_ms,
            cap=cap,
            qprefix=redis_keys.job_queue_prefix(part),
            ahead_ms=ahead_ms,
            owner=owner,
            suffix=self._parts.batch_suffix(job_id, part),
        )
        keys = job_keys(part, "meta", "ready", "busy", "leases", "delays", "queued_urls", "inlinks")
        raw = self._scripts.run("pump", keys, args)
        head, now, cycle = text(raw[0]), float(text(raw[1])), int(text(raw[2]))
        if head == "stopped":
            return PumpResult((), None, stopped=True)
        batches = tuple(
            Batch(
                text(raw[i]),
                text(raw[i + 1]),
                tuple(Entry.decode(e) for e in json.loads(text(raw[i + 2]))),
                cycle,
                paced=text(raw[i + 3]) == "1",
                due_in_s=max(0.0, (float(text(raw[i + 4])) - now) / 1000),
            )
            for i in range(3, len(raw), 5)
        )
        next_due = float(head)
        return PumpResult(batches, None if next_due < 0 else (next_due - now) / 1000)

    def start_lease(self, job_id: str, batch_id: str, lease_ms: float, token: str = "", host: str = "") -> str:
        """Mark a batch as started by the run ``token``: ``"go"`` (its lease now runs from here),
        ``"stale"`` (the lease ran out and its URLs were requeued: do nothing), ``"stopped"`` (the job
        is not running), ``"taken"`` (another run with another token started it: a second copy
        of the batch's message, delivered while the first still runs; do nothing) or, given the
        batch's ``host``, ``"held"`` (the host is held, ``hold_host``: give the batch back).
        """
        part = self._parts.for_batch(job_id, batch_id)
        keys = [redis_keys.job(part), redis_keys.job_leases(part), redis_keys.job_holds(part)]
        code = int(self._scripts.run("start_lease", keys, [batch_id, lease_ms, token, host]))
        return {0: "stale", 1: "go", 2: "stopped", 3: "taken", 4: "held"}[code]

    def hold_host(self, job_id: str, host: str, hold_s: float) -> float:
        """Hold ``host`` for ``hold_s`` from now (Redis time): no batch of it is leased or started
        until then, and every worker process is told at once (``frontier.holds``). A longer hold
        already there stays. Returns the hold's end (seconds, Redis time)."""
        part = self._parts.for_host(job_id, host)
        keys = [redis_keys.job_ready(part), redis_keys.job_next(part), redis_keys.job_holds(part)]
        hold_ms = max(1, round(hold_s * 1000))
        message = json.dumps({"job": job_id, "host": host, "ms": hold_ms}, separators=(",", ":"))
        return int(self._scripts.run("hold", keys, [host, hold_ms, redis_keys.holds_channel(), message])) / 1000

    def renew_lease(self, job_id: str, batch_id: str, cycle: int = 0, token: str = "") -> str:
        """Before a paced batch's next request: ``"go"`` (its lease is still held by the run ``token``;
        its deadline stays), ``"stale"`` (the lease is gone: fetch no more), ``"stopped"``
        (the job is not running in ``cycle``: hand the rest back) or ``"taken"`` (another run owns
        it: fetch no more, release nothing). A write, so a fenced or demoted primary cannot say yes."""
        return self.renew_leases(job_id, [(batch_id, cycle, token)])[0]

    def renew_leases(self, job_id: str, batches: Sequence[tuple[str, int, str]]) -> list[str]:
        """``renew_lease`` for several batches (batch id, cycle, token) of one job, in one call: their answers."""
        by_part: dict[str, list[int]] = {}  # partition -> indexes of its batches
        for index, (batch_id, _, _) in enumerate(batches):
            by_part.setdefault(self._parts.for_batch(job_id, batch_id), []).append(index)
        answers = [""] * len(batches)
        for part, indexes in by_part.items():
            keys = [redis_keys.job(part), redis_keys.job_leases(part), redis_keys.job_renewals(part)]
            args = [value for index in indexes for value in batches[index]]
            for index, code in zip(indexes, self._scripts.run("renew_leases", keys, args), strict=True):
                answers[index] = {0: "stale", 1: "go", 2: "stopped", 3: "taken"}[int(code)]
        return answers

    def holds_lease(self, job_id: str, batch_id: str) -> bool:
        """True while the batch's lease is held: not reclaimed, not handed over to another worker, not released."""
        return bool(self._redis.hexists(redis_keys.job_leases(self._parts.for_batch(job_id, batch_id)), batch_id))

    def release(self, job_id: str, batch: Batch, release: BatchRelease, wake: bool = True) -> bool | None:
        """End a batch's lease: requeue entries, count, set the host's next time (see ``BatchRelease``).
        ``wake``: wake a waiting pump (not needed when the caller leases its job's next hosts itself).

        Returns True if this completed the job, False if not (also when this very release already
        ran: a retried call whose first reply was lost), None if the lease was gone (reclaimed:
        nothing is counted twice).
        """
        now = time.time()
        part = self._parts.for_batch(job_id, batch.batch_id)
        keys = [
            *job_keys(part, "meta", "ready", "next", "busy", "leases"),
            redis_keys.job_queue(part, batch.host),
            redis_keys.job_delays(part),
            redis_keys.job_history(part),
            redis_keys.job_due(part),
            redis_keys.job_stats_bucket(part, stats_minute(now)),
            redis_keys.job_host_stats(part),
            redis_keys.job_failures(part),
            redis_keys.job_released(part),
            redis_keys.job_day_stats(part, stats_day(now)),
            redis_keys.job_day_host_stats(part, stats_day(now)),
            *job_keys(part, "queued_urls"),
            redis_keys.job_holds(part),
        ]
        # Each bucket's TTL is set when a counter of it starts (release.lua): counted from its end, not then.
        args = _release_argv(batch, release, self._stats_ttl_s + 60, self._day_ttl_s(now))
        # A finished batch frees a slot (and maybe requeued URLs): wake a waiting pump. A paced host's
        # too, unless a bundle leased it ahead: measured, the pump then starts the bundles that keep
        # 200 paced hosts busy (427 pages/s, 209 without this wake, bench/polite.py).
        result = int(self._scripts.run_with_wake("release", keys, args, wake=wake))
        if result == _ALREADY_RELEASED:
            return False
        if result == 1 and self._parts.split(job_id):
            return self._parts.complete_if_quiet(job_id)  # a partition idle: the job completed if all are
        return None if result < 0 else result == 1  # completed: the pump forgets it next round

    def released_batches(self, job_id: str) -> list[str]:
        """The batches released and handed to an analysis that has not admitted them yet."""
        return [text(batch_id) for part in self._parts.of(job_id)
                for batch_id in self._redis.hkeys(redis_keys.job_released(part))]  # fmt: skip

    def handed_on(self, job_id: str, batch_id: str) -> dict[str, Any] | None:
        """What a released batch handed to its analysis, while that analysis has not admitted it."""
        raw = self._redis.hget(redis_keys.job_released(self._parts.for_batch(job_id, batch_id)), batch_id)
        return None if raw is None else json.loads(raw)

    def _day_ttl_s(self, now: float) -> int:
        """A day bucket's TTL set at ``now``: the retention, counted from the end of that UTC day."""
        return self._day_stats_ttl_s + 86400 - int(now % 86400)

    def reclaim_expired(self, job_id: str, max_attempts: int, interval_ms: float) -> tuple[int, int]:
        """Requeue the URLs of batches whose lease ran out; fail those out of attempts.

        Returns (requeued, failed).
        """
        now = time.time()
        day = stats_day(now)
        requeued, failed = 0, 0
        for part in self._parts.of(job_id):
            keys = [*job_keys(part, "meta", "ready", "next", "busy", "leases"), redis_keys.job_day_stats(part, day),
                    redis_keys.job_day_host_stats(part, day), *job_keys(part, "queued_urls")]  # fmt: skip
            args = [redis_keys.job_queue_prefix(part), max_attempts, interval_ms, self._day_ttl_s(now)]  # ARGV 1-4
            back, lost = self._scripts.run("reclaim", keys, args)
            requeued, failed = requeued + int(back), failed + int(lost)
        return requeued, failed

    def leased_hosts(self, job_id: str) -> dict[str, str]:
        """Batch id -> host of every batch leased and not yet released."""
        leased: dict[str, str] = {}
        for part in self._parts.of(job_id):
            raw = self._redis.hgetall(redis_keys.job_leases(part))
            leased.update({text(batch_id): json.loads(lease)["h"] for batch_id, lease in raw.items()})
        return leased

    def hand_over(self, job_id: str, batch_ids: list[str], interval_ms: float) -> int:
        """Requeue the URLs of batches sent to a ring node that went down; return how many.

        No attempt is counted (the node failed, not the URL); each host waits its interval, or
        its Crawl-delay, from now: the dead node may have just sent it a request.
        """
        by_part: dict[str, list[str]] = {}
        for batch_id in batch_ids:
            by_part.setdefault(self._parts.for_batch(job_id, batch_id), []).append(batch_id)
        requeued = 0
        for part, ids in by_part.items():
            keys = job_keys(part, "meta", "ready", "next", "busy", "leases", "delays", "queued_urls")
            # A live batch may still make a request on a renewal it got just before (RENEWAL_HOLDS_S).
            args = [redis_keys.job_queue_prefix(part), interval_ms + RENEWAL_HOLDS_S * 1000, *ids]
            requeued += int(self._scripts.run_with_wake("hand_over", keys, args, wake=True))
        return requeued

    def known_hosts(self, job_id: str) -> set[str]:
        """Every host the job has admitted URLs of (fetched or not yet)."""
        pipe = self._redis.pipeline(transaction=False)
        for part in self._parts.of(job_id):
            pipe.hkeys(redis_keys.job_next(part))
            pipe.hkeys(redis_keys.job_delays(part))
        return {text(host) for hosts in pipe.execute() for host in hosts}

    def in_flight(self, job_id: str) -> int:
        """Batches leased and not yet released."""
        return sum(int(self._redis.hlen(redis_keys.job_leases(part))) for part in self._parts.of(job_id))

    def wait_for_work(self, timeout_s: float) -> None:
        """Block until URLs are admitted somewhere or ``timeout_s`` passes."""
        self._redis.blpop([redis_keys.FRONTIER_WAKE], timeout=max(0.01, timeout_s))


def _admit_call(job_id: str, request: AdmitRequest) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``admit.lua`` (documented at its top)."""
    bloom = request.bloom
    hosts: dict[str, int] = {}  # host -> its index among the queue keys
    segments: dict[str, int] = {}  # Bloom segment key -> its index among the segment keys
    urls: list[str | int | float] = []
    for candidate in request.candidates:
        segment, offsets = bloom.locate(candidate.entry.url)
        key = bloom.keys[segment]
        if f"{{{job_id}}}" not in key:  # a partition of a split job: its own filter, of the same shape
            key = redis_keys.job_bloom_segment(job_id, segment)
        urls.extend(
            (
                segments.setdefault(key, len(segments) + 1),
                hosts.setdefault(candidate.host, len(hosts) + 1),
                candidate.entry.depth,
                round(candidate.priority * 100),  # hundredths: exact in the score (admit.lua)
                candidate.entry.encode(),
                *offsets,
            )
        )
    keys = [*job_keys(job_id, "meta", "ready", "next", "busy"), redis_keys.job_admit_tokens(job_id)]
    keys.extend(segments)
    keys.extend(redis_keys.job_queue(job_id, host) for host in hosts)
    keys.extend((redis_keys.job_delays(job_id), redis_keys.job_history(job_id), redis_keys.job_due(job_id)))
    keys.extend(job_keys(job_id, "queued_urls", "inlinks"))
    keys.append(redis_keys.job_released(job_id))
    counters, history = _counter_args(request.counters), _history_args(request.history)
    head = {  # ARGV 1-10, in admit.lua's order
        "max_pages": request.max_pages,
        "per_host": request.per_host,
        "done": request.done,
        "token": request.token,
        "hashes": bloom.hashes,
        "n_segments": len(segments),
        "n_counters": len(counters) // 2,
        "history_mode": request.history_mode,
        "cycle": request.cycle,
        "n_history": len(history) // 3,
    }
    analysed = " ".join(f"{batch_id} {done}" for batch_id, done in request.analysed)
    return keys, [*head.values(), *counters, *history, len(hosts), *hosts, *urls, analysed]


def _pump_argv(
    *, max_batches: int, batch_size: int, per_host: int, interval_ms: float, lease_ms: float, cap: int, qprefix: str,
    ahead_ms: float = 0.0, owner: str = "", suffix: str = "",
) -> list[Any]:  # fmt: skip
    """ARGV of ``pump.lua``, in its order (a fresh nonce for the batch ids each call, ending with the
    partition's ``suffix``)."""
    nonce = secrets.token_hex(3) + suffix
    return [max_batches, batch_size, per_host, interval_ms, lease_ms, cap, qprefix, nonce, int(ahead_ms), owner]


def _release_argv(batch: Batch, release: BatchRelease, stats_ttl_s: int, day_ttl_s: int) -> list[Any]:
    """ARGV of ``release.lua`` (documented at its top)."""
    requeue: list[str | float] = []
    for entry in release.requeue:  # at the front of their depth: next in line
        requeue.extend((entry.depth * names.SCORE_DEPTH, entry.encode()))
    for entry in release.requeue_back:  # behind everything the host has queued
        requeue.extend((names.SCORE_BACK_OF_QUEUE + entry.depth * names.SCORE_DEPTH, entry.encode()))
    history = _history_args(release.history)
    failures = [json.dumps(failure, separators=(",", ":")) for failure in release.failures]
    head = {  # ARGV 1-14, in release.lua's order
        "batch_id": batch.batch_id,
        "host": batch.host,
        "pause_ms": int(release.pause_ms),
        "host_delay_ms": int(release.host_delay_ms),
        "done": release.done,
        "crawl_delay_ms": int((release.crawl_delay_s or 0) * 1000) if release.fetched else -1,
        "n_requeue": len(release.requeue) + len(release.requeue_back),
        "n_history": len(history) // 3,
        "bucket_ttl_s": stats_ttl_s,
        "n_failures": len(failures),
        "host_done": release.host_done,
        "handed_on": release.handed_on,
        "throttle": release.throttle,
        "day_ttl_s": day_ttl_s,
    }
    return [*head.values(), *requeue, *history, *failures, *_counter_args(release.counters)]


def _history_args(history: Mapping[str, UrlHistory]) -> list[str | float]:
    args: list[str | float] = []
    for url, record in history.items():
        args.extend((url, record.encode(), record.due_s()))
    return args


def _counter_args(counters: Mapping[str, int]) -> list[str | int]:
    args: list[str | int] = []
    for name, value in counters.items():
        if value:
            args.extend((name, value))
    return args


def _sum(a: Admission, b: Admission) -> Admission:
    return Admission(a.completed or b.completed, a.repeated or b.repeated, a.admitted + b.admitted,
                     a.duplicates + b.duplicates, a.over_limit + b.over_limit, a.not_due + b.not_due)  # fmt: skip
