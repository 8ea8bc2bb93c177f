"""Per-host politeness held in Redis, so it binds every worker on every machine."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import redis

from vcrawl import redis_keys
from vcrawl.policies import PolitenessPolicy

__all__ = ["HostGate"]

logger = logging.getLogger(__name__)


class HostGate:
    """A Redis key per host that lives for the pause after each request to it.

    The key is claimed atomically (``SET NX PX``) before a fetch and set again when
    the fetch ends, so the next request to the host starts at least one pause after
    the previous one finished. Waiting is the caller's business: it re-queues the
    work instead of holding a worker slot.
    """

    def __init__(
        self,
        client: redis.Redis,
        policy: PolitenessPolicy,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._redis = client
        self._policy = policy
        self._rand = rand

    def try_claim(self, host: str) -> float:
        """Claim ``host`` now; return 0.0 on success, else the seconds left to wait."""
        if self._policy.min_interval_s <= 0:
            return 0.0
        key = redis_keys.host_gate(host)
        pause_ms = max(1, int(self._policy.pause_s(self._rand) * 1000))
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(key, 1, nx=True, px=pause_ms)
        pipe.pttl(key)
        claimed, ttl_ms = pipe.execute()
        if claimed:
            return 0.0
        # ttl -1/-2: the key has no expiry or vanished between the calls: try again soon.
        return max(ttl_ms, 10) / 1000.0

    def release(self, host: str) -> None:
        """Start the pause after a finished request to ``host``."""
        if self._policy.min_interval_s <= 0:
            return
        pause_ms = max(1, int(self._policy.pause_s(self._rand) * 1000))
        self._redis.set(redis_keys.host_gate(host), 1, px=pause_ms)
