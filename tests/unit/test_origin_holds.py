"""A process's copy of the origin holds (``frontier.OriginHolds``): pure bookkeeping, time injected."""

from __future__ import annotations

from frontier import OriginHolds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_hold_runs_out_and_a_longer_one_stays() -> None:
    clock = Clock()
    holds = OriginHolds(client=None, clock=clock)
    holds.note("job-1", "a.test", 3.0)
    holds.note("job-1", "a.test", 1.0)  # a shorter one heard later (another process's, say)

    assert holds.left_s("job-1", "a.test") == 3.0
    assert holds.left_s("job-1", "b.test") == 0.0 and holds.left_s("job-2", "a.test") == 0.0  # per job and host
    clock.now += 2.5
    assert holds.left_s("job-1", "a.test") == 0.5
    clock.now += 0.5
    assert holds.left_s("job-1", "a.test") == 0.0
