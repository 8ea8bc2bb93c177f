"""A polite job's hosts get several URLs per batch, fetched one pause apart, and their batches travel
in bundles: one task fetches many hosts side by side, each at its pace.

Real processes: a private redis-server, a `celery -A tasks worker` subprocess, test sites on
127.0.0.2-5; gaps are measured where the requests arrive.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from cli.local_redis import LocalRedis
from engine.jobs import paced_batch_size
from tests.cluster import cluster_env, start_job, start_worker, stop_worker
from tests.faults.test_faults import serve_pages
from tests.integration.test_frontier_redis import wait_job
from tests.site import NOT_PAGES, TestSite
from vcrawl.settings import Settings

pytestmark = pytest.mark.slow

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
INTERVAL_S = 0.2


def test_a_polite_job_fetches_its_hosts_side_by_side_each_at_its_pace(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "redis") as server:
        sites = [TestSite(host).__enter__() for host in HOSTS]
        try:
            expected = {site.base: serve_pages(site, 16) for site in sites}
            for site in sites:
                site.add_page("/robots.txt", "User-agent: *\nDisallow: /private\n")
            env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data")))
            log = tmp_path / "worker.log"
            worker = start_worker(env, "w1", log, concurrency=1)  # one slot: only bundles keep 4 hosts busy
            try:
                politeness = {"min_interval_s": INTERVAL_S, "jitter": 0, "per_host": 1}
                job_id = start_job(env, {"seeds": [site.url("/") for site in sites], "politeness": politeness})
                status = wait_job(env, job_id, 120)
            finally:
                stop_worker(worker)
        finally:
            for site in sites:
                site.__exit__(None, None, None)
    assert status["state"] == "completed" and status["pages_stored"] == sum(map(len, expected.values())), status
    for site in sites:
        paths = [seen.path for seen in site.seen if seen.path not in NOT_PAGES]
        assert sorted(paths) == sorted(expected[site.base]), site.base  # every page, once
        arrivals = sorted(seen.at for seen in site.seen)  # robots.txt and sitemap too
        gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
        assert min(gaps) >= INTERVAL_S * 0.99, (site.base, sorted(gaps)[:3])
    lines = log.read_text(errors="replace").splitlines()
    bundles = sum(1 for line in lines if "Task vcrawl.fetch_bundle[" in line and line.endswith("received"))
    singles = sum(1 for line in lines if "Task vcrawl.fetch_batch[" in line and line.endswith("received"))
    pages = sum(map(len, expected.values()))
    gathered = sum(1 for line in lines if "Task vcrawl.analyze_batches[" in line and line.endswith("received"))
    assert bundles > 0, "no bundle"
    assert gathered > 0, "no analyses of batches released together"  # engine.fetch_bundle.AnalysisGatherer
    # Several URLs per host and batch, several hosts per bundle: far fewer fetch tasks than pages.
    assert bundles + singles <= pages / 4, (bundles, singles, pages, paced_batch_size(INTERVAL_S, 32))
