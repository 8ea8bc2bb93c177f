"""Retry and politeness rules as values with pure methods."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PolitenessPolicy", "RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, a retry budget, and a cap on server-asked waits."""

    retries: int = 3
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    max_retry_after_s: float = 600.0

    def delay_for(
        self,
        attempt: int,
        retry_after_s: float | None = None,
        rand: Callable[[], float] = random.random,
    ) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or None when the budget is spent.

        ``attempt`` counts from 1 (the attempt that just failed). The wait is
        ``backoff_s * 2**(attempt-1)`` with +/-50 % jitter, capped at ``backoff_max_s``,
        and never shorter than what the server asked for with ``Retry-After``.
        A server asking for more than ``max_retry_after_s`` ends the retries.

        >>> RetryPolicy(retries=3, backoff_s=1.0).delay_for(1, rand=lambda: 0.5)
        1.0
        >>> RetryPolicy(retries=3, backoff_s=1.0).delay_for(4) is None
        True
        >>> RetryPolicy(backoff_s=0.1).delay_for(1, retry_after_s=2.0, rand=lambda: 0.5)
        2.0
        """
        if attempt > self.retries:
            return None
        base = min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))
        delay = base * (0.5 + rand())
        if retry_after_s is not None:
            if retry_after_s > self.max_retry_after_s:
                return None
            delay = max(delay, retry_after_s)
        return delay


@dataclass(frozen=True)
class PolitenessPolicy:
    """Minimum pause between two requests to one host, stretched by random jitter."""

    min_interval_s: float = 0.25
    jitter: float = 0.5

    def pause_s(self, rand: Callable[[], float] = random.random) -> float:
        """Return a pause in ``[min_interval_s, min_interval_s * (1 + jitter)]``.

        >>> PolitenessPolicy(2.0, 0.5).pause_s(rand=lambda: 1.0)
        3.0
        """
        return self.min_interval_s * (1 + self.jitter * rand())
