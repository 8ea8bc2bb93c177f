"""engine.fetch_batch.ride_out: a started batch waits for its Redis instead of losing what it fetched."""

from __future__ import annotations

import pytest
import redis

from engine.fetch_batch import ride_out


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
