"""The twin of tests/integration/test_analysis_errback.py at the shipped batch analysis retries.

A job's analysis batch whose stored page cannot be read is retried ``VCRAWL_BATCH_ANALYSIS_RETRIES``
times (default 10, backoff 1 s doubling to 60 s: about 5 minutes, to outlast a Redis restart),
then Celery fires its ``link_error`` and the job completes. Nothing is shortened here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.deps.pipeline import batch_analysis_retry
from tests.faults.test_faults import Note
from tests.integration.test_analysis_errback import assert_abandoned_by_the_errback, crawl_with_an_unreadable_page
from vcrawl.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.long]


@pytest.mark.timeout(900)
def test_at_the_shipped_retries_an_analysis_batch_is_retried_for_minutes_then_finished(
    tmp_path: Path, fault_report: Note
) -> None:
    shipped = Settings()
    policy = batch_analysis_retry()  # this process's settings: the shipped ones
    assert policy.retries == shipped.batch_analysis_retries == 10
    # Each backoff is jittered by +/-50 %: at least half of 1, 2, 4, ... 60, 60 s (151.5 s), at most 1.5 times.
    backoffs = [min(policy.backoff_max_s, policy.backoff_s * 2**n) for n in range(policy.retries)]

    outcome = crawl_with_an_unreadable_page(tmp_path, shipped, timeout_s=1.5 * sum(backoffs) + 60)

    fault_report(retries=outcome.retries, abandoned_after_s=round(outcome.failing_s, 1))
    assert_abandoned_by_the_errback(outcome, retries=policy.retries)
    assert 0.5 * sum(backoffs) <= outcome.failing_s <= 1.5 * sum(backoffs) + 30
