"""Per-node statistics and pool resizing on real processes.

A redis-server of its own, ``celery -A tasks worker -P threads`` subprocesses (ring nodes, or a plain
worker), loopback sites that note which worker process sent each request (its socket found among the
workers' processes, ``tests.cluster.identify_clients``) and how many requests they serve at once,
``vcrawl nodes`` and ``vcrawl serve`` as an operator runs them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from cli.local_redis import LocalRedis
from tests.cluster import REPO, cluster_env, identify_clients, ring_listing, start_job, start_worker, stop_worker
from tests.integration.test_ring_cluster import wait_completed
from tests.site import Response, TestSite, link_page
from tests.waiting import wait_until
from vcrawl.settings import Settings

pytestmark = pytest.mark.slow

PAGES = 6  # per host, besides its home page and a missing page
NOT_FOUND = b"not found"  # what TestSite answers for a path it does not serve (404)


@pytest.fixture
def sites() -> Iterator[tuple[list[TestSite], dict[tuple[str, str], bytes]]]:
    """Six sites whose pages differ in size, each linking to a page it does not have; and every body served."""
    with ExitStack() as stack:
        hosts = [stack.enter_context(TestSite(f"127.0.5.{n}")) for n in range(1, 7)]
        bodies: dict[tuple[str, str], bytes] = {}
        for index, site in enumerate(hosts):
            neighbour = hosts[(index + 1) % len(hosts)]
            pages = {"/": link_page(*[f"/p{i}" for i in range(PAGES)], "/missing", neighbour.url("/"))}
            pages |= {f"/p{i}": link_page("/") + "x" * (700 * (i + 1) + 37 * index) for i in range(PAGES)}
            for path, body in pages.items():
                site.add_page(path, body)
                bodies[(site.base, path)] = body.encode()
            robots = "User-agent: *\nDisallow: /private/\n"
            site.add_page("/robots.txt", robots, content_type="text/plain")
            bodies[(site.base, "/robots.txt")] = robots.encode()
        yield hosts, bodies


def _node_stats(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each member's statistics from ``vcrawl nodes --json``, by the name it was started with."""
    return {row["name"].split("@")[0]: row["stats"] or {} for row in ring_listing(env)["nodes"]}


def _counted_at_least(env: dict[str, str], requests: int) -> dict[str, dict[str, Any]] | None:
    """The members' statistics once they count ``requests`` requests in all, else None."""
    stats = _node_stats(env)
    return stats if sum(row.get("requests", 0) for row in stats.values()) >= requests else None


def test_two_nodes_count_the_requests_bytes_pages_failures_and_hosts_the_sites_saw_from_each(
    tmp_path: Path, sites: tuple[list[TestSite], dict[tuple[str, str], bytes]]
) -> None:
    hosts, bodies = sites
    with LocalRedis(tmp_path / "redis") as server:
        base = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data")))  # the shipped timeouts
        workers = {}
        try:
            for name in ("n1", "n2"):
                workers[name] = start_worker({**base, "VCRAWL_NODE_WEIGHT": "100"}, name, tmp_path / f"{name}.log",
                                             concurrency=4)  # fmt: skip
            for site in hosts:
                identify_clients(site, {process.pid: name for name, process in workers.items()})
            job_id = start_job(base, {"seeds": [site.url("/") for site in hosts],
                                      "politeness": {"min_interval_s": 0.05, "jitter": 0, "per_host": 1}})  # fmt: skip
            status = wait_completed(server.url, job_id, 120)
            seen = [(site, request) for site in hosts for request in site.seen]
            # The counters are written with each heartbeat (every 2 s at most): the last ones land within seconds.
            stats = wait_until(lambda: _counted_at_least(base, len(seen)), 15, "every request counted", poll_s=0.5)
        finally:
            for process in workers.values():
                stop_worker(process)

    assert status["state"] == "completed", status
    assert None not in {request.client for _, request in seen}  # every request's sender was found
    for name in ("n1", "n2"):
        mine = [(site, request) for site, request in seen if request.client == name]
        expected = {
            "requests": len(mine),
            "bytes": sum(len(bodies.get((site.base, request.path), NOT_FOUND)) for site, request in mine),
            "successes": sum(1 for site, request in mine if request.path == "/" or request.path.startswith("/p")),
            "failures": sum(1 for _, request in mine if request.path == "/missing"),  # a 404 fails for good
            "hosts_visited": len({site.base for site, _ in mine}),
        }
        assert {key: stats[name][key] for key in expected} == expected, name
        assert expected["requests"] > 0  # the ring gave both nodes hosts
        assert stats[name]["busy_s"] > 0
        assert stats[name]["bandwidth_bps"] == pytest.approx(expected["bytes"] / stats[name]["busy_s"], rel=0.01)
        assert sum(minute["requests"] for minute in stats[name]["minutes"]) == expected["requests"]
        assert stats[name]["recent"]["successes"] == expected["successes"] and stats[name]["pages_per_s"] > 0
    assert sum(stats[name]["successes"] for name in ("n1", "n2")) == status["pages_stored"]
    assert sum(stats[name]["failures"] for name in ("n1", "n2")) >= len(hosts)  # each site's missing page


