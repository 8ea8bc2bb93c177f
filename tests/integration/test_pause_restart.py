"""Pause a job, restart every worker and Redis (AOF), resume: nothing lost, nothing fetched twice."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from cli.local_redis import LocalRedis
from frontier import Frontier
from tests.cluster import REPO, cluster_env, start_worker, stop_worker
from tests.site import NOT_PAGES, TestSite
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = pytest.mark.slow

PAGES = 40


def page(*links: str) -> str:
    return "<html><body>" + "".join(f'<a href="{href}">{href}</a>' for href in links) + "</body></html>"


def start_job(env: dict[str, str], job: dict) -> str:
    code = "import json, sys, tasks; print(tasks.start_job(json.loads(sys.argv[1])))"
    done = subprocess.run([sys.executable, "-c", code, json.dumps(job)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout.split()[-1]


def test_a_paused_job_survives_a_restart_of_every_worker_and_redis(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with TestSite() as site:
        paths = [f"/p{n}" for n in range(PAGES)]
        site.add_page("/", page(*paths))
        for path in paths:
            site.add_page(path, page("/"))
        job = {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.05, "jitter": 0}}

        with LocalRedis(tmp_path / "redis") as server:
            env = cluster_env(Settings(redis_url=server.url, data=str(data)))
            worker = start_worker(env, "before-restart", tmp_path / "worker-1.log")
            try:
                job_id = start_job(env, job)
                frontier = Frontier(redis.Redis.from_url(server.url))
                deadline = time.monotonic() + 20
                while len(site.seen) < 10 and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert frontier.jobs.pause(job_id, time.time())
                deadline = time.monotonic() + 20
                while frontier.queue.in_flight(job_id) and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert frontier.queue.in_flight(job_id) == 0
                seen_while_paused = len(site.seen)
                time.sleep(0.5)
                assert len(site.seen) == seen_while_paused
                paused = job_status(frontier, job_id)
                assert paused["state"] == "paused" and 0 < paused["pages_fetched"] < PAGES + 1
            finally:
                stop_worker(worker)  # SIGKILL: nothing is in flight
        # Redis stopped (SIGTERM: its AOF is complete); a new one replays it on another port.

        with LocalRedis(tmp_path / "redis") as server:
            env = cluster_env(Settings(redis_url=server.url, data=str(data)))
            frontier = Frontier(redis.Redis.from_url(server.url))
            assert job_status(frontier, job_id)["state"] == "paused"
            worker = start_worker(env, "after-restart", tmp_path / "worker-2.log")
            try:
                assert frontier.jobs.resume(job_id) == "running"
                deadline = time.monotonic() + 30
                while (status := job_status(frontier, job_id))["state"] == "running" and time.monotonic() < deadline:
                    time.sleep(0.05)
            finally:
                stop_worker(worker)
        assert status["state"] == "completed", status
        fetched = Counter(seen.path for seen in site.seen if seen.path not in NOT_PAGES)
        assert fetched == Counter({"/": 1, **{path: 1 for path in paths}})  # every page once
        assert status["pages_stored"] == PAGES + 1 and status["pending"] == 0
