"""What a job's frontier reports: per-minute counters, per-host totals, recent failures, progress."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import redis

from vcrawl import names, redis_keys
from vcrawl.redis_replies import text

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

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def stats(self, job_id: str, minutes: int, now: float) -> list[tuple[int, dict[str, int]]]:
        """The job's per-minute counters over the last ``minutes`` minutes, oldest first."""
        last = stats_minute(now)
        pipe = self._redis.pipeline(transaction=False)
        for minute in range(last - minutes + 1, last + 1):
            pipe.hgetall(redis_keys.job_stats_bucket(job_id, minute))
        rows = pipe.execute()
        return [
            (minute, {text(k): int(v) for k, v in row.items()})
            for minute, row in zip(range(last - minutes + 1, last + 1), rows, strict=True)
        ]

    def daily(self, job_id: str, days: int, now: float) -> list[DayStats]:
        """The job's per-day counters and per-host per-day counters over the last ``days`` UTC days, oldest first."""
        window = stats_days(now, days)
        pipe = self._redis.pipeline(transaction=False)
        for day in window:
            pipe.hgetall(redis_keys.job_day_stats(job_id, day))
            pipe.hgetall(redis_keys.job_day_host_stats(job_id, day))
        rows = pipe.execute()
        out: list[DayStats] = []
        for day, counters, by_host in zip(window, rows[::2], rows[1::2], strict=True):
            hosts: dict[str, dict[str, int]] = {}
            for field, value in by_host.items():
                kind, host = text(field).split("|", 1)
                if kind in _DAY_HOST_KINDS:
                    hosts.setdefault(host, dict.fromkeys(_DAY_HOST_KINDS, 0))[kind] = int(value)
            out.append((day, {text(k): int(v) for k, v in counters.items()}, hosts))
        return out

    def host_stats(self, job_id: str) -> dict[str, dict[str, int]]:
        """Per host: responses (``fetched``), URLs finished (``done``), final failures (``failed``) and
        requests given up for time (``slow``)."""
        hosts: dict[str, dict[str, int]] = {}
        for field, value in self._redis.hgetall(redis_keys.job_host_stats(job_id)).items():
            kind, host = text(field).split("|", 1)
            if kind in _HOST_KINDS:
                hosts.setdefault(host, dict.fromkeys(_HOST_KINDS, 0))[kind] = int(value)
        return hosts

    def stalled_s(self, job_id: str, now: float) -> float:
        """Seconds a running job with work left has gone without finishing a fetch batch (0 otherwise)."""
        fields = [names.META_STATE, names.META_PENDING, names.META_PROGRESS_AT, names.META_STARTED_AT,
                  names.META_CREATED_AT]  # fmt: skip
        state, pending, *times = self._redis.hmget(redis_keys.job(job_id), fields)
        if text(state) != names.STATE_RUNNING or int(pending or 0) <= 0:
            return 0.0
        return max(0.0, now - max(float(t) for t in times if t is not None))

    def host_totals(self, job_id: str, host: str) -> tuple[int, int]:
        """(URLs finished, final failures) of one host in the job."""
        fields = [names.HOST_DONE + host, names.HOST_FAILED + host]
        done, failed = self._redis.hmget(redis_keys.job_host_stats(job_id), fields)
        return int(done or 0), int(failed or 0)

    def host_slowness(self, job_id: str, host: str) -> tuple[int, int]:
        """(requests given up for time, responses) of one host in the job."""
        fields = [names.HOST_SLOW + host, names.HOST_FETCHED + host]
        slow, fetched = self._redis.hmget(redis_keys.job_host_stats(job_id), fields)
        return int(slow or 0), int(fetched or 0)

    def host_throttle(self, job_id: str, host: str) -> int:
        """The host's latest run of 429/503 answers in a row in the job."""
        return int(self._redis.hget(redis_keys.job_host_stats(job_id), names.HOST_THROTTLED + host) or 0)

    def failures(self, job_id: str, limit: int = 50) -> list[dict[str, object]]:
        """The job's most recent final failures, newest first."""
        return [json.loads(raw) for raw in self._redis.lrange(redis_keys.job_failures(job_id), 0, limit - 1)]

    def hosts_seen(self, job_id: str) -> int:
        """Hosts the job has sent at least one request to."""
        return int(self._redis.hlen(redis_keys.job_next(job_id)))


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
