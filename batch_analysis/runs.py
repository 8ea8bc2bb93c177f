"""The state of batch analysis runs in Redis: what the CLI's progress line and the dashboard show.

One hash per run (analyzer, kind, state, chunks, result, error, times), a set of the chunks whose
map finished (a redelivered map adds its index once), and a sorted set of a job's runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from batch_analysis.lookout import LookPolicy
from vcrawl import names, redis_keys
from vcrawl.redis_replies import text

__all__ = ["RUN_STATES", "AnalysisRuns"]

RUN_STATES = (names.RUN_RUNNING, names.RUN_DONE, names.RUN_FAILED)
_INT_FIELDS = frozenset({"chunks", "urls", "pages", "cycle", "chunk_size"})
_FLOAT_FIELDS = frozenset({"started_at", "finished_at", "created_at", "reducing_at", "progress_at", "sent_at",
                           "looked_at", "look_every", "resent_at", "reduce_sent_at"})  # fmt: skip


class AnalysisRuns:
    """Reads and writes the runs of batch analysis and replay."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def create(self, job_id: str, run_id: str, fields: Mapping[str, Any], now: float) -> None:
        """Record a run that is starting (``fields``: analyzer, kind, chunks, urls, ...)."""
        values = {key: "" if value is None else value for key, value in fields.items()}
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(
            redis_keys.analysis_run(job_id, run_id), mapping={**values, "state": names.RUN_RUNNING, "started_at": now}
        )
        pipe.zadd(redis_keys.job_analyses(job_id), {run_id: now})
        pipe.sadd(redis_keys.analyses_running(), f"{job_id}\t{run_id}")
        pipe.execute()

    def chunk_done(self, job_id: str, run_id: str, index: int, now: float) -> None:
        """Count chunk ``index`` as mapped (idempotent)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.sadd(redis_keys.analysis_chunks_done(job_id, run_id), index)
        pipe.hset(redis_keys.analysis_run(job_id, run_id), "progress_at", now)
        pipe.execute()

    def sent(self, job_id: str, run_id: str, now: float) -> None:
        """Note that the run's chord is wholly sent (every map message published)."""
        self._redis.hset(redis_keys.analysis_run(job_id, run_id), "sent_at", now)

    def touched(self, job_id: str, run_id: str, now: float) -> None:
        """Note progress without a chunk (a recovery just sent the reduce)."""
        self._redis.hset(redis_keys.analysis_run(job_id, run_id), "progress_at", now)

    def looked(self, job_id: str, run_id: str, now: float, every_s: float) -> None:
        """Note a look for lost messages, and how long until the next one while nothing moves."""
        self._redis.hset(redis_keys.analysis_run(job_id, run_id), mapping={"looked_at": now, "look_every": every_s})

    def resending(self, job_id: str, run_id: str, now: float) -> None:
        """Note that maps are sent again outside the chord: its own reduce may never come."""
        self._redis.hset(redis_keys.analysis_run(job_id, run_id), "resent_at", now)

    def claim_reduce(self, job_id: str, run_id: str, now: float) -> bool:
        """True for the one caller that may send the reduce of a run whose maps were sent again."""
        return bool(self._redis.hsetnx(redis_keys.analysis_run(job_id, run_id), "reduce_sent_at", now))

    def due(self, now: float, policy: LookPolicy) -> list[tuple[str, str]]:
        """Runs still running that ``policy`` says to look at now; runs no longer running leave the set."""
        due = []
        for member in self._redis.smembers(redis_keys.analyses_running()):
            job_id, _, run_id = text(member).partition("\t")
            run = self.get(job_id, run_id)
            if run is None or run.get("state") != names.RUN_RUNNING:
                self._redis.srem(redis_keys.analyses_running(), member)
                continue
            if policy.is_due(run, now):
                due.append((job_id, run_id))
        return due

    def reducing(self, job_id: str, run_id: str, now: float) -> None:
        """Note that the run's reduce has begun."""
        self._redis.hset(redis_keys.analysis_run(job_id, run_id), "reducing_at", now)

    def finish(self, job_id: str, run_id: str, result: str, now: float) -> None:
        """Record the run's result location."""
        key = redis_keys.analysis_run(job_id, run_id)
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(key, mapping={"state": names.RUN_DONE, "result": result, "finished_at": now, "error": ""})
        pipe.srem(redis_keys.analyses_running(), f"{job_id}\t{run_id}")
        pipe.execute()

    def fail(self, job_id: str, run_id: str, error: str, now: float) -> None:
        """Record a run that ended without a result."""
        key = redis_keys.analysis_run(job_id, run_id)
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(key, mapping={"state": names.RUN_FAILED, "error": error[:2000], "finished_at": now})
        pipe.srem(redis_keys.analyses_running(), f"{job_id}\t{run_id}")
        pipe.execute()

    def get(self, job_id: str, run_id: str) -> dict[str, Any] | None:
        """A run's state with ``chunks_done``; None if unknown."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.hgetall(redis_keys.analysis_run(job_id, run_id))
        pipe.scard(redis_keys.analysis_chunks_done(job_id, run_id))
        raw, done = pipe.execute()
        if not raw:
            return None
        return _decode(run_id, raw, int(done))

    def list(self, job_id: str, limit: int = 20) -> list[dict[str, Any]]:
        """A job's latest runs, newest first."""
        run_ids = [text(run) for run in self._redis.zrevrange(redis_keys.job_analyses(job_id), 0, limit - 1)]
        runs = (self.get(job_id, run_id) for run_id in run_ids)
        return [run for run in runs if run is not None]


def _decode(run_id: str, raw: Mapping[Any, Any], done: int) -> dict[str, Any]:
    run: dict[str, Any] = {"run": run_id}
    for key, value in raw.items():
        name, shown = text(key), text(value)
        if name in _INT_FIELDS and shown:
            run[name] = int(shown)
        elif name in _FLOAT_FIELDS and shown:
            run[name] = float(shown)
        else:
            run[name] = shown or None
    run["chunks_done"] = min(done, int(run.get("chunks") or 0))
    return run