SLOW_S = 0.25  # each page's answer: a fetch holds its slot that long


def _resize_by_cli(env: dict[str, str], node: str, size: int) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "cli", "nodes", "resize", node, str(size), "--json"], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def _resize_by_api(api_url: str, node: str, size: int) -> dict[str, Any]:
    request = urllib.request.Request(f"{api_url}/api/nodes/{node}/concurrency", method="POST",
                                     data=json.dumps({"concurrency": size}).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _most_at_once(site: TestSite, settle_s: float, measure_s: float) -> int:
    """Wait ``settle_s`` (slots going or coming), then return the most requests served at once over ``measure_s``."""
    start = time.monotonic() + settle_s
    time.sleep(settle_s + measure_s)
    return site.most_in_flight(start, start + measure_s)


def test_a_worker_grown_and_shrunk_while_it_crawls_fetches_more_then_fewer_pages_at_once(tmp_path: Path) -> None:
    with TestSite("127.0.5.20") as site, LocalRedis(tmp_path / "redis") as server:
        paths = [f"/p{i}" for i in range(600)]  # more than the test fetches: the job never runs dry
        site.add_page("/", link_page(*paths))
        for path in paths:
            site.add_response(path, Response(b"<html><body>slow</body></html>", delay_s=SLOW_S))
        env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data")))
        worker = start_worker(env, "slots", tmp_path / "worker.log", concurrency=2)
        serve = [sys.executable, "-u", "-m", "cli", "serve", "--port", "0", "--insecure-local"]
        api = subprocess.Popen(serve, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            api_url = api.stdout.readline().split(" on ", 1)[1].split()[0].rstrip("/")  # type: ignore[union-attr]
            [node] = [row["name"] for row in ring_listing(env)["nodes"]]
            job_id = start_job(env, {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0, "per_host": 16}})
            wait_until(lambda: len(site.seen) > 5, 30, "the crawl under way")
            at_two = _most_at_once(site, 1.0, 3.0)

            grown = _resize_by_api(api_url, node, 6)
            at_six = _most_at_once(site, 1.0, 3.0)
            threads_listed = wait_until(lambda: ring_listing(env)["nodes"][0]["concurrency"] == 6, 10, "6 slots listed",
                                        poll_s=0.5)  # fmt: skip

            shrunk = _resize_by_cli(env, node, 1)
            # A batch starts no URL after 1.5 s (engine.fetch_batch.UNPACED_SPAN_S): by then the slots gone are free.
            at_one = _most_at_once(site, 2.5, 3.0)
            stats = _node_stats(env)["slots"]
        finally:
            api.terminate()
            api.wait(10)
            stop_worker(worker)
        assert job_id

    assert (grown["before"], grown["concurrency"], shrunk["before"], shrunk["concurrency"]) == (2, 6, 6, 1)
    assert threads_listed
    seen_at_once = (at_two, at_six, at_one)
    assert seen_at_once == (2, 6, 1), f"at once: {seen_at_once}\n" + worker_log_tail(tmp_path / "worker.log")
    assert stats["requests"] > 0 and stats["successes"] > 0


def worker_log_tail(log: Path) -> str:
    """The worker log's last lines, for a failure's message."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else ""
