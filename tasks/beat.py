"""Celery beat's scheduler: RedBeat, made to outlive a Redis that goes away for a while.

RedBeat extends its lock and reads its schedule at every tick; when Redis is unreachable (a
failover in progress, a restart), the error left Celery's beat loop, which stopped beat for good:
no schedule fired again until someone restarted it. Here a tick that cannot reach Redis is tried
again a moment later. A lock that ran out meanwhile (the outage outlasted
``VCRAWL_BEAT_LOCK_TIMEOUT_S``, or the failover lost its last extension) is taken again before
anything fires; if another beat took it, this one waits as a standby, as it does at start-up.
"""

from __future__ import annotations

import logging
from typing import Any

from redbeat import RedBeatScheduler
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import LockError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["RETRY_S", "BeatScheduler"]

logger = logging.getLogger(__name__)

RETRY_S = 1.0
"""How soon a tick that found Redis unreachable is tried again."""


class BeatScheduler(RedBeatScheduler):
    """RedBeat whose ticks survive Redis being away (``beat_scheduler`` in celeryconfig)."""

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One beat tick; seconds until the next."""
        try:
            return super().tick(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            logger.warning("beat: Redis unreachable (%s); trying again in %.0f s", exc, RETRY_S)
            return RETRY_S
        except LockError:  # the lock ran out while Redis was away: nothing fires without it
            return self._take_lock_again()

    def _take_lock_again(self) -> float:
        try:
            taken = self.lock is not None and self.lock.acquire(blocking=False)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            logger.warning("beat: Redis unreachable (%s); trying again in %.0f s", exc, RETRY_S)
            return RETRY_S
        if taken:
            logger.warning("beat: the lock ran out while Redis was away; taken again")
            return 0.0
        logger.warning("beat: another beat holds the lock now; this one waits as a standby")
        return float(self.max_interval)
