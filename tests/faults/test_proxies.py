"""A proxy of a job's pool stopped mid-crawl, with two worker processes sharing the bench in Redis.

`make test-faults` runs it (marker ``faults``): its own redis-server, two `celery worker`
subprocesses, two sites and three forwarding proxies on loopback, a 2 s cool-off.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from frontier import Frontier
from tests.cluster import REPO, cluster_env, start_worker, stop_worker
from tests.proxy import ForwardProxy
from tests.site import Response, TestSite
from vcrawl import redis_keys
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = [pytest.mark.slow, pytest.mark.faults]

COOLOFF_S = 2.0
REFRESH_S = 1.0  # how long a worker process trusts its copy of the bench
PAGES = 150  # per site: the crawl outlasts the cool-off


def serve_pages(site: TestSite, count: int, delay_s: float) -> None:
    paths = [f"/p{n}" for n in range(count)]
    site.add_page("/", "".join(f'<a href="{path}">{path}</a>' for path in paths))
    for path in paths:
        site.add_response(path, Response(f"<html><body>{path}</body></html>".encode(), delay_s=delay_s))


def start_job(env: dict[str, str], job: dict[str, Any]) -> str:
    code = "import json, sys, tasks; print(tasks.start_job(json.loads(sys.argv[1])))"
    done = subprocess.run([sys.executable, "-c", code, json.dumps(job)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout.split()[-1]


def test_a_stopped_proxy_is_benched_for_every_worker_and_used_again_after_its_cooloff(tmp_path: Path) -> None:
    with (
        LocalRedis(tmp_path / "redis") as server,
        TestSite("127.0.0.1") as one,
        TestSite("127.0.0.2") as two,
        ForwardProxy() as first,
        ForwardProxy(stop_after=10) as stopping,
        ForwardProxy() as third,
    ):
        settings = Settings(redis_url=server.url, data=str(tmp_path / "data"), proxy_cooloff_s=COOLOFF_S,
                            proxy_cooloff_max_s=4 * COOLOFF_S, connect_timeout_s=0.5, read_timeout_s=2.0,
                            total_timeout_s=4.0, fetch_backoff_s=0.2, fetch_backoff_max_s=1.0)  # fmt: skip
        env = cluster_env(settings)
        for site in (one, two):
            serve_pages(site, PAGES, delay_s=0.03)
        client = redis.Redis.from_url(server.url, decode_responses=True)
        workers = [start_worker(env, f"proxied-{n}", tmp_path / f"worker-{n}.log") for n in range(2)]
        try:
            job = {"seeds": [one.url("/"), two.url("/")], "proxies": [first.url, stopping.url, third.url],
                   "politeness": {"min_interval_s": 0}}  # fmt: skip
            job_id = start_job(env, job)
            assert stopping.stopped.wait(30), "the proxy did not reach its 10th request"
            deadline = time.monotonic() + 10
            while (raw := client.hget(redis_keys.proxy_health(), stopping.url)) is None:
                assert time.monotonic() < deadline, "the stopped proxy was not benched"
                time.sleep(0.005)
            seconds, micros = client.time()
            bench_ends = time.monotonic() + (int(raw.split(":")[0]) - (seconds * 1000 + micros // 1000)) / 1000
            # Back on the same port once every process has read the bench (within REFRESH_S; 0.5 s
            # more for a slow process), still ~0.5 s inside the 2 s cool-off; benched until bench_ends.
            time.sleep(REFRESH_S + 0.5)
            stopping.start()
            restarted = time.monotonic()
            frontier = Frontier(client)
            deadline = time.monotonic() + 60
            while (status := job_status(frontier, job_id))["state"] == "running":  # type: ignore[index]
                assert time.monotonic() < deadline, f"job not done within 60 s: {status}"
                time.sleep(0.1)
            record = client.hget(redis_keys.proxy_health(), stopping.url)
        finally:
            for worker in workers:
                stop_worker(worker)
    assert status is not None and status["state"] == "completed", status
    assert status["pages_stored"] == 2 * (PAGES + 1) and status["failed"] == {}, status
    stats = status["proxies"]
    benched = stats[stopping.url]
    # Each worker process (2 threads) fails through it at most once per fetch it had started before it knew:
    # its own failure benches the proxy in that process at once, the other's reaches it within REFRESH_S.
    assert 1 <= benched["failed"] <= 4 and set(benched["reasons"]) == {"proxy_error"}, stats
    after = [seen.at for seen in stopping.seen if seen.at > restarted]
    assert after, "the recovered proxy was not used again after its cool-off"
    # 0.25 s for the clocks' reads and Redis round trips behind bench_ends; a process ignoring the
    # bench would use the proxy as soon as it is back, ~0.5 s before bench_ends.
    early = bench_ends - min(after)
    assert early <= 0.25, f"traffic {early:.3f} s before its cool-off ended"
    assert benched["ok"] == stopping.forwarded > 10
    assert sum(row["ok"] for row in stats.values()) == status["pages_fetched"] == 2 * (PAGES + 1)
    assert record is None  # it worked again: its record is cleared
