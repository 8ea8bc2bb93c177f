"""Per-host politeness for single tasks (``crawl.delay``), held in Redis for every worker.

Each host has a *next free time* and a *busy* marker. A task either starts now (the host
is free and due) or reserves the next free slot and is re-queued to start exactly then,
so N tasks for one host cost N re-queues at most, never a retry storm. A request starts
only when no other request to the host is running, and the pause is measured again from
the end of each request. Crawl jobs pace their hosts in the frontier's per-host queues, with the
same pause: the job's interval with jitter, or the host's Crawl-delay when it is longer.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

import redis

from frontier.scripts import lua_source
from vcrawl import redis_keys
from vcrawl.policies import PolitenessPolicy

__all__ = ["HostGate"]

logger = logging.getLogger(__name__)


class HostGate:
    """Reserve and release a host's request slots; waiting is left to the caller's re-queue."""

    def __init__(
        self,
        client: redis.Redis,
        policy: PolitenessPolicy,
        busy_s: float = 120.0,
        rand: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._policy = policy
        self._busy_ms = int(busy_s * 1000)  # a crashed worker's marker expires after this
        self._rand, self._clock = rand, clock
        self._reserve = client.register_script(lua_source("gate_reserve"))
        self._release = client.register_script(lua_source("gate_release"))

    def reserve(self, host: str, reserved_ms: int | None = None, pause_s: float | None = None) -> int:
        """Start a request to ``host`` now (returns 0), or reserve a later slot (returns its time in ms).

        Pass the slot a previous call returned as ``reserved_ms`` when coming back for it.
        ``pause_s`` is the host's pause when it is not the policy's (a Crawl-delay); 0: no pacing.
        """
        pause_ms = self._pause_ms(pause_s)
        if pause_ms <= 0:
            return 0
        return int(
            self._reserve(
                keys=self._keys(host),
                args=[int(self._clock() * 1000), pause_ms, -1 if reserved_ms is None else reserved_ms, self._busy_ms],
            )
        )  # fmt: skip

    def release(self, host: str, pause_s: float | None = None) -> None:
        """End the request to ``host``: the next one starts a pause from now at the earliest."""
        pause_ms = self._pause_ms(pause_s)
        if pause_ms <= 0:
            return
        self._release(keys=self._keys(host), args=[int(self._clock() * 1000), pause_ms, self._busy_ms])

    @staticmethod
    def _keys(host: str) -> list[str]:
        return [redis_keys.host_gate(host), redis_keys.host_free(host), redis_keys.host_busy(host)]

    def _pause_ms(self, pause_s: float | None) -> int:
        if pause_s is None:
            if self._policy.min_interval_s <= 0:
                return 0
            pause_s = self._policy.pause_s(self._rand)
        return max(1, int(pause_s * 1000)) if pause_s > 0 else 0
