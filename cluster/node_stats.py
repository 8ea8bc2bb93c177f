"""Per-node statistics in Redis: what each node's fetches did, as the design's distributed experiment reports it.

Per node (its name on the ring, ``NodeRegistration.name``): requests sent, successes (pages stored),
failures (requests that brought no page), distinct hosts requested (a HyperLogLog), bytes downloaded
and seconds spent downloading, as totals since the node joined and in one bucket per minute (kept
``MINUTES_KEPT``). Each process counts its own fetches in memory (``engine.node_meter``); the worker's
membership thread writes the tally with each heartbeat (every 2 s at most), in one pipeline, so
the counters cost no Redis round trip per page and lag the wire by a heartbeat at most.

What is shown (``vcrawl nodes``): the average bandwidth, bytes over the time spent downloading (what a
request gets while it downloads); bytes/s and pages/s over the node's lifetime and over its last minutes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from engine.node_meter import NodeMeter, NodeTally
from vcrawl import redis_keys
from vcrawl.redis_replies import text

__all__ = ["MINUTES_KEPT", "RECENT_MINUTES", "NodeStats", "NodeStatsWriter"]

logger = logging.getLogger(__name__)

MINUTES_KEPT = 60  # a minute's bucket lives this many minutes
RECENT_MINUTES = 5  # "the last minutes" of the listing
_COUNTERS = ("requests", "successes", "failures", "bytes", "busy_ms")


class NodeStats:
    """The nodes' statistics in Redis (``redis_keys.node_stats`` and friends)."""

    def __init__(self, redis: Any, minutes_kept: int = MINUTES_KEPT) -> None:
        self._redis = redis
        self._ttl_s = minutes_kept * 60

    def join(self, name: str, at_ms: int) -> None:
        """Start ``name``'s totals afresh: it joins now (a worker restarted under its name counts anew)."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(redis_keys.node_stats(name), redis_keys.node_hosts(name))
        pipe.hset(redis_keys.node_stats(name), "joined_ms", int(at_ms))
        pipe.execute()

    def add(self, name: str, tally: NodeTally, at_ms: int) -> None:
        """Add a process's tally to ``name``'s totals and to the minute of ``at_ms``: one round trip."""
        if tally.empty:
            return
        values = {"requests": tally.requests, "successes": tally.successes, "failures": tally.failures,
                  "bytes": tally.bytes, "busy_ms": round(tally.busy_s * 1000)}  # fmt: skip
        total, minute = redis_keys.node_stats(name), redis_keys.node_stats_minute(name, int(at_ms) // 60_000)
        pipe = self._redis.pipeline(transaction=False)
        for counter, value in values.items():
            if value:
                pipe.hincrby(total, counter, value)
                pipe.hincrby(minute, counter, value)
        pipe.hsetnx(total, "joined_ms", int(at_ms))  # its join was not written (Redis away at the time)
        pipe.expire(minute, self._ttl_s)
        if tally.hosts:
            pipe.pfadd(redis_keys.node_hosts(name), *sorted(tally.hosts))
        pipe.execute()

    def forget(self, name: str) -> None:
        """Drop ``name``'s totals and hosts (its minutes expire by themselves)."""
        self._redis.delete(redis_keys.node_stats(name), redis_keys.node_hosts(name))

    def read(self, names: Iterable[str], now_ms: int, recent_minutes: int = RECENT_MINUTES) -> dict[str, dict]:
        """Each node's statistics at ``now_ms`` (Redis clock), with its last ``recent_minutes``: one round trip."""
        names = list(names)
        now_minute = int(now_ms) // 60_000
        minutes = list(range(now_minute - recent_minutes + 1, now_minute + 1))
        pipe = self._redis.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(redis_keys.node_stats(name))
            pipe.pfcount(redis_keys.node_hosts(name))
            for minute in minutes:
                pipe.hgetall(redis_keys.node_stats_minute(name, minute))
        replies = pipe.execute()
        per_node = 2 + len(minutes)
        result = {}
        for index, name in enumerate(names):
            total, hosts, *buckets = replies[index * per_node : (index + 1) * per_node]
            result[name] = node_figures(_ints(total), int(hosts), [_ints(bucket) for bucket in buckets], minutes,
                                        int(now_ms))  # fmt: skip
        return result


