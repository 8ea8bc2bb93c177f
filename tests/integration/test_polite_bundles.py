"""A polite job's hosts get several URLs per batch, fetched one pause apart, and their batches travel
in bundles: one task fetches many hosts side by side, each at its pace.

Real processes: a private redis-server, a `celery -A tasks worker` subprocess, test sites on
127.0.0.2-5; gaps are measured where the requests arrive.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cli.local_redis import LocalRedis
from engine.fetch_batch import UNPACED_SPAN_S
from engine.jobs import paced_batch_size
from tests.cluster import cluster_env, start_job, start_worker, stop_worker
from tests.faults.test_faults import page, serve_pages
from tests.integration.test_frontier_redis import wait_job
from tests.site import NOT_PAGES, Response, TestSite
from vcrawl.settings import Settings

pytestmark = pytest.mark.slow

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
INTERVAL_S = 0.2


def _crawl(tmp_path: Path, sites: list[TestSite], politeness: dict[str, Any], concurrency: int,
           timeout_s: float) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """A job seeded with the sites' homes, on a private Redis and one worker: (its status, the worker's log)."""
    with LocalRedis(tmp_path / "redis") as server:
        env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data")))
        log = tmp_path / "worker.log"
        worker = start_worker(env, "w1", log, concurrency=concurrency)
        try:
            job_id = start_job(env, {"seeds": [site.url("/") for site in sites], "politeness": politeness})
            status = wait_job(env, job_id, timeout_s)
        finally:
            stop_worker(worker)
    return status, log.read_text(errors="replace").splitlines()


def test_a_polite_job_fetches_its_hosts_side_by_side_each_at_its_pace(tmp_path: Path) -> None:
    sites = [TestSite(host).__enter__() for host in HOSTS]
    try:
        expected = {site.base: serve_pages(site, 16) for site in sites}
        for site in sites:
            site.add_page("/robots.txt", "User-agent: *\nDisallow: /private\n")
        politeness = {"min_interval_s": INTERVAL_S, "jitter": 0, "per_host": 1}
        status, lines = _crawl(tmp_path, sites, politeness, 1, 120)  # one slot: only bundles keep 4 hosts busy
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
    bundles = sum(1 for line in lines if "Task vcrawl.fetch_bundle[" in line and line.endswith("received"))
    singles = sum(1 for line in lines if "Task vcrawl.fetch_batch[" in line and line.endswith("received"))
    pages = sum(map(len, expected.values()))
    gathered = sum(1 for line in lines if "Task vcrawl.analyze_batches[" in line and line.endswith("received"))
    assert bundles > 0, "no bundle"
    assert gathered > 0, "no analyses of batches released together"  # engine.fetch_bundle.AnalysisGatherer
    # Several URLs per host and batch, several hosts per bundle: far fewer fetch tasks than pages.
    assert bundles + singles <= pages / 4, (bundles, singles, pages, paced_batch_size(INTERVAL_S, 32))


def test_an_impolite_job_reads_its_hosts_robots_txt_side_by_side_not_in_a_bundle(tmp_path: Path) -> None:
    # Before robots.txt is read a host is paced (one URL per batch); without a job interval such
    # batches go alone: in a bundle, one request at a time, 100 hosts' first reads queued up for
    # seconds at 100 ms (bench/compare.py case l).
    slow_s = 0.6
    sites = [TestSite(host).__enter__() for host in HOSTS]
    try:
        expected = {site.base: serve_pages(site, 3) for site in sites}
        for site in sites:
            site.add_response("/robots.txt", Response(b"User-agent: *\nDisallow: /private\n", delay_s=slow_s))
        status, lines = _crawl(tmp_path, sites, {"min_interval_s": 0, "jitter": 0, "per_host": 2}, len(HOSTS), 60)
    finally:
        for site in sites:
            site.__exit__(None, None, None)
    assert status["state"] == "completed" and status["pages_stored"] == sum(map(len, expected.values())), status
    robots_reads = sorted(seen.at for site in sites for seen in site.seen if seen.path == "/robots.txt")
    assert len(robots_reads) == len(HOSTS), robots_reads
    assert robots_reads[-1] - robots_reads[0] < slow_s / 2, robots_reads  # side by side, not one after another
    assert not any("Task vcrawl.fetch_bundle[" in line for line in lines)


def test_a_slow_hosts_batch_starts_no_request_after_its_span_and_hands_the_rest_back(tmp_path: Path) -> None:
    # One slot for the host: its queue goes out as one batch; at 0.6 s a page, the batch starts
    # its third request at 1.2 s and hands the rest back after the span (1.5 s, shipped): they come
    # in a batch of their own, which free slots share out (a crawl's tail is not one long batch).
    site = TestSite(HOSTS[0]).__enter__()
    try:
        paths = serve_pages(site, 6)
        for path in paths[1:]:
            site.add_response(path, Response(page("/").encode(), delay_s=0.6))
        site.add_page("/robots.txt", "User-agent: *\nDisallow: /private\n")
        status, _ = _crawl(tmp_path, [site], {"min_interval_s": 0, "jitter": 0, "per_host": 1}, 2, 60)
    finally:
        site.__exit__(None, None, None)
    assert status["state"] == "completed" and status["pages_stored"] == len(paths), status
    assert sorted(seen.path for seen in site.seen if seen.path not in NOT_PAGES) == sorted(paths)  # each once
    # A batch's URLs are released together: one release time (``at``) in the job's fetch log.
    files = (tmp_path / "data").rglob("*.jsonl")
    logged = [json.loads(line) for file in files for line in file.read_text().splitlines()]
    per_release = Counter(line["at"] for line in logged if line.get("url", "").rstrip("/") != site.base)
    assert sum(per_release.values()) == len(paths) - 1, logged
    assert UNPACED_SPAN_S == 1.5
    assert max(per_release.values()) == 3, per_release  # started at 0, 0.6 and 1.2 s; the rest went back


def _uniform_ks_statistic(samples: list[float]) -> float:
    """Kolmogorov-Smirnov distance between ``samples`` (in [0, 1]) and the uniform distribution on [0, 1].

    >>> _uniform_ks_statistic([0.125, 0.375, 0.625, 0.875])
    0.125
    """
    ordered, n = sorted(min(1.0, max(0.0, x)) for x in samples), len(samples)
    return max(max((i + 1) / n - x, x - i / n) for i, x in enumerate(ordered))


def test_the_random_pause_spreads_a_hosts_gaps_over_interval_to_interval_times_one_plus_jitter(
    tmp_path: Path,
) -> None:
    # docs/jobs.md: the pause is min_interval_s x (1 + jitter x U[0,1]), counted from the end of the
    # previous request. 100 pages of one host at 0.1 s and jitter 1: gaps in [0.1, 0.2] s, ~15 s.
    interval_s, jitter, pages = 0.1, 1.0, 100
    site = TestSite(HOSTS[0]).__enter__()
    try:
        paths = serve_pages(site, pages)
        site.add_page("/robots.txt", "User-agent: *\nDisallow: /private\n")
        politeness = {"min_interval_s": interval_s, "jitter": jitter, "per_host": 1}
        status, _ = _crawl(tmp_path, [site], politeness, 2, 60)
    finally:
        site.__exit__(None, None, None)
    assert status["state"] == "completed" and status["pages_stored"] == len(paths), status
    # The linked pages, admitted together once the seed was analysed (the seed's own analysis is no pause).
    arrivals = sorted(seen.at for seen in site.seen if seen.path in paths[1:])
    assert len(arrivals) == pages
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    low, high = interval_s, interval_s * (1 + jitter)
    assert min(gaps) >= low * 0.99, sorted(gaps)[:5]
    # Over the top only by the response's own time and the thread's wake-up (the pause runs from the end
    # of the previous request): ~10 ms mostly, up to ~30 ms seen on a loaded 2-core machine, once 52 ms
    # with a benchmark running beside the suite.
    assert sum(gap <= high + 0.01 for gap in gaps) >= 0.9 * len(gaps), sorted(gaps)[-15:]
    assert max(gaps) <= high + 0.1, sorted(gaps)[-5:]
    # Spread over the whole range, as a uniform draw: a fixed pause, or one stuck at either end, fails.
    position = [(gap - low) / (high - low) for gap in gaps]
    quartiles = Counter(min(3, int(4 * max(0.0, p))) for p in position)
    assert all(len(gaps) * 0.1 <= quartiles[q] <= len(gaps) * 0.4 for q in range(4)), quartiles
    # KS against U[0,1] at alpha = 0.001 (critical value 1.95 / sqrt(n)); the few ms each gap runs
    # over its pause shift the sample by ~0.02 of the range, far inside it.
    distance = _uniform_ks_statistic(position)
    assert distance < 1.95 / len(gaps) ** 0.5, (distance, sorted(position))
