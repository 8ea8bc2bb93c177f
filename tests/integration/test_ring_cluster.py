"""Three ring nodes crawl one job together: each host fetched by its owner only, politeness kept
across nodes, everything stored to HDFS.

Real processes: a redis-server of its own, three ``celery -A tasks worker`` processes started with
``VCRAWL_NODE_WEIGHT`` (each its own node name and working directory; they share no disk: pages go
to the WebHDFS protocol-level test server, the stand-in for a NameNode, see docs/cluster.md), and
twelve loopback sites on distinct addresses. The sites tell who fetched: while a request is
served, its client's socket is found among the nodes' processes (``tests.cluster.socket_owner``).
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from frontier import Frontier
from tests.brokers import BROKERS, broker_overrides, rabbitmq_queues
from tests.cluster import cluster_env, identify_clients, ring_listing, start_job, start_worker, stop_worker
from tests.site import NOT_PAGES, TestSite, link_page
from tests.webhdfs_server import WebHdfsTestServer
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = pytest.mark.slow

INTERVAL_S = 0.25
PAGES = 10  # per host, besides its home page
WEIGHTS = {"r1": 150, "r2": 80, "r3": 200}


@pytest.fixture
def sites() -> Iterator[list[TestSite]]:
    with ExitStack() as stack:
        hosts = [stack.enter_context(TestSite(f"127.0.4.{n}")) for n in range(1, 13)]
        for index, site in enumerate(hosts):
            neighbour = hosts[(index + 1) % len(hosts)]
            site.add_page("/", link_page(*[f"/p{i}" for i in range(PAGES)], neighbour.url("/")))
            for i in range(PAGES):
                site.add_page(f"/p{i}", link_page("/", f"/p{(i + 1) % PAGES}"))
            site.add_page("/robots.txt", "User-agent: *\nDisallow: /private/\n", content_type="text/plain")
        yield hosts


def wait_completed(url: str, job_id: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    status: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        status = job_status(Frontier(redis.Redis.from_url(url)), job_id)
        if status is not None and status["state"] != "running":
            return status
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} not done within {timeout_s}s: {status}")


@pytest.mark.parametrize("broker", BROKERS)
def test_three_ring_nodes_each_fetch_only_their_own_hosts(tmp_path: Path, sites: list[TestSite], broker: str) -> None:
    with (
        LocalRedis(tmp_path / "redis") as server,
        WebHdfsTestServer() as hdfs,
        broker_overrides(broker, tmp_path) as overrides,
    ):
        settings = Settings(redis_url=server.url, data=f"hdfs://{hdfs.namenode}/crawl", hdfs_user="vcrawl", **overrides)
        base = cluster_env(settings)  # the shipped timeouts
        workers = {}
        try:
            for name, weight in WEIGHTS.items():
                home = tmp_path / name
                home.mkdir()
                env = {**base, "VCRAWL_NODE_WEIGHT": str(weight), "HOME": str(home), "TMPDIR": str(home)}
                workers[name] = start_worker(env, name, tmp_path / f"{name}.log", concurrency=4)
            pids = {process.pid: name for name, process in workers.items()}
            for site in sites:
                identify_clients(site, pids)
            listing = ring_listing(base)
            assert {row["name"].split("@")[0]: (row["weight"], row["alive"]) for row in listing["nodes"]} == {
                name: (weight, True) for name, weight in WEIGHTS.items()
            }
            job = {"seeds": [site.url("/") for site in sites], "politeness": {"min_interval_s": INTERVAL_S,
                   "jitter": 0, "per_host": 1}, "warc": True}  # fmt: skip
            job_id = start_job(base, job)
            during = ring_listing(base)  # the owners the pumps route by, while the job runs
            status = wait_completed(server.url, job_id, 120)
            after = ring_listing(base)
            node_queues = rabbitmq_queues(overrides) if overrides else {}
        finally:
            for process in workers.values():  # a warm shutdown ships each node's WARC file to HDFS
                process.terminate()
            for process in workers.values():
                try:
                    process.wait(30)
                finally:
                    stop_worker(process)
        stored = hdfs.walk(f"/crawl/jobs/{job_id}/pages")
        warcs = [path for path in hdfs.walk(f"/crawl/jobs/{job_id}/warc") if path.endswith(".warc.gz")]

    assert status["state"] == "completed", status
    assert status["pages_stored"] == 12 * (PAGES + 1) and len(stored) == 12 * (PAGES + 1)  # full recall, all on HDFS
    assert warcs  # every node wrote its WARC files to HDFS, none to a local disk
    owner_of = {host: row["name"].split("@")[0] for row in during["nodes"] for host in row["hosts"]}
    assert sorted(owner_of) == sorted(site.base.removeprefix("http://") for site in sites)
    fetched_by: dict[str, set[Any]] = defaultdict(set)
    for site in sites:
        host = site.base.removeprefix("http://")
        for seen in site.seen:
            fetched_by[host].add(seen.client)
        assert len(site.requests_to("/robots.txt")) == 1  # fetched once, by the host's owner
        # politeness across nodes: one request at a time, INTERVAL_S apart (robots.txt included)
        times = sorted(seen.at for seen in site.seen)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert min(gaps) >= INTERVAL_S - 0.02, (host, min(gaps))
    assert {host: fetchers for host, fetchers in fetched_by.items() if fetchers != {owner_of[host]}} == {}
    if overrides:  # each ring node's own queue is a queue on RabbitMQ
        assert {f"download.node.{name}@" for name in WEIGHTS} <= {queue.split("@")[0] + "@" for queue in node_queues}
    # Hosts hash with their (random) ports: a node may own none of 12 (r2: 8 % of runs), but two do.
    assert len(set(owner_of.values())) >= 2
    # each node's page count in the listing is what the sites saw it fetch
    counted = {row["name"].split("@")[0]: row["pages"] for row in after["nodes"]}
    pages_seen = [seen.client for site in sites for seen in site.seen if seen.path not in NOT_PAGES]
    seen_from = {name: pages_seen.count(name) for name in WEIGHTS}
    assert counted == seen_from


def test_a_mixed_cluster_completes_with_job_batches_on_the_ring_node_only(
    tmp_path: Path, sites: list[TestSite]
) -> None:
    # A worker without a weight shares the queues (analysis, the shared download queue) with one
    # ring node: while the ring node is alive, every host's batches are its.
    with LocalRedis(tmp_path / "redis") as server, WebHdfsTestServer() as hdfs:
        settings = Settings(redis_url=server.url, data=f"hdfs://{hdfs.namenode}/crawl", hdfs_user="vcrawl")
        base = cluster_env(settings)
        ring_env = {**base, "VCRAWL_NODE_WEIGHT": "100"}
        workers = {"ring": start_worker(ring_env, "ring", tmp_path / "ring.log", concurrency=4),
                   "plain": start_worker(base, "plain", tmp_path / "plain.log", concurrency=4)}  # fmt: skip
        try:
            pids = {process.pid: name for name, process in workers.items()}
            for site in sites:
                identify_clients(site, pids)
            listing = ring_listing(base)
            politeness = {"min_interval_s": INTERVAL_S, "jitter": 0, "per_host": 1}
            job_id = start_job(base, {"seeds": [site.url("/") for site in sites], "politeness": politeness})
            status = wait_completed(server.url, job_id, 120)
        finally:
            for process in workers.values():
                stop_worker(process)

    # Both are members (the plain worker with weight 0, owning no host); only the ring node is on the ring.
    members = [(row["name"].split("@")[0], row["weight"], row["role"]) for row in listing["nodes"]]
    assert members == [("plain", 0, "worker"), ("ring", 100, "ring")]
    assert status["state"] == "completed" and status["pages_stored"] == 12 * (PAGES + 1), status
    assert {seen.client for site in sites for seen in site.seen} == {"ring"}
