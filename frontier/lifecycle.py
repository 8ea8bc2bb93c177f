"""A crawl job's life in Redis: created, running, paused, then completed, cancelled or failed.

The job's meta hash (``redis_keys.job``) holds its spec and state; the running set
(``redis_keys.JOBS_RUNNING``) is what the pumps look at. A scheduled job runs in cycles: each
firing of its schedule starts the next one (``new_cycle``), carrying its URL history over.
State changes that must not race a pump or a worker are one script each (``frontier/lua/``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from frontier.partitions import JobPartitions, placed_hosts
from frontier.records import CycleStart
from frontier.scripts import ScriptLoader, job_keys
from vcrawl import names, redis_keys
from vcrawl.redis_replies import text

__all__ = ["JobLifecycle"]


class JobLifecycle:
    """Create, cycle, pause, resume, cancel and fail jobs; read their state."""

    def __init__(self, scripts: ScriptLoader, partitions: JobPartitions | None = None) -> None:
        self._scripts = scripts
        self._redis = scripts.client
        self._parts = partitions if partitions is not None else JobPartitions(scripts)

    def create(self, job_id: str, spec_json: str, now: float, strategy: str = names.STRATEGY_BREADTH_FIRST,
               seeds: Sequence[str] = ()) -> bool:  # fmt: skip
        """Record a new running job (``strategy``: its spec's, for the frontier's scripts); False if the id is taken.

        On a Redis Cluster the job is split, one partition per primary (``frontier.partitions``), the
        hosts of its ``seeds`` dealt out over them; it cannot complete before ``JobPartitions.started`` (its
        seeds are admitted).
        """
        meta = redis_keys.job(job_id)
        if not self._redis.hsetnx(meta, names.META_SPEC, spec_json):
            return False
        fields = {names.META_STATE: names.STATE_RUNNING, names.META_CREATED_AT: now, names.META_PENDING: 0,
                  names.META_ADMITTED: 0, names.META_STRATEGY: strategy}  # fmt: skip
        parts = self._parts.plan(job_id)
        placed = placed_hosts(seeds) if len(parts) > 1 else []
        pipe = self._redis.pipeline(transaction=False)
        if len(parts) > 1:
            for part in parts[1:]:
                pipe.hset(redis_keys.job(part), mapping={**fields, names.META_PARTITIONED: 1})
            split = {names.META_PARTITIONS: json.dumps(parts), names.META_PARTITIONED: 1, names.META_STARTING: 1}
            fields = {**fields, **split}
            pipe.set(redis_keys.job_placed_hosts(job_id), json.dumps(placed, separators=(",", ":")))
        pipe.hset(meta, mapping=fields)
        pipe.zadd(redis_keys.JOBS, {job_id: now})
        pipe.sadd(redis_keys.JOBS_RUNNING, job_id)
        pipe.execute()
        self._parts.remember(job_id, parts, placed)
        return True

    def new_cycle(
        self,
        job_id: str,
        spec_json: str,
        *,
        firing: str,
        overlap: str = "skip",
        bloom_keys: Sequence[str] = (),
        cycles_kept: int = 100,
        strategy: str = names.STRATEGY_BREADTH_FIRST,
    ) -> CycleStart:
        """Start the next cycle of a scheduled job (creating the job on its first firing).

        ``firing`` identifies the schedule's firing: the same firing again resumes the cycle it
        started (a redelivered start). A firing while a cycle runs is skipped and counted, or with
        ``overlap="cancel"`` cancels that cycle first. ``bloom_keys``: the Bloom segments to clear;
        ``strategy``: the spec's, for the frontier's scripts.
        """
        keys = [
            *job_keys(job_id, "meta", "ready", "next", "busy", "leases"),
            redis_keys.job_admit_tokens(job_id),
            redis_keys.job_history(job_id),
            redis_keys.job_due(job_id),
            redis_keys.job_todo(job_id),
            redis_keys.job_cycles(job_id),
            redis_keys.job_delays(job_id),
            *job_keys(job_id, "queued_urls", "inlinks"),  # per cycle, like the Bloom filter
            *bloom_keys,
        ]
        args = _new_cycle_argv(
            firing=firing,
            spec_json=spec_json,
            overlap=overlap,
            qprefix=redis_keys.job_queue_prefix(job_id),
            cycles_kept=cycles_kept,
            strategy=strategy,
        )
        status, cycle, due = self._scripts.run("new_cycle", keys, args)
        result = CycleStart(text(status), int(cycle), int(due))
        if result.status in ("started", "resumed"):
            created_at = float(self._redis.hget(redis_keys.job(job_id), names.META_CREATED_AT) or 0)
            pipe = self._redis.pipeline(transaction=False)
            pipe.zadd(redis_keys.JOBS, {job_id: created_at})
            pipe.sadd(redis_keys.JOBS_RUNNING, job_id)
            pipe.execute()
        return result

    def cycle(self, job_id: str) -> int:
        """The job's current cycle (0: a one-off job)."""
        return int(self._redis.hget(redis_keys.job(job_id), names.META_CYCLE) or 0)

    def cycles(self, job_id: str) -> list[dict[str, object]]:
        """Summaries of the job's finished cycles, oldest first."""
        return [json.loads(raw) for raw in self._redis.lrange(redis_keys.job_cycles(job_id), 0, -1)]

    def finish_start(self, job_id: str, cycle: int) -> None:
        """Mark the start of ``cycle`` done (its seeds and due URLs are all admitted)."""
        self._scripts.run("finish_start", [redis_keys.job(job_id), redis_keys.job_todo(job_id)], [cycle])

    def cancel(self, job_id: str, now: float) -> bool:
        """Stop dispatching a running or paused job at once (``now`` in seconds); False if it was neither."""
        return self._stopped(job_id, self._on_each("cancel", job_id, [now]) == 1)

    def fail(self, job_id: str, error: str, now: float) -> bool:
        """Move a running or paused job to ``failed`` with ``error`` as the reason; False if it was neither.

        Dispatch stops as with ``cancel``: the next pump round forgets the job and drops its
        Bloom filter; batches in flight are handed back unfetched or stop before their next URL.
        """
        return self._stopped(job_id, self._on_each("fail", job_id, [now, error]) == 1)

    def _on_each(self, script: str, job_id: str, args: list[Any]) -> int:
        """Run a state change on the job's hash, then on each other partition of a split job; the job's answer."""
        answers = [int(self._scripts.run(script, [redis_keys.job(part)], args)) for part in self._parts.of(job_id)]
        return answers[0]

    def _stopped(self, job_id: str, stopped: bool) -> bool:
        """Put a job just cancelled or failed in the running set (a paused job had left it): the next
        pump round sees it stopped and forgets it, dropping its Bloom filter and URL index, whose keys
        only the pump knows. Its state is set first, so the pump never dispatches it again."""
        if stopped:
            self._redis.sadd(redis_keys.JOBS_RUNNING, job_id)
        return stopped

    def pause(self, job_id: str, now: float) -> bool:
        """Stop dispatching a running job until ``resume``; False if it was not running."""
        paused = self._on_each("pause", job_id, [now]) == 1
        self._redis.srem(redis_keys.JOBS_RUNNING, job_id)
        return paused

    def resume(self, job_id: str) -> str | None:
        """Dispatch a paused job again: ``"running"``, ``"completed"`` (nothing was left), or
        None if it was not paused."""
        code = self._on_each("resume", job_id, [])
        if code >= 1 and self._parts.split(job_id):  # a partition idle is not the job done
            code = 2 if self._parts.complete_if_quiet(job_id) else 1
        if code == 1:
            pipe = self._redis.pipeline(transaction=False)
            pipe.sadd(redis_keys.JOBS_RUNNING, job_id)
            pipe.lpush(redis_keys.FRONTIER_WAKE, 1)
            pipe.ltrim(redis_keys.FRONTIER_WAKE, 0, 63)
            pipe.execute()
        return {0: None, 1: names.STATE_RUNNING, 2: names.STATE_COMPLETED}[code]

    def update_spec(self, job_id: str, spec_json: str) -> int | None:
        """Replace a running or paused job's spec; return its new revision (None: not running).

        Workers pick the new spec up within ``RuntimeCache``'s recheck time. Its strategy stays
        (``engine.jobs.LIVE_KEYS``: it cannot change while the job runs).
        """
        revision = self._scripts.run("update_spec", [redis_keys.job(job_id)], [spec_json])
        return None if revision is None else int(revision)

    def spec_rev(self, job_id: str) -> int:
        """How many times the job's spec was changed while it ran."""
        return int(self._redis.hget(redis_keys.job(job_id), names.META_SPEC_REV) or 0)

    def is_running(self, job_id: str, cycle: int = 0) -> bool:
        """True while the job (in ``cycle``, for a scheduled job) is running: not paused, not finished."""
        state, current = self._redis.hmget(redis_keys.job(job_id), [names.META_STATE, names.META_CYCLE])
        return text(state) == names.STATE_RUNNING and (not cycle or int(current or 0) == cycle)

    def state_and_cycle(self, job_id: str) -> tuple[str | None, int]:
        """The job's state (None: unknown) and current cycle (0: a one-off job), in one round trip."""
        state, cycle = self._redis.hmget(redis_keys.job(job_id), [names.META_STATE, names.META_CYCLE])
        return (text(state) if state is not None else None), int(cycle or 0)

    def running_jobs(self) -> list[str]:
        """Ids of the jobs the pumps should look at."""
        return sorted(text(job) for job in self._redis.smembers(redis_keys.JOBS_RUNNING))

    def forget_if_stopped(self, job_id: str, filter_keys: Sequence[str] = ()) -> None:
        """Drop a job from the running set once its state says it is not running; once it has
        finished (completed, cancelled or failed), drop its Bloom filter (``filter_keys``) too."""
        if text(self._redis.hget(redis_keys.job(job_id), names.META_STATE)) != names.STATE_RUNNING:
            self._redis.srem(redis_keys.JOBS_RUNNING, job_id)
            if filter_keys:
                for part in self._parts.of(job_id):  # each partition's own filter (keys of its own tag)
                    segments = [redis_keys.job_bloom_segment(part, index) for index in range(len(filter_keys))]
                    own = segments if part != job_id else list(filter_keys)
                    keys = [redis_keys.job(part), *own, *job_keys(part, "queued_urls", "inlinks")]
                    self._scripts.run("drop_filter", keys, [])

    def raw_state(self, job_id: str) -> dict[str, str]:
        """The job hash as strings (spec, state, timestamps, counters)."""
        own = {text(k): text(v) for k, v in self._redis.hgetall(redis_keys.job(job_id)).items()}
        return self._parts.merged_state(job_id, own)  # a split job: its partitions' counters added

    def jobs(self, limit: int = 100) -> list[str]:
        """Job ids, newest first."""
        return [text(job) for job in self._redis.zrevrange(redis_keys.JOBS, 0, limit - 1)]


def _new_cycle_argv(
    *, firing: str, spec_json: str, overlap: str, qprefix: str, cycles_kept: int, strategy: str
) -> list[str | int]:
    """ARGV of ``new_cycle.lua``, in its order."""
    return [firing, spec_json, overlap, qprefix, cycles_kept, strategy]
