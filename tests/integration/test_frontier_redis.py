"""The frontier on a Redis of its own (``VCRAWL_FRONTIER_URL``): the broker's Redis keeps Celery's
queues and the cluster's bookkeeping, the frontier's keeps every job's queues, leases, politeness,
Bloom filters and robots.txt, and nothing of the one lands on the other.

Real processes: two private redis-servers, a `celery -A tasks worker` subprocess, the CLI and the
façade in subprocesses given only the environment, a test site on 127.0.0.2.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from tests.cluster import REPO, cluster_env, ring_listing, start_job, start_worker, stop_worker, submit, wait_all
from tests.faults.test_faults import serve_pages
from tests.site import TestSite
from vcrawl.settings import Settings

pytestmark = pytest.mark.slow

ROBOTS = "User-agent: *\nDisallow: /private\n"
FRONTIER_ONLY = ("vcrawl:job:", "vcrawl:jobs", "vcrawl:gate:", "vcrawl:free:", "vcrawl:robots:")
BROKER_ONLY = ("vcrawl:{nodes}", "unacked", "_kombu", "vcrawl:task:")


@dataclass
class Split:
    broker: redis.Redis
    frontier: redis.Redis
    env: dict[str, str]
    site: TestSite
    expected: list[str]
    log: Path


def keys_of(client: redis.Redis) -> list[str]:
    return sorted(key.decode() for key in client.scan_iter(count=1000))


def cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "cli", *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    return done.stdout


def wait_job(env: dict[str, str], job_id: str, timeout_s: float) -> dict[str, Any]:
    """`vcrawl status JOB --json` until the job is no longer running (the CLI reads the frontier's Redis)."""
    deadline = time.monotonic() + timeout_s
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = json.loads(cli(env, "status", job_id, "--json").strip().splitlines()[-1])
        if status.get("state") not in ("running", None):
            return status
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} not done in {timeout_s}s: {status}")


@pytest.fixture
def split(tmp_path: Path) -> Iterator[Split]:
    with (
        LocalRedis(tmp_path / "broker") as broker_server,
        LocalRedis(tmp_path / "frontier") as frontier_server,
        TestSite("127.0.0.2") as site,
    ):
        site.add_page("/robots.txt", ROBOTS)
        expected = serve_pages(site, 12)
        site.add_page("/private", "<html></html>")
        settings = Settings(redis_url=broker_server.url, frontier_url=frontier_server.url, data=str(tmp_path / "d"))
        env = cluster_env(settings)
        log = tmp_path / "w1.log"
        worker = start_worker(env, "w1", log)
        try:
            with redis.Redis.from_url(broker_server.url) as broker, redis.Redis.from_url(frontier_server.url) as front:
                yield Split(broker, front, env, site, expected, log)
        finally:
            stop_worker(worker)


def test_a_job_and_a_single_task_keep_the_frontier_on_its_own_redis(split: Split) -> None:
    job_id = start_job(split.env, {"seeds": [split.site.url("/")], "politeness": {"min_interval_s": 0.02, "jitter": 0}})
    status = wait_job(split.env, job_id, 90)
    assert status["state"] == "completed", status
    fetched = [seen.path for seen in split.site.seen if seen.path not in ("/robots.txt", "/sitemap.xml")]
    assert sorted(fetched) == sorted(split.expected), fetched  # each page once, /private never
    assert status["pages_stored"] == len(split.expected)

    [task_id] = submit(split.env, [{"url": split.site.url("/p1"), "analyzer": "links"}])
    [record] = wait_all(split.env, [task_id], {"analyzed", "failed"}, 60).values()
    assert record["state"] == "analyzed", record

    broker_keys, frontier_keys = keys_of(split.broker), keys_of(split.frontier)
    misplaced = [key for key in broker_keys if key.startswith(FRONTIER_ONLY)]
    assert misplaced == [], f"frontier keys on the broker's Redis: {misplaced[:10]}"
    misplaced = [key for key in frontier_keys if key.startswith(BROKER_ONLY)]
    assert misplaced == [], f"broker keys on the frontier's Redis: {misplaced[:10]}"
    assert f"vcrawl:job:{{{job_id}}}" in frontier_keys
    assert any(key.startswith("vcrawl:robots:") for key in frontier_keys), frontier_keys
    assert any(key.startswith("vcrawl:gate:") for key in frontier_keys), frontier_keys  # the single task's gate
    assert any(key.startswith("vcrawl:{nodes}") for key in broker_keys), broker_keys  # the ring stays with Celery
    assert any(key.startswith("vcrawl:task:") for key in broker_keys), broker_keys

    nodes = ring_listing(split.env)  # membership from the broker's Redis, jobs and hosts from the frontier's
    assert [(node["name"].split("@")[0], node["alive"]) for node in nodes["nodes"]] == [("w1", True)], nodes


def test_pause_and_resume_through_the_cli_reach_the_frontier_s_redis(split: Split) -> None:
    slow = {"min_interval_s": 0.3, "jitter": 0}
    job_id = start_job(split.env, {"seeds": [split.site.url("/")], "politeness": slow})
    deadline = time.monotonic() + 30
    while len(split.site.seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    cli(split.env, "pause", job_id)
    paused = json.loads(cli(split.env, "status", job_id, "--json").strip().splitlines()[-1])
    assert paused["state"] == "paused", paused
    cli(split.env, "resume", job_id)
    status = wait_job(split.env, job_id, 90)
    assert status["state"] == "completed" and status["pages_stored"] == len(split.expected), status


def test_a_frontier_url_that_is_no_redis_url_stops_the_worker_naming_it(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "broker") as broker:
        env = cluster_env(Settings(redis_url=broker.url, data=str(tmp_path / "d")))
        env["VCRAWL_FRONTIER_URL"] = "http://127.0.0.1:1/"
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "download", "-P", "threads",
             "--without-mingle", "--without-gossip"],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode != 0
    assert "VCRAWL_FRONTIER_URL" in done.stdout + done.stderr
