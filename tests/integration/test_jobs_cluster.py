"""A job on two `celery worker` processes (two pumps): per-host gaps hold cluster-wide."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

from cli.cluster import LocalWorkers
from cli.local_redis import LocalRedis
from tests.cluster import cluster_env
from tests.site import TestSite
from vcrawl.settings import Settings
from views.status import job_status

INTERVAL_S = 0.4

pytestmark = pytest.mark.slow


def _start_job_in_subprocess(env: dict[str, str], job: dict) -> str:
    import json
    import subprocess
    import sys

    from tests.cluster import REPO

    code = "import json, sys, tasks; print(tasks.start_job(json.loads(sys.argv[1])))"
    done = subprocess.run([sys.executable, "-c", code, json.dumps(job)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout.split()[-1]


def test_two_worker_processes_keep_every_hosts_interval(tmp_path: Path) -> None:
    import redis
    from celery import Celery

    from frontier import Frontier
    from vcrawl.settings import celery_redis_url

    hosts = [TestSite(f"127.0.0.{n}") for n in (1, 2, 3)]
    with LocalRedis(tmp_path / "redis") as server:
        for site in hosts:
            site.__enter__()
            site.add_page("/", "".join(f'<a href="/p{n}.html">p</a>' for n in range(8)))
            for n in range(8):
                site.add_page(f"/p{n}.html", "<p>leaf</p>")
        try:
            env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data")))
            app = Celery(broker=celery_redis_url(server.url))

            def ping(names: list[str]) -> set[str]:
                return {name for reply in app.control.ping(destination=names, timeout=0.5) for name in reply}

            with LocalWorkers(2, 4, env, tmp_path / "logs", ping) as workers:
                assert len(workers.pids) == 2
                job_id = _start_job_in_subprocess(
                    env,
                    {
                        "seeds": [site.url("/") for site in hosts],
                        "scope": {"hosts": ["127.0.0.1", "127.0.0.2", "127.0.0.3"]},
                        "politeness": {"min_interval_s": INTERVAL_S, "jitter": 0.25},
                    },
                )
                frontier = Frontier(redis.Redis.from_url(server.url, decode_responses=True))
                deadline = time.monotonic() + 60
                while (status := job_status(frontier, job_id))["state"] == "running":
                    assert time.monotonic() < deadline, status
                    time.sleep(0.1)
        finally:
            for site in hosts:
                site.__exit__()

    assert status["state"] == "completed" and status["pages_stored"] == 27
    started = min(seen.at for site in hosts for seen in site.seen)
    for site in hosts:
        arrivals = sorted(seen.at for seen in site.seen)  # robots.txt included: it is a request too
        assert len(arrivals) == 10
        gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
        assert min(gaps) >= INTERVAL_S, (site.base, gaps)
    # The hosts were crawled side by side, not one after another.
    finished = max(seen.at for site in hosts for seen in site.seen)
    assert finished - started < 10 * INTERVAL_S * 1.25 * 2
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("*.log"))
    assert "Traceback" not in logs, logs[-3000:]
    assert os.path.isdir(tmp_path / "data" / "jobs" / job_id / "pages")
