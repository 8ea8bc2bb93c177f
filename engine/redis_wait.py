"""Riding out a Redis restart or failover mid-batch: a started batch's calls wait for Redis, within a bound."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

__all__ = ["REDIS_WAIT_S", "ride_out"]

logger = logging.getLogger(__name__)

REDIS_WAIT_S = 60.0
"""How long a started batch waits for its Redis to come back (a restart, a failover) before it gives up:
what it fetched so far is released, not fetched again."""


def ride_out(
    call: Callable[[], Any],
    what: str,
    wait_s: float = REDIS_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """``call()``, called again with backoff (0.1 s to 1 s) while Redis cannot be reached, up to ``wait_s``."""
    deadline = clock() + wait_s
    pause = 0.1
    while True:
        try:
            return call()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if clock() + pause > deadline:
                raise
            logger.warning("%s: Redis unreachable (%r); trying again in %.1f s", what, exc, pause)
            sleep(pause)
            pause = min(1.0, pause * 2)
