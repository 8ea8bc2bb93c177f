"""A job's analysis batch that fails for good, in a real chain on real workers: Celery fires its
``link_error`` (``vcrawl.analysis_batch_failed``, docs/task-graph.md), which finishes the batch's
pages so the job completes.

The failure is real storage trouble: between the fetch and the analysis, the stored page's path
comes to hold a Unix socket, which no one can open for reading, root included (unlike a file
without read permission): every read fails with ``OSError`` ENXIO. Storage lets that error through
(a directory or a symlink there would be refused, a permanent error counted per page), and the task
edge retries it (``VCRAWL_BATCH_ANALYSIS_RETRIES``) before it gives up. The analysis worker starts
only once the page is stored, so nothing races the swap. This test
gives the batch 2 retries; tests/faults/test_analysis_errback_default.py runs the same at the
shipped 10 (about 5 minutes).
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from frontier import Frontier
from tasks.broker.lost_analyses import analysis_ids_present
from tests.celery_setup import LocalWorkerProcess
from tests.cluster import cluster_env, start_job
from tests.site import TestSite, link_page
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = pytest.mark.slow

MARK = "errback-seed-page"  # in the seed page's body: how its stored file is found
ABANDONED = re.compile(r"analysis of batch \S+ of job \S+ failed for good: (?P<error>.*)")  # abandon_analysis


@dataclass(frozen=True)
class Abandoned:
    """What came of the job whose analysis batch failed for good."""

    status: dict[str, Any]
    log: str  # the analysis worker's
    failing_s: float  # from the analysis worker's start to the job's completion
    retries: int  # the retries Celery logged for the analysis


def wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def stored_seed_page(data: Path) -> Path | None:
    """The file the fetch stored the seed page in (its body holds MARK), if stored yet."""
    for path in data.rglob("*"):
        if path.is_file() and MARK.encode() in path.read_bytes():
            return path
    return None


def with_a_socket(page: Path) -> None:
    """Every open of the page fails with ENXIO: an OSError, retried by the analysis task."""
    os.mknod(page, 0o644 | stat.S_IFSOCK)


def with_a_directory(page: Path) -> None:
    """The storage refuses the page (``StorageRefused``, a permanent error): counted for that page alone."""
    page.mkdir()


def crawl_with_an_unreadable_page(
    tmp_path: Path, settings: Settings, timeout_s: float, spoil: Callable[[Path], None] = with_a_socket
) -> Abandoned:
    """Crawl one page whose stored copy ``spoil`` makes unreadable before its analysis runs; wait for the job's end."""
    data = tmp_path / "data"
    with LocalRedis(tmp_path / "redis") as server, TestSite() as site:
        site.add_page("/", f"<html><body><p>{MARK}</p>{link_page('/next.html')}</body></html>")
        site.add_page("/next.html", "<p>never reached: the seed's links die with its analysis</p>")
        env = cluster_env(replace(settings, redis_url=server.url, data=str(data)))
        client = redis.Redis.from_url(server.url, decode_responses=True)
        fetcher = LocalWorkerProcess(env, tmp_path / "fetcher.log", "fetcher", ["download"])
        analyst = LocalWorkerProcess(env, tmp_path / "analyst.log", "analyst", ["analysis"])
        try:
            fetcher.start()
            job_id = start_job(env, {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0}})
            page = wait_for(lambda: stored_seed_page(data), 30, "the seed page stored")
            page.rename(page.with_name(page.name + ".moved"))
            spoil(page)
            started = time.monotonic()
            analyst.start()
            frontier = Frontier(redis.Redis.from_url(server.url))

            def finished() -> dict[str, Any] | None:
                status = job_status(frontier, job_id)
                return status if status is not None and status["state"] != "running" else None

            status = wait_for(finished, timeout_s, f"job {job_id} finished")
            failing_s = time.monotonic() - started
            assert analysis_ids_present(client) == set()  # no analysis left behind, none sent again
        finally:
            analyst.teardown()
            fetcher.teardown()
        log = analyst.logs()
    retries = len(re.findall(r"vcrawl\.analyze_batch\[[^\]]+\] retry: Retry in", log))
    return Abandoned(status, log, failing_s, retries)


def assert_abandoned_by_the_errback(outcome: Abandoned, retries: int) -> None:
    """What ``analysis_batch_failed`` promises: the batch's pages finished and counted, the job complete."""
    status, log = outcome.status, outcome.log
    assert outcome.retries == retries, log  # the task edge's budget, spent
    # abandon_analysis, run by the errback Celery fired after the last retry:
    abandoned = ABANDONED.search(log)
    assert abandoned is not None and abandoned["error"].startswith("OSError: [Errno 6] No such device"), log
    assert status["state"] == "completed"
    assert status["pages_stored"] == 1 and status["analysis_failed"] == {"batch": 1}
    assert status["analysed"] == 0 and status["records"] == 0
    assert status["admitted"] == 1 and status["pending"] == 0 and status["queued"] == 0  # /next.html never came


def test_an_analysis_batch_out_of_retries_is_finished_by_its_link_error(tmp_path: Path) -> None:
    outcome = crawl_with_an_unreadable_page(tmp_path, Settings(batch_analysis_retries=2), timeout_s=60)

    assert_abandoned_by_the_errback(outcome, retries=2)
    assert outcome.failing_s < 30  # 2 retries: about 1 + 2 s of backoff


def test_a_page_the_storage_refuses_fails_alone_and_its_batch_completes(tmp_path: Path) -> None:
    """A refused page is one page's failure: its batch was failed whole (the errback then counted every
    page of it as ``batch``) because following the page's links read it again and raised."""
    outcome = crawl_with_an_unreadable_page(tmp_path, Settings(), 60, with_a_directory)  # the shipped retries
    status = outcome.status

    assert outcome.retries == 0 and ABANDONED.search(outcome.log) is None, outcome.log
    assert status["state"] == "completed" and status["pages_stored"] == 1
    assert status["analysis_failed"] == {"storage_refused": 1} and status["records"] == 0
    assert status["admitted"] == 1 and status["pending"] == 0  # no links could be read from it
