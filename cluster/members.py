"""Ring nodes in Redis: who is on the host ring, with which weight, and who went silent.

A ring node (a worker started with ``VCRAWL_NODE_WEIGHT`` or ``VCRAWL_RING``) beats every second
or two: its registration (weight, own queue, machine, pid, pages/s) and the time, on the Redis
clock. A node is alive while its last beat is younger than ``VCRAWL_NODE_TIMEOUT_S``. The ring is
made of the alive nodes, so every process that reads the same members computes the same owner
for a host (``cluster.ring``). A silent node is claimed down by exactly one watcher
(``claim_down``), which hands its batches over; a node that beats again rejoins.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from cluster.ring import HostRing
from frontier.scripts import ScriptLoader
from vcrawl import redis_keys
from vcrawl.redis_replies import text

__all__ = ["Membership", "NodeInfo", "NodeRegistration", "NodeRegistry", "RingView"]


@dataclass(frozen=True)
class NodeRegistration:
    """What a ring node says about itself with every beat."""

    name: str
    weight: int
    queue: str
    machine: str = ""
    pid: int = 0
    started_s: float = 0.0
    pages_per_s: float = 0.0
    # this node's process: connections opened to sites, DNS lookups sent and answered from cache
    connections_opened: int = 0
    dns_lookups: int = 0
    dns_hits: int = 0
    concurrency: int = 0  # the worker's pool size now (threads or processes; ``vcrawl nodes resize``)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> NodeRegistration:
        data = json.loads(raw)
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)


@dataclass(frozen=True)
class NodeInfo:
    """One ring node as the registry sees it now."""

    registration: NodeRegistration
    alive: bool
    last_beat_ms: int | None  # None: no beat kept; 0: it left
    down_at_ms: int | None = None
    pages: int = 0

    @property
    def name(self) -> str:
        return self.registration.name

    @property
    def weight(self) -> int:
        return self.registration.weight

    @property
    def queue(self) -> str:
        return self.registration.queue


@dataclass(frozen=True)
class Membership:
    """The ring nodes at one moment (``now_ms`` on the Redis clock)."""

    now_ms: int
    timeout_ms: int
    nodes: tuple[NodeInfo, ...] = ()
    _by_name: dict[str, NodeInfo] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update((node.name, node) for node in self.nodes)

    @cached_property
    def ring(self) -> HostRing:
        """The ring of the alive nodes."""
        return HostRing({node.name: node.weight for node in self.nodes if node.alive})

    def node(self, name: str) -> NodeInfo | None:
        return self._by_name.get(name)

    def silent(self) -> list[NodeInfo]:
        """Nodes past their timeout that nobody has declared down yet (their work must move)."""
        return [node for node in self.nodes
                if not node.alive and node.down_at_ms is None and node.last_beat_ms is not None]  # fmt: skip

    def queue_of(self, host: str) -> str | None:
        """The download queue of ``host``'s owner (None: no node on the ring)."""
        owner = self.ring.owner(host)
        return None if owner is None else self._by_name[owner].queue


