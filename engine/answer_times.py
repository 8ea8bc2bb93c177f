"""How long this process's requests wait for their answers: what tells a pump how many batches to keep
in flight (``engine.pump.inflight_cap``)."""

from __future__ import annotations

__all__ = ["ANSWER_TIMES", "AnswerTimes"]


class AnswerTimes:
    """A moving mean of request times (seconds), fed by every fetch of the process.

    No lock: an update lost to a race between threads shifts a mean of hundreds of requests by nothing
    worth a lock on every request.
    """

    def __init__(self, weight: float = 0.05) -> None:
        self._weight = weight
        self.mean_s = 0.0

    def add(self, seconds: float) -> None:
        """Count one request's time."""
        self.mean_s += self._weight * (seconds - self.mean_s)


ANSWER_TIMES = AnswerTimes()
