"""VCRAWL_RECORDS_URL: its checks name the variable and never repeat the password; a records database
out of reach keeps an analysis batch retrying however long it takes."""

from __future__ import annotations

import pytest

from tasks.batches import _edge_retry_delay
from tasks.deps.pipeline import batch_analysis_retry
from vcrawl.errors import ConfigError, RecordsUnavailable, StorageFailed
from vcrawl.settings import Settings

SECRET = "hunter2-pg"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (f"mysql://crawler:{SECRET}@db:3306/crawl", "must be a postgresql:// URL"),
        (f"postgresql://crawler:{SECRET}@db:5432/", "names no database"),
        (f"postgresql://crawler:{SECRET}@:5432/crawl", "names no host"),
        (f"postgresql://crawler:{SECRET}@db:port/crawl", "not a readable URL"),
    ],
)
def test_a_bad_records_url_is_refused_without_its_password(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"VCRAWL_RECORDS_URL": url})
    assert str(refused.value).startswith("VCRAWL_RECORDS_URL ") and problem in str(refused.value)
    assert SECRET not in str(refused.value)


def test_a_records_url_is_read_and_kept_out_of_the_repr() -> None:
    url = f"postgres://crawler:{SECRET}@db.internal:5433/crawl"
    settings = Settings.from_env({"VCRAWL_RECORDS_URL": url, "VCRAWL_RECORDS_STATEMENT_TIMEOUT_S": "10"})
    assert settings.records_url == url and settings.records_statement_timeout_s == 10
    assert SECRET not in repr(settings)
    assert Settings.from_env(settings.to_env()) == settings  # a child process gets it (workers of vcrawl crawl)
    assert Settings().records_url is None  # unset: JSON Lines parts, as before


@pytest.mark.parametrize("variable", ["VCRAWL_RECORDS_CONNECT_TIMEOUT_S", "VCRAWL_RECORDS_STATEMENT_TIMEOUT_S"])
def test_records_timeouts_are_bounded(variable: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        Settings.from_env({variable: "0"})


def test_an_unreachable_records_database_is_retried_past_the_batch_budget() -> None:
    policy = batch_analysis_retry()
    past_budget = policy.retries + 5
    assert _edge_retry_delay(RecordsUnavailable("postgresql://crawler:***@db/crawl", "down"), past_budget) == \
        policy.backoff_max_s  # fmt: skip
    assert _edge_retry_delay(StorageFailed("jobs/j", "down"), past_budget) is None  # other trouble: its budget
    assert _edge_retry_delay(RecordsUnavailable("t", "down"), 1) == pytest.approx(policy.backoff_s, rel=0.5)
