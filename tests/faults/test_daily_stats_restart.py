"""Daily statistics survive Redis restarts: a finished job's days, and those of a job Redis was restarted under.

Its own redis-server (AOF on, as ``vcrawl crawl`` and the other fault tests run it), a `celery worker`
subprocess and local sites; the fixtures stop every process they started, also when the test fails.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from frontier import Frontier
from frontier.statistics import stats_day
from tests.cluster import cluster_env, start_job, start_worker, stop_worker
from tests.faults.test_faults import TAKEOVER_S, fault_settings, serve_pages, wait_done
from tests.site import TestSite
from vcrawl import redis_keys
from vcrawl.settings import Settings
from views.daily import job_daily
from views.status import job_status

pytestmark = [pytest.mark.slow, pytest.mark.faults]

RETENTION_DAYS = 3
Note = Callable[..., None]  # the fault_report fixture (tests/faults/conftest.py)


class RestartableRedis:
    """The test's redis-server, restarted on the same port and AOF directory; the fixture stops the last one."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.server = LocalRedis(directory).start()
        self.port = self.server.port

    def restart(self, down_s: float = 1.0) -> None:
        self.server.stop()  # SIGTERM: Redis writes its AOF and exits
        time.sleep(down_s)
        self.server = LocalRedis(self.directory, port=self.port).start()  # the AOF replayed

    def frontier(self) -> Frontier:
        return Frontier(redis.Redis.from_url(self.server.url))


@pytest.fixture
def redis_aof(tmp_path: Path) -> Iterator[RestartableRedis]:
    holder = RestartableRedis(tmp_path / "redis")
    try:
        yield holder
    finally:
        holder.server.stop()


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes the test starts; each is killed (by PID) afterwards."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for process in started:
            stop_worker(process)


def sums(report: dict[str, Any]) -> dict[str, Any]:
    """The days added up, in the words of ``vcrawl status --json``."""
    totals = report["totals"]
    return {key: totals[key] for key in ("pages_fetched", "pages_stored", "bytes", "failed")}


def of_status(status: dict[str, Any]) -> dict[str, Any]:
    return {key: status[key] for key in ("pages_fetched", "pages_stored", "bytes", "failed")}


def test_daily_stats_survive_redis_restarts(
    tmp_path: Path, redis_aof: RestartableRedis, workers: list[subprocess.Popen[bytes]], fault_report: Note
) -> None:
    settings = replace(fault_settings(redis_aof.server, tmp_path / "data"), stats_retention_days=RETENTION_DAYS)
    env = cluster_env(settings)
    workers.append(start_worker(env, "daily", tmp_path / "worker.log"))
    politeness = {"min_interval_s": 0.05, "jitter": 0}
    limits = {"total_timeout_s": 2.0, "read_timeout_s": 1.5}
    with TestSite() as first, TestSite("127.0.0.2") as second:
        serve_pages(first, 20)
        first.add_page("/gone", "gone", status=410)
        serve_pages(second, 60)
        done = start_job(env, {"seeds": [first.url("/"), first.url("/gone")], "politeness": politeness,
                               "limits": limits})  # fmt: skip
        done_status = wait_done(redis_aof.frontier, done, 60)
        before = job_daily(redis_aof.frontier(), done, 2, time.time())

        running = start_job(env, {"seeds": [second.url("/")], "politeness": politeness, "limits": limits})
        deadline = time.monotonic() + 20
        while len(second.seen) < 15 and time.monotonic() < deadline:
            time.sleep(0.02)
        redis_aof.restart()  # mid-job
        back_at = time.monotonic()
        running_status = wait_done(redis_aof.frontier, running, TAKEOVER_S + 60)
        fault_report(fault="Redis stopped (SIGTERM) mid-job and after, restarted on the same port (AOF)",
                     completed_s_after_restart=round(time.monotonic() - back_at, 1))  # fmt: skip
        redis_aof.restart()  # with nothing running: every day key must come back from the AOF

    frontier = redis_aof.frontier()
    assert done_status["state"] == "completed" and done_status["failed"] == {"http_410": 1}
    assert before is not None and sums(before) == of_status(done_status)
    assert job_daily(frontier, done, 2, time.time()) == before  # the finished job's days, unchanged
    assert running_status["state"] == "completed", running_status
    after = job_daily(frontier, running, 2, time.time())
    assert after is not None and sums(after) == of_status(job_status(frontier, running) or {})
    assert sums(after)["pages_stored"] == 61
    client = redis.Redis.from_url(redis_aof.server.url)
    day = stats_day(time.time())
    kept_s = RETENTION_DAYS * 86400 + 86400 - time.time() % 86400  # the retention, from the end of the day
    for job in (done, running):
        for key in (redis_keys.job_day_stats(job, day), redis_keys.job_day_host_stats(job, day)):
            # Up to 1.5 s over: the TTL was set counting from the whole second it started in
            # (frontier.queue's _day_ttl_s), and TTL rounds to the nearest second.
            assert kept_s - 300 <= client.ttl(key) <= kept_s + 2, key
    fault_report(pages_stored=running_status["pages_stored"], days_kept=len(after["days"]))


def test_daily_stats_survive_a_redis_restart_at_the_shipped_settings(
    tmp_path: Path, redis_aof: RestartableRedis, workers: list[subprocess.Popen[bytes]]
) -> None:
    """The twin at vcrawl's shipped settings (timeouts, visibility, the 90-day retention): a finished
    job's days come back whole from the AOF. (The test above shortens the timeouts for its mid-job restart.)"""
    settings = Settings(redis_url=redis_aof.server.url, data=str(tmp_path / "data"))
    env = cluster_env(settings)
    workers.append(start_worker(env, "daily-shipped", tmp_path / "worker.log"))
    with TestSite() as site:
        serve_pages(site, 10)
        site.add_page("/gone", "gone", status=410)
        done = start_job(env, {"seeds": [site.url("/"), site.url("/gone")], "politeness": {"min_interval_s": 0.0}})
        status = wait_done(redis_aof.frontier, done, 60)
        before = job_daily(redis_aof.frontier(), done, 2, time.time())
    redis_aof.restart()

    assert status["state"] == "completed" and status["failed"] == {"http_410": 1}
    assert before is not None and sums(before) == of_status(status)
    assert job_daily(redis_aof.frontier(), done, 2, time.time()) == before
    client = redis.Redis.from_url(redis_aof.server.url)
    key = redis_keys.job_day_stats(done, stats_day(time.time()))
    kept_s = 90 * 86400 + 86400 - time.time() % 86400  # the retention, from the end of the day
    assert settings.stats_retention_days == 90 and kept_s - 300 <= client.ttl(key) <= kept_s + 2  # as above