def node_figures(total: dict[str, int], hosts: int, buckets: list[dict[str, int]], minutes: list[int],
                 now_ms: int) -> dict[str, Any]:  # fmt: skip
    """A node's statistics as the listing shows them, from its totals and its minutes' buckets.

    >>> minute = {"requests": 12, "successes": 10, "bytes": 5000, "busy_ms": 2000}
    >>> figures = node_figures({**minute, "failures": 1, "joined_ms": 0}, 3, [{}, minute], [0, 1], 100_000)
    >>> figures["bandwidth_bps"], figures["pages_per_s"], figures["recent"]["pages_per_s"], figures["hosts_visited"]
    (2500.0, 0.1, 0.1, 3)
    """
    joined_ms = total.get("joined_ms")
    lifetime_s = max(0.0, (now_ms - joined_ms) / 1000) if joined_ms is not None else 0.0
    counted = {counter: total.get(counter, 0) for counter in _COUNTERS}
    # The last minutes: from the first minute's start, or the node's join if later, to now.
    since_ms = minutes[0] * 60_000 if minutes else now_ms
    if joined_ms is not None:
        since_ms = max(since_ms, joined_ms)
    recent = {counter: sum(bucket.get(counter, 0) for bucket in buckets) for counter in _COUNTERS}
    return {
        **_rates(counted, lifetime_s),
        "hosts_visited": hosts,
        "joined": None if joined_ms is None else joined_ms / 1000,
        "lifetime_s": round(lifetime_s, 1),
        "recent": {"minutes": len(minutes), **_rates(recent, max(0.0, (now_ms - since_ms) / 1000))},
        "minutes": [_bucket(minute, bucket) for minute, bucket in zip(minutes, buckets, strict=True)],
    }


def _bucket(minute: int, bucket: dict[str, int]) -> dict[str, int]:
    return {"minute": minute * 60, **{counter: bucket.get(counter, 0) for counter in _COUNTERS}}


def _rates(counted: dict[str, int], span_s: float) -> dict[str, Any]:
    busy_s = counted["busy_ms"] / 1000
    return {
        "requests": counted["requests"],
        "successes": counted["successes"],
        "failures": counted["failures"],
        "bytes": counted["bytes"],
        "busy_s": round(busy_s, 3),
        "bandwidth_bps": round(counted["bytes"] / busy_s, 1) if busy_s > 0 else 0.0,
        "bytes_per_s": round(counted["bytes"] / span_s, 1) if span_s > 0 else 0.0,
        "pages_per_s": round(counted["successes"] / span_s, 2) if span_s > 0 else 0.0,
        "requests_per_s": round(counted["requests"] / span_s, 2) if span_s > 0 else 0.0,
    }


def _ints(raw: dict[Any, Any]) -> dict[str, int]:
    return {text(key): int(value) for key, value in raw.items()}


class NodeStatsWriter:
    """A process's meter and the store it is written to: what the membership thread flushes with each beat."""

    def __init__(self, meter: NodeMeter, stats: NodeStats) -> None:
        self.meter = meter
        self._stats = stats

    def join(self, name: str, at_ms: int) -> None:
        """The node starts afresh (its first heartbeat)."""
        self._stats.join(name, at_ms)

    def flush(self, name: str, at_ms: int) -> None:
        """Write what the process fetched since the last flush; kept for the next one if Redis is away."""
        tally = self.meter.take()
        try:
            self._stats.add(name, tally, at_ms)
        except Exception:
            self.meter.put_back(tally)
            raise
