"""What a job's frontier reports: per-minute counters, per-host totals, recent failures, progress."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import redis

from frontier.url_ids import url_id
from vcrawl import names, redis_keys
from vcrawl.redis_replies import text

if TYPE_CHECKING:
    from frontier.partitions import JobPartitions

__all__ = ["DayStats", "FrontierStats", "stats_day", "stats_days", "stats_minute"]

# Per-host totals; the host's throttle streak (names.HOST_THROTTLED) is kept in the same hash but is not one.
_HOST_KINDS = tuple(
    prefix.rstrip("|") for prefix in (names.HOST_FETCHED, names.HOST_DONE, names.HOST_FAILED, names.HOST_SLOW)
)

DayStats = tuple[str, dict[str, int], dict[str, dict[str, int]]]
"""One UTC day of a job: (``YYYY-MM-DD``, its counters, per host: ``fetched``/``stored``/``bytes``/``failed``)."""
_DAY_HOST_KINDS = tuple(prefix.rstrip("|") for prefix in (names.HOST_FETCHED, names.HOST_STORED, names.HOST_BYTES,
                                                          names.HOST_FAILED))  # fmt: skip


class FrontierStats:
    """Read-only views of a job's statistics (written by the queue's scripts)."""

    def __init__(self, client: redis.Redis, partitions: JobPartitions | None = None) -> None:
        self._redis = client
        # A job split over a cluster's primaries keeps its statistics in each partition: summed here.
        self._parts = partitions

    def _of(self, job_id: str) -> tuple[str, ...]:
        return self._parts.of(job_id) if self._parts is not None else (job_id,)

    def _for_host(self, job_id: str, host: str) -> str:
        return self._parts.for_host(job_id, host) if self._parts is not None else job_id

    def stats(self, job_id: str, minutes: int, now: float) -> list[tuple[int, dict[str, int]]]:
        """The job's per-minute counters over the last ``minutes`` minutes, oldest first."""
        last = stats_minute(now)
        window = range(last - minutes + 1, last + 1)
        parts = self._of(job_id)
        pipe = self._redis.pipeline(transaction=False)
        for minute in window:
            for part in parts:
                pipe.hgetall(redis_keys.job_stats_bucket(part, minute))
        rows = pipe.execute()
        out = []
        for n, minute in enumerate(window):
            counters: Counter[str] = Counter()
            for row in rows[n * len(parts) : (n + 1) * len(parts)]:
                counters.update({text(k): int(v) for k, v in row.items()})
            out.append((minute, dict(counters)))
        return out

    def daily(self, job_id: str, days: int, now: float) -> list[DayStats]:
        """The job's per-day counters and per-host per-day counters over the last ``days`` UTC days, oldest first."""
        window = stats_days(now, days)
        parts = self._of(job_id)
        pipe = self._redis.pipeline(transaction=False)
        for day in window:
            for part in parts:
                pipe.hgetall(redis_keys.job_day_stats(part, day))
                pipe.hgetall(redis_keys.job_day_host_stats(part, day))
        rows = pipe.execute()
        out: list[DayStats] = []
        for n, day in enumerate(window):
            counters: Counter[str] = Counter()
            hosts: dict[str, dict[str, int]] = {}
            mine = rows[n * 2 * len(parts) : (n + 1) * 2 * len(parts)]
            for day_counters, by_host in zip(mine[::2], mine[1::2], strict=True):
                counters.update({text(k): int(v) for k, v in day_counters.items()})
                for field, value in by_host.items():  # a host is in one partition
                    kind, host = text(field).split("|", 1)
                    if kind in _DAY_HOST_KINDS:
                        hosts.setdefault(host, dict.fromkeys(_DAY_HOST_KINDS, 0))[kind] = int(value)
            out.append((day, dict(counters), hosts))
        return out

    def host_stats(self, job_id: str) -> dict[str, dict[str, int]]:
        """Per host: responses (``fetched``), URLs finished (``done``), final failures (``failed``) and
        requests given up for time (``slow``)."""
        hosts: dict[str, dict[str, int]] = {}
        for part in self._of(job_id):
            for field, value in self._redis.hgetall(redis_keys.job_host_stats(part)).items():
                kind, host = text(field).split("|", 1)
                if kind in _HOST_KINDS:
                    hosts.setdefault(host, dict.fromkeys(_HOST_KINDS, 0))[kind] = int(value)
        return hosts

    def stalled_s(self, job_id: str, now: float) -> float:
        """Seconds a running job with work left has gone without finishing a fetch batch (0 otherwise)."""
        fields = [names.META_STATE, names.META_PENDING, names.META_PROGRESS_AT, names.META_STARTED_AT,
                  names.META_CREATED_AT]  # fmt: skip
        rows = [self._redis.hmget(redis_keys.job(part), fields) for part in self._of(job_id)]
        pending = sum(int(row[1] or 0) for row in rows)
        if text(rows[0][0]) != names.STATE_RUNNING or pending <= 0:
            return 0.0
        return max(0.0, now - max(float(t) for row in rows for t in row[2:] if t is not None))

    def host_totals(self, job_id: str, host: str) -> tuple[int, int]:
        """(URLs finished, final failures) of one host in the job."""
        fields = [names.HOST_DONE + host, names.HOST_FAILED + host]
        done, failed = self._redis.hmget(redis_keys.job_host_stats(self._for_host(job_id, host)), fields)
        return int(done or 0), int(failed or 0)

    def host_slowness(self, job_id: str, host: str) -> tuple[int, int]:
        """(requests given up for time, responses) of one host in the job."""
        fields = [names.HOST_SLOW + host, names.HOST_FETCHED + host]
        slow, fetched = self._redis.hmget(redis_keys.job_host_stats(self._for_host(job_id, host)), fields)
        return int(slow or 0), int(fetched or 0)

    def host_throttle(self, job_id: str, host: str) -> int:
        """The host's latest run of 429/503 answers in a row in the job."""
        key = redis_keys.job_host_stats(self._for_host(job_id, host))
        return int(self._redis.hget(key, names.HOST_THROTTLED + host) or 0)

    def failures(self, job_id: str, limit: int = 50) -> list[dict[str, object]]:
        """The job's most recent final failures, newest first."""
        parts = self._of(job_id)
        found = [json.loads(raw) for part in parts for raw in self._redis.lrange(redis_keys.job_failures(part), 0,
                                                                                 limit - 1)]  # fmt: skip
        for failure in found:  # the URL's global id, derived: outputs of every job join on it
            if isinstance(failure.get("url"), str):
                failure["url_id"] = url_id(failure["url"])
        if len(parts) == 1:
            return found
        return sorted(found, key=lambda failure: -float(failure.get("at") or 0))[:limit]  # each partition's newest

    def hosts_seen(self, job_id: str) -> int:
        """Hosts the job has sent at least one request to."""
        return sum(int(self._redis.hlen(redis_keys.job_next(part))) for part in self._of(job_id))


def stats_minute(now_s: float) -> int:
    """The per-minute statistics bucket of a moment (minutes since the epoch).

    >>> stats_minute(120.5)
    2
    """
    return int(now_s // 60)


def stats_day(now_s: float) -> str:
    """The per-day statistics bucket of a moment: its UTC date.

    >>> stats_day(0), stats_day(86399.9), stats_day(1_795_000_000)
    ('1970-01-01', '1970-01-01', '2026-11-18')
    """
    return datetime.fromtimestamp(now_s, UTC).date().isoformat()


def stats_days(now_s: float, days: int) -> list[str]:
    """The last ``days`` UTC dates up to the one of ``now_s``, oldest first.

    >>> stats_days(86400 * 2, 3)
    ['1970-01-01', '1970-01-02', '1970-01-03']
    """
    today = datetime.fromtimestamp(now_s, UTC).date()
    return [(today - timedelta(days=back)).isoformat() for back in range(days - 1, -1, -1)]
