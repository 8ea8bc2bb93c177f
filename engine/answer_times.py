"""How long this process's requests wait for their answers: what tells a pump how many batches to keep
in flight (``engine.pump.inflight_cap``)."""

from __future__ import annotations

from collections import deque

__all__ = ["ANSWER_TIMES", "AnswerTimes"]


class AnswerTimes:
    """The times (seconds) of the process's last requests, fed by every fetch.

    ``typical_s`` is their lower quartile: what the network and the servers take. A mean would count
    the time a thread waits for the GIL after its answer came, which grows with the threads busy, and
    would ask for more of them.
    """

    def __init__(self, kept: int = 64) -> None:
        self._times: deque[float] = deque(maxlen=kept)  # append is atomic: no lock on the fetch path

    def add(self, seconds: float) -> None:
        """Count one request's time."""
        self._times.append(seconds)

    def typical_s(self) -> float:
        """The lower quartile of the times kept (0.0 before any request)."""
        times = sorted(tuple(self._times))
        return times[len(times) // 4] if times else 0.0


ANSWER_TIMES = AnswerTimes()
