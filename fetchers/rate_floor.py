"""The transfer-rate floor: bytes arriving slower than a minimum rate for a whole window are given up.

The static fetcher holds a response's head (``fetchers.deadline``) and its body (``fetchers.static``)
to it, like curl's ``--speed-limit``/``--speed-time``: a server that drip-feeds either holds its
host's slot for about a window, not for the whole total timeout.
"""

from __future__ import annotations

from collections import deque

__all__ = ["RateFloor"]


class RateFloor:
    """Says when bytes have been arriving slower than ``min_rate`` bytes/s for a whole ``window_s``.

    >>> floor = RateFloor(1024.0, 5.0, started=0.0)
    >>> floor.too_slow(4.0, 10), floor.too_slow(6.0, 10)
    (False, True)
    >>> floor = RateFloor(1024.0, 5.0, started=0.0)
    >>> floor.too_slow(3.0, 20_000), floor.too_slow(6.0, 20_000), floor.too_slow(8.0, 20_000)
    (False, False, True)
    """

    def __init__(self, min_rate: float, window_s: float, started: float) -> None:
        self._min_rate, self._window_s = min_rate, window_s
        self._samples: deque[tuple[float, int]] = deque([(started, 0)])

    def too_slow(self, now: float, size: int) -> bool:
        """Record ``size`` bytes read by ``now``; True if the last window brought too few."""
        if self._min_rate <= 0:
            return False
        samples = self._samples
        samples.append((now, size))
        # Keep the newest sample at least a window old: the base the window's bytes count from.
        while len(samples) > 1 and samples[1][0] <= now - self._window_s:
            samples.popleft()
        base_at, base_size = samples[0]
        return now - base_at >= self._window_s and size - base_size < self._min_rate * (now - base_at)
