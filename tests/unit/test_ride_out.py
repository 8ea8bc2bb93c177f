"""engine.redis_wait.ride_out: a started batch waits for its Redis instead of losing what it fetched."""

from __future__ import annotations

import pytest
import redis

from engine.redis_wait import REDIS_WAIT_S, ride_out


def test_a_call_that_meets_a_restarting_redis_is_made_again_with_backoff() -> None:
    replies = iter([redis.ConnectionError("gone"), redis.TimeoutError("slow"), redis.ConnectionError("gone"), "go"])
    waited: list[float] = []

    def call() -> str:
        reply = next(replies)
        if isinstance(reply, Exception):
            raise reply
        return reply

    assert ride_out(call, "batch 1", sleep=waited.append) == "go"
    assert waited == [0.1, 0.2, 0.4]


def test_a_redis_gone_longer_than_the_wait_raises_and_other_errors_at_once() -> None:
    def gone() -> None:
        raise redis.ConnectionError("gone")

    with pytest.raises(redis.ConnectionError):
        ride_out(gone, "batch 1", wait_s=0.0, sleep=lambda _: None)
    calls = []

    def broken() -> None:
        calls.append(1)
        raise redis.ResponseError("NOSCRIPT")

    with pytest.raises(redis.ResponseError):
        ride_out(broken, "batch 1", sleep=lambda _: None)
    assert calls == [1]


def test_at_the_shipped_wait_a_batch_waits_a_minute_for_its_redis_and_then_gives_up() -> None:
    """The twin of the test above at the shipped wait (REDIS_WAIT_S, 60 s), on a clock that the
    waits move on: a Redis back after 59 s is waited for; one still gone after 60 s is not."""
    assert REDIS_WAIT_S == 60.0
    for back_after_s, answered in ((59.0, True), (61.0, False)):
        now = [0.0]

        def call(back_after_s: float = back_after_s, now: list[float] = now) -> str:
            if now[0] < back_after_s:
                raise redis.ConnectionError("gone")
            return "go"

        def sleep(pause: float, now: list[float] = now) -> None:
            now[0] += pause

        if answered:
            assert ride_out(call, "batch 1", sleep=sleep, clock=lambda now=now: now[0]) == "go"
            assert 59.0 <= now[0] < 60.0
        else:
            with pytest.raises(redis.ConnectionError):
                ride_out(call, "batch 1", sleep=sleep, clock=lambda now=now: now[0])
            assert 59.0 <= now[0] <= 60.0
