"""Records in PostgreSQL under faults, with real processes: an analysis worker SIGKILLed in the middle
of an analysis, and the records database down for a while mid-job. Either way the job completes
with exactly one row per analysed page, and the URL's password shows up in no worker's log.

Each test runs its own redis-server, `celery worker` subprocesses, a local site and a private
PostgreSQL server (tests/postgres.py).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
import redis

from cli.local_redis import LocalRedis
from frontier import Frontier
from tests.cluster import REPO, cluster_env, start_worker, stop_worker
from tests.conftest import PLUGIN_SITE
from tests.faults.test_faults import (
    TAKEOVER_S,
    Note,
    lines,
    serve_pages,
    start_job,
    stop_gracefully,
    wait_done,
)
from tests.postgres import PostgresServer
from tests.site import TestSite
from tests.waiting import wait_until
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = [pytest.mark.slow, pytest.mark.faults]

SECRET = "pg-s3cret-4b9a"  # trust authentication: accepted and not checked, so it can only leak


def _rows(url: str, job_id: str) -> list[tuple[str, str, int]]:
    with psycopg.connect(url.replace(SECRET, "x"), connect_timeout=5) as connection:
        return connection.execute("SELECT url, url_id, record_index FROM vcrawl_records WHERE job = %s",
                                  [job_id]).fetchall()  # fmt: skip


def _logs(tmp_path: Path) -> str:
    return "".join(path.read_text(errors="replace") for path in tmp_path.glob("*.log"))


def test_an_analysis_worker_killed_mid_analysis_leaves_one_row_per_page(
    tmp_path: Path, postgres_server: PostgresServer, fault_report: Note
) -> None:
    started_log = tmp_path / "analyses-started.txt"
    url = postgres_server.create_database("t_fault_kill").replace("postgres@", f"postgres:{SECRET}@")
    with LocalRedis(tmp_path / "redis") as server, TestSite() as site:
        shipped = Settings(redis_url=server.url, data=str(tmp_path / "data"))  # the shipped timeouts and backoffs
        env = {**cluster_env(shipped), "VCRAWL_RECORDS_URL": url,
               "PYTHONPATH": f"{REPO}{os.pathsep}{PLUGIN_SITE}", "VCRAWL_TEST_ANALYSIS_LOG": str(started_log),
               "VCRAWL_TEST_ANALYSIS_SLEEP_S": "0.8"}  # fmt: skip
        paths = serve_pages(site, 20)
        job = {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.02, "jitter": 0},
               "rules": [{"pattern": "", "analyzer": "slow_words"}]}  # fmt: skip
        fetcher = start_worker(env, "fetcher", tmp_path / "fetcher.log", queues="download,download.dynamic")
        analysts = [start_worker(env, "analyst-0", tmp_path / "analyst-0.log", queues="analysis")]
        try:
            job_id = start_job(env, job)
            deadline = time.monotonic() + 30
            while len(lines(started_log)) < 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.1)  # inside the 0.8 s analysis whose start was logged last (as test_faults)
            os.kill(analysts[0].pid, signal.SIGKILL)
            analysts[0].wait(10)
            interrupted = lines(started_log)[-1]
            rows_at_kill = len(_rows(url, job_id))
            analysts.append(start_worker(env, "analyst-1", tmp_path / "analyst-1.log", queues="analysis"))
            frontier = Frontier(redis.Redis.from_url(server.url))
            status = wait_done(lambda: frontier, job_id, TAKEOVER_S + 40)
        finally:
            stop_worker(fetcher)
            for analyst in analysts:
                stop_gracefully(analyst)
    started = Counter(lines(started_log))
    rows = _rows(url, job_id)
    fault_report(fault="analysis worker SIGKILLed during an analysis, records in PostgreSQL",
                 state=status["state"], pages_expected=len(paths), rows_at_kill=rows_at_kill, rows=len(rows),
                 interrupted_analysis_runs=started[interrupted])  # fmt: skip
    assert status["state"] == "completed", status
    assert status["pages_stored"] == len(paths) and status["failed"] == {}
    assert started[interrupted] >= 2  # the killed analysis ran again
    assert rows_at_kill < len(paths)  # the kill came while rows were still to be written
    assert sorted(urlsplit(page).path for page, _, _ in rows) == sorted(paths)  # one row per page, no repeat
    assert all(len(uid) == 16 and index == 0 for _, uid, index in rows)
    assert SECRET not in _logs(tmp_path)


def test_the_records_database_down_mid_job_holds_the_batches_until_it_is_back(
    tmp_path: Path, postgres_server: PostgresServer, fault_report: Note
) -> None:
    with PostgresServer(postgres_server.bindir) as database, LocalRedis(tmp_path / "redis") as server, \
            TestSite() as site:  # fmt: skip
        url = database.create_database("t_fault_down").replace("postgres@", f"postgres:{SECRET}@")
        shipped = Settings(redis_url=server.url, data=str(tmp_path / "data"))  # the shipped timeouts and backoffs
        env = {**cluster_env(shipped), "VCRAWL_RECORDS_URL": url}
        paths = serve_pages(site, 12)
        job = {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.02, "jitter": 0},
               "rules": [{"pattern": "", "analyzer": "fields", "fields": {"title": "a"}}]}  # fmt: skip
        worker = start_worker(env, "worker", tmp_path / "worker.log")
        try:
            database.stop()
            job_id = start_job(env, job)
            frontier = Frontier(redis.Redis.from_url(server.url))
            # The seed's batch was fetched and its analysis failed to store its record: it waits.
            wait_until(lambda: "records database postgresql://postgres:***@" in _logs(tmp_path), 30,
                       "a worker failing to store records")
            down_s = 4.0
            time.sleep(down_s)
            held = job_status(frontier, job_id)
            database.start()
            status = wait_done(lambda: frontier, job_id, 90)
            rows = _rows(url, job_id)
        finally:
            stop_gracefully(worker)
    logs = _logs(tmp_path)
    retries = logs.count("retrying in")
    fault_report(fault=f"records database down {down_s:g} s at the start of a job", state=status["state"],
                 pages_expected=len(paths), rows=len(rows), analysis_retries=retries)  # fmt: skip
    assert held is not None and held["state"] == "running"  # not finished while its records could not be stored
    assert status["state"] == "completed", status
    assert status["pages_stored"] == len(paths) and status["records"] == len(paths)
    assert sorted(urlsplit(page).path for page, _, _ in rows) == sorted(paths)  # nothing lost, no repeat
    assert retries >= 1 and "RecordsUnavailable" in logs
    assert SECRET not in logs
