"""Retry and politeness policies are pure values."""

from __future__ import annotations

import pytest

from vcrawl.policies import PolitenessPolicy, RetryPolicy


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [(1, 0.0, 0.5), (1, 1.0, 1.5), (2, 0.5, 2.0), (3, 0.5, 4.0), (4, 0.5, None)],
)
def test_exponential_backoff_with_jitter(attempt: int, rand: float, expected: float | None) -> None:
    assert RetryPolicy(retries=3, backoff_s=1.0).delay_for(attempt, rand=lambda: rand) == expected


def test_backoff_is_capped() -> None:
    assert RetryPolicy(retries=10, backoff_s=1.0, backoff_max_s=5.0).delay_for(9, rand=lambda: 0.5) == 5.0


def test_retry_after_is_a_floor_and_too_long_gives_up() -> None:
    policy = RetryPolicy(retries=3, backoff_s=0.1, max_retry_after_s=30)
    assert policy.delay_for(1, retry_after_s=12.0, rand=lambda: 0.5) == 12.0
    assert policy.delay_for(1, retry_after_s=0.0, rand=lambda: 0.5) == pytest.approx(0.1)
    assert policy.delay_for(1, retry_after_s=31.0) is None


def test_zero_retries_never_retries() -> None:
    assert RetryPolicy(retries=0).delay_for(1) is None


@pytest.mark.parametrize(("rand", "pause"), [(0.0, 2.0), (0.5, 2.5), (1.0, 3.0)])
def test_politeness_pause_is_never_below_the_minimum(rand: float, pause: float) -> None:
    assert PolitenessPolicy(2.0, jitter=0.5).pause_s(rand=lambda: rand) == pause
