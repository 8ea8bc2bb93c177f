"""The cluster log stream across a Redis restart: a worker keeps logging locally, crawls on, and says what it lost.

Its own redis-server (AOF on, restarted on the same port), a `celery worker` subprocess at shipped log
settings and a local site; the fixtures stop every process they started, also when the test fails.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import redis

from telemetry.log_stream import LogQuery, read_entries
from tests.cluster import cluster_env, start_job, start_worker
from tests.faults import test_daily_stats_restart as restart
from tests.faults.test_daily_stats_restart import RestartableRedis
from tests.faults.test_faults import fault_settings, serve_pages, wait_done
from tests.site import TestSite

pytestmark = [pytest.mark.faults]

redis_aof, workers = restart.redis_aof, restart.workers  # its fixtures: a restartable Redis, the workers started


def test_redis_away_drops_stream_lines_but_not_the_workers_logs_or_its_work(
    tmp_path: Path,
    redis_aof: RestartableRedis,
    workers: list[subprocess.Popen[bytes]],
) -> None:
    settings = fault_settings(redis_aof.server, tmp_path / "data")
    env, log = cluster_env(settings), tmp_path / "worker.log"
    workers.append(start_worker(env, "lost-redis", log, concurrency=4, loglevel="WARNING"))
    with TestSite() as site:
        serve_pages(site, 5)

        redis_aof.restart(down_s=3.0)  # the worker's "connection lost" lines cannot be shipped meanwhile
        job = start_job(env, {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0, "jitter": 0}})
        status = wait_done(redis_aof.frontier, job, timeout_s=60)

        assert status["state"] == "completed" and status["pages_stored"] == 6  # its tasks went on
        assert workers[0].poll() is None
        local = log.read_text()
        assert "Connection to broker lost" in local or "Cannot connect to redis" in local  # logged locally

        client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        deadline, notices = time.monotonic() + 20, []
        while not notices and time.monotonic() < deadline:
            entries = read_entries(client, LogQuery(node="lost-redis"), limit=200)
            notices = [fields for _, fields in entries if "were dropped" in fields["msg"]]
            time.sleep(0.2)
        assert notices, "no line says how many lines were lost while Redis was away"
        assert notices[0]["level"] == "WARNING" and int(notices[0]["msg"].split()[0]) > 0