class NodeRegistry:
    """Ring membership kept in Redis (``redis_keys.NODES`` and friends)."""

    def __init__(self, scripts: ScriptLoader, timeout_s: float) -> None:
        self._scripts = scripts
        self._redis = scripts.client
        self.timeout_ms = int(timeout_s * 1000)

    def beat(self, registration: NodeRegistration, *, leaving: bool = False) -> int:
        """Register and stamp ``registration``'s node (``leaving``: take it off the ring at once).

        Returns the time of the beat (ms, Redis clock).
        """
        keys = [redis_keys.NODES, redis_keys.NODE_BEATS, redis_keys.NODES_DOWN]
        args = [registration.name, registration.to_json(), "1" if leaving else "0"]
        return int(self._scripts.run("node_beat", keys, args))

    def membership(self) -> Membership:
        """Every registered node, alive or not: one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.time()
        pipe.hgetall(redis_keys.NODES)
        pipe.zrange(redis_keys.NODE_BEATS, 0, -1, withscores=True)
        pipe.hgetall(redis_keys.NODES_DOWN)
        pipe.hgetall(redis_keys.NODE_PAGES)
        clock, registered, beats, down, pages = pipe.execute()
        now_ms = int(clock[0]) * 1000 + int(clock[1]) // 1000
        last = {text(name): int(score) for name, score in beats}
        down_at = {text(name): int(json.loads(raw).get("at", 0)) for name, raw in down.items()}
        counts = {text(name): int(value) for name, value in pages.items()}
        nodes = []
        for raw_name, raw in sorted(registered.items()):
            name = text(raw_name)
            try:
                registration = NodeRegistration.from_json(text(raw))
            except (ValueError, TypeError):
                continue  # a registration this version cannot read: not on this process's ring
            beat = last.get(name)
            alive = beat is not None and beat >= now_ms - self.timeout_ms and name not in down_at
            nodes.append(NodeInfo(registration, alive, beat, down_at.get(name), counts.get(name, 0)))
        return Membership(now_ms, self.timeout_ms, tuple(nodes))

    def claim_down(self, node: NodeInfo, claim_ttl_s: int = 86400) -> bool:
        """Declare a silent node down; True for the one caller that must hand its work over."""
        if node.last_beat_ms is None:
            return False
        keys = [redis_keys.NODE_BEATS, redis_keys.NODES_DOWN, redis_keys.node_handover(node.name, node.last_beat_ms)]
        args = [node.name, node.last_beat_ms, self.timeout_ms, claim_ttl_s]
        return int(self._scripts.run("node_down", keys, args)) == 1

    def note_down(self, name: str, details: Mapping[str, Any]) -> None:
        """Add what the handover did to a down node's record (for ``vcrawl nodes``)."""
        raw = self._redis.hget(redis_keys.NODES_DOWN, name)
        record = json.loads(raw) if raw else {}
        record.update(details)
        self._redis.hset(redis_keys.NODES_DOWN, name, json.dumps(record, separators=(",", ":")))

    def down_record(self, name: str) -> dict[str, Any]:
        raw = self._redis.hget(redis_keys.NODES_DOWN, name)
        return json.loads(raw) if raw else {}

    def down_records(self) -> dict[str, dict[str, Any]]:
        """Every down member's record: when, and what was handed over."""
        return {text(name): json.loads(raw) for name, raw in self._redis.hgetall(redis_keys.NODES_DOWN).items()}

    def count_pages(self, name: str, pages: int) -> None:
        """Count pages a node's fetch batches stored (its pages/s in ``vcrawl nodes``)."""
        if pages:
            self._redis.hincrby(redis_keys.NODE_PAGES, name, pages)

    def pages(self, name: str) -> int:
        return int(self._redis.hget(redis_keys.NODE_PAGES, name) or 0)

    def forget(self, name: str) -> bool:
        """Remove a node that is down from the listing; False if it is alive (or unknown)."""
        membership = self.membership()
        node = membership.node(name)
        if node is None or node.alive:
            return False
        pipe = self._redis.pipeline(transaction=True)
        for key in (redis_keys.NODES, redis_keys.NODES_DOWN, redis_keys.NODE_PAGES, redis_keys.HOLDERS):
            pipe.hdel(key, name)
        pipe.zrem(redis_keys.NODE_BEATS, name)
        pipe.delete(redis_keys.node_stats(name), redis_keys.node_hosts(name))  # its minutes expire
        pipe.execute()
        return True


class RingView:
    """This process's view of the membership, read again at most every ``refresh_s`` seconds.

    Shared by the threads of a process. Redis trouble keeps the last view (routing goes on as
    it was) until Redis answers again.
    """

    def __init__(self, registry: NodeRegistry, refresh_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self._registry = registry
        self._refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._view: Membership | None = None
        self._read_at = float("-inf")

    def current(self) -> Membership:
        """The membership, at most ``refresh_s`` old (raises only if Redis never answered)."""
        with self._lock:
            if self._view is None or self._clock() - self._read_at >= self._refresh_s:
                try:
                    self._view = self._registry.membership()
                    self._read_at = self._clock()
                except Exception:
                    if self._view is None:
                        raise
                    self._read_at = self._clock()  # try again after refresh_s, not on every call
            return self._view

    def invalidate(self) -> None:
        """Read the membership afresh at the next call (a node just joined or left)."""
        with self._lock:
            self._read_at = float("-inf")
