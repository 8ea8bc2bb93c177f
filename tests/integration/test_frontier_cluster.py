"""The frontier on a real Redis Cluster (``VCRAWL_FRONTIER_URL=redis-cluster://...``), the broker on a
Redis of its own.

Real processes: a cluster of 3 primaries and 3 replicas (tests/redis_cluster.py), a private
redis-server for the broker, a `celery -A tasks worker` subprocess, test sites on 127.0.0.2-4.
A one-off job is split, one partition per primary (frontier/partitions.py), so its hosts spread over
the shards; a scheduled job lives on the shard of its id; a host's gate and robots.txt keys spread by host.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import redis

from cli.local_redis import LocalRedis
from engine.jobs import admit_links, build_runtime
from frontier import BatchRelease, Frontier
from tasks.redis_clients import make_frontier_client
from tests.cluster import REPO, cluster_env, start_job, start_worker, stop_worker, submit, wait_all
from tests.faults.test_faults import serve_pages
from tests.integration.test_frontier_redis import cli, wait_job
from tests.redis_cluster import RedisCluster
from tests.site import NOT_PAGES, TestSite
from vcrawl import redis_keys
from vcrawl.jobs import JobSpec
from vcrawl.settings import Settings

pytestmark = [pytest.mark.redis_ha, pytest.mark.slow]

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
INTERVAL_S = 0.05
ROBOTS = "User-agent: *\nDisallow: /private\n"


@contextmanager
def cluster_crawl(
    tmp_path: Path, node_timeout_ms: int = 3000
) -> Iterator[tuple[RedisCluster, redis.Redis, dict[str, str], list[TestSite]]]:
    """A cluster (``cluster-node-timeout`` as given), a broker Redis, the sites and one worker at
    vcrawl's shipped settings; everything stopped afterwards."""
    with (
        RedisCluster(tmp_path / "cluster", node_timeout_ms=node_timeout_ms) as cluster,
        LocalRedis(tmp_path / "broker") as broker,
        ExitStack() as stack,
    ):
        sites = [stack.enter_context(TestSite(host)) for host in HOSTS]
        for site in sites:
            site.add_page("/robots.txt", ROBOTS)
            site.add_page("/private", "<html></html>")
        env = cluster_env(Settings(redis_url=broker.url, frontier_url=cluster.url, data=str(tmp_path / "d")))
        worker = start_worker(env, "w1", tmp_path / "w1.log", concurrency=4)
        stack.callback(stop_worker, worker)
        with redis.Redis.from_url(broker.url) as broker_client:
            yield cluster, broker_client, env, sites


@pytest.fixture
def cluster_run(tmp_path: Path) -> Iterator[tuple[RedisCluster, redis.Redis, dict[str, str], list[TestSite]]]:
    """The cluster with a 3 s node timeout: a killed primary's replica is promoted in ~5 s (the fault
    test tests/faults/test_frontier_cluster_failover.py uses Redis's default, 15 s)."""
    with cluster_crawl(tmp_path) as running:
        yield running


def test_jobs_on_a_redis_cluster_complete_politely_and_spread_over_the_shards(
    cluster_run: tuple[RedisCluster, redis.Redis, dict[str, str], list[TestSite]],
) -> None:
    cluster, broker, env, sites = cluster_run
    expected = {site.base: serve_pages(site, 15) for site in sites}
    politeness = {"min_interval_s": INTERVAL_S, "jitter": 0}
    # Jobs land on the shard of their id's slot: start jobs until two shards hold one (bounded).
    jobs: dict[str, TestSite] = {}
    for site in itertools.islice(itertools.cycle(sites), 6):
        jobs[start_job(env, {"seeds": [site.url("/")], "politeness": politeness})] = site
        holding = [port for port, count in cluster.keys_per_primary("vcrawl:job:*").items() if count]
        if len(jobs) >= 3 and len(holding) >= 2:
            break
    for job_id in jobs:
        status = wait_job(env, job_id, 120)
        assert status["state"] == "completed", status

    [task_id] = submit(env, [{"url": sites[0].url("/p1"), "analyzer": "links"}])
    [record] = wait_all(env, [task_id], {"analyzed", "failed"}, 60).values()
    assert record["state"] == "analyzed", record

    for site in sites:
        paths = [seen.path for seen in site.seen if seen.path not in NOT_PAGES]
        crawls = sum(1 for owner in jobs.values() if owner is site)
        assert sorted(paths) == sorted(expected[site.base] * crawls + ["/p1"] * (site is sites[0])), site.base
        arrivals = sorted(seen.at for seen in site.seen)
        gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
        assert min(gaps) >= INTERVAL_S * 0.99 or crawls > 1, (site.base, min(gaps))
    holding = {port: count for port, count in cluster.keys_per_primary("vcrawl:job:*").items() if count}
    assert len(holding) >= 2, f"every job on one shard: {holding}"
    assert sum(cluster.keys_per_primary("vcrawl:gate:*").values()) >= 1  # the single task's host gate
    assert sum(cluster.keys_per_primary("vcrawl:robots:*").values()) >= 1
    on_broker = [key for key in broker.scan_iter(count=1000) if key.startswith((b"vcrawl:job:", b"vcrawl:gate:"))]
    assert on_broker == []


def test_a_shard_primary_killed_mid_job_its_replica_takes_over_and_the_job_completes(
    cluster_run: tuple[RedisCluster, redis.Redis, dict[str, str], list[TestSite]],
) -> None:
    kill_a_shard_primary_mid_job(cluster_run)


def kill_a_shard_primary_mid_job(running: tuple[RedisCluster, redis.Redis, dict[str, str], list[TestSite]]) -> float:
    """SIGKILL the primary holding the job's keys after 40 pages; the job must complete with every
    page. Returns the seconds the promotion took."""
    cluster, _, env, sites = running
    expected = {site.base: serve_pages(site, 60) for site in sites}
    job_id = start_job(env, {"seeds": [site.url("/") for site in sites], "politeness": {"min_interval_s": 0.05}})
    holder = max(cluster.keys_per_primary("vcrawl:job:*").items(), key=lambda item: item[1])[0]
    deadline = time.monotonic() + 60
    while sum(len(site.seen) for site in sites) < 40 and time.monotonic() < deadline:
        time.sleep(0.02)
    cluster.kill_primary(holder)
    _, promotion_s = cluster.wait_promotion(holder, 60)
    status = wait_job(env, job_id, 180)
    assert status["state"] == "completed", status
    for site in sites:
        fetched = {seen.path for seen in site.seen if seen.path not in NOT_PAGES}
        assert fetched == set(expected[site.base]), (site.base, promotion_s)
        assert "/private" not in fetched
    return promotion_s


def test_the_slot_of_a_running_job_moves_to_another_primary_and_the_job_completes(
    cluster_run: tuple[RedisCluster, redis.Redis, dict[str, str], list[TestSite]],
) -> None:
    """A live slot migration under the crawl (IMPORTING/MIGRATING, keys moved a few at a time, then
    the new owner): the frontier's scripts meet ASK and TRYAGAIN, then MOVED; nothing is lost or
    fetched twice."""
    cluster, _, env, sites = cluster_run
    expected = {site.base: serve_pages(site, 60) for site in sites}
    job_id = start_job(env, {"seeds": [site.url("/") for site in sites], "politeness": {"min_interval_s": 0.05}})
    slot, owner = cluster.slot_of(f"vcrawl:job:{{{job_id}}}")
    deadline = time.monotonic() + 60
    while sum(len(site.seen) for site in sites) < 40 and time.monotonic() < deadline:
        time.sleep(0.02)
    target = next(port for port in cluster.primary_ports() if port != owner)
    moved = cluster.move_slot(slot, target)
    assert cluster.slot_owner(slot) == target and moved > 0
    status = wait_job(env, job_id, 180)
    assert status["state"] == "completed", status
    for site in sites:
        paths = [seen.path for seen in site.seen if seen.path not in NOT_PAGES]
        assert sorted(paths) == sorted(expected[site.base]), site.base  # each page once


def test_a_primary_added_and_slots_rebalanced_onto_it_mid_job_the_job_completes(
    cluster_run: tuple[RedisCluster, redis.Redis, dict[str, str], list[TestSite]],
) -> None:
    """Growth as an operator does it: ``redis-cli --cluster add-node`` an empty primary, then
    ``--cluster rebalance --cluster-use-empty-masters``, while a job crawls. About a quarter of the
    slots move with their keys (the frontier's scripts meet ASK, TRYAGAIN and MOVED); the job
    completes with every page fetched once, at its pace."""
    cluster, _, env, sites = cluster_run
    expected = {site.base: serve_pages(site, 120) for site in sites}
    interval_s = 0.1  # ~12 s of crawling per host: the rebalance runs while the job does
    job_id = start_job(env, {"seeds": [site.url("/") for site in sites], "politeness": {"min_interval_s": interval_s}})
    with cluster.client() as client:
        job_keys = [key.decode() for key in client.scan_iter(match=f"vcrawl:job:{{{job_id}*", count=1000)]
    owners_before = {key: cluster.slot_of(key)[1] for key in job_keys}
    deadline = time.monotonic() + 60
    while sum(len(site.seen) for site in sites) < 30 and time.monotonic() < deadline:
        time.sleep(0.02)
    new_primary = cluster.add_primary()
    cluster.rebalance()
    pages_by_then = sum(1 for site in sites for seen in site.seen if seen.path not in NOT_PAGES)
    counts = cluster.slot_owner_counts()
    assert len(counts) == 4 and counts.get(new_primary, 0) > 0, counts
    status = wait_job(env, job_id, 180)
    assert status["state"] == "completed", status
    assert pages_by_then < sum(map(len, expected.values())), "the job was done before the rebalance was"
    for site in sites:
        paths = [seen.path for seen in site.seen if seen.path not in NOT_PAGES]
        assert sorted(paths) == sorted(expected[site.base]), site.base  # each page once
        arrivals = sorted(seen.at for seen in site.seen)
        assert min(later - earlier for earlier, later in itertools.pairwise(arrivals)) >= interval_s * 0.99
    moved = {key for key, owner in owners_before.items() if cluster.slot_of(key)[1] != owner}
    print(f"rebalance: {counts}; job keys moved: {len(moved)} of {len(owners_before)}")


def test_a_paused_job_and_a_scheduled_jobs_second_cycle_on_the_cluster(
    cluster_run: tuple[RedisCluster, redis.Redis, dict[str, str], list[TestSite]],
) -> None:
    _, _, env, sites = cluster_run
    site = sites[0]
    expected = serve_pages(site, 10)
    job_id = start_job(env, {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.2, "jitter": 0}})
    deadline = time.monotonic() + 30
    while len(site.seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    cli(env, "pause", job_id)
    assert json.loads(cli(env, "status", job_id, "--json").strip().splitlines()[-1])["state"] == "paused"
    cli(env, "resume", job_id)
    assert wait_job(env, job_id, 90)["state"] == "completed"

    other = sites[1]
    serve_pages(other, 5)
    spec = {"id": "news", "seeds": [other.url("/")], "politeness": {"min_interval_s": 0}}
    for cycle in (1, 2):
        started = start_cycle(env, "news", spec)
        assert started["status"] == "started" and started["cycle"] == cycle, started
        status = wait_job(env, "news", 90)
        assert status["state"] == "completed" and status["cycle"] == cycle, status
    assert sorted(seen.path for seen in site.seen if seen.path not in NOT_PAGES) == sorted(expected)
    assert sum(1 for seen in other.seen if seen.path == "/") == 2  # fetched again in the second cycle


def start_cycle(env: dict[str, str], name: str, spec: dict[str, object]) -> dict[str, object]:
    """A firing of the schedule ``name``: the task beat sends, run in a process of its own given only the
    environment (as test_cycles.py runs it); the crawl itself runs on the worker."""
    code = ("import json, sys, uuid, tasks; print(json.dumps(tasks.start_cycle.apply("
            "args=(sys.argv[1], json.loads(sys.argv[2])), task_id=str(uuid.uuid4())).get()))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, name, json.dumps(spec)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=90, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_one_job_spreads_its_hosts_over_every_primary_and_completes_when_all_partitions_are_idle(
    tmp_path: Path,
) -> None:
    """The frontier itself, no worker: a one-off job on the cluster gets a partition on each primary;
    its hosts' queues spread over them; a pump call leases from all; the job completes only with the
    last partition's last page, its counters summed over the partitions."""
    with RedisCluster(tmp_path / "cluster") as cluster:
        settings = Settings(redis_url="redis://127.0.0.1:9/0", frontier_url=cluster.url)
        client = make_frontier_client(settings)
        try:
            frontier = Frontier(client)
            spec = JobSpec.from_dict({"id": "spread", "seeds": ["http://h0.test/"], "scope": {"domains": ["test"]},
                                      "politeness": {"min_interval_s": 0}})  # fmt: skip
            assert frontier.jobs.create(spec.id, spec.to_json(), time.time())
            parts = frontier.partitions.of(spec.id)
            assert len(parts) == 3 and parts[0] == spec.id
            runtime = build_runtime(spec, settings, session=None, client=client)
            hosts = [f"h{n}.test" for n in range(30)]
            admit_links(runtime, frontier, [(f"http://{host}/", 0, 5) for host in hosts], done=0, token="seeds",
                        counters=Counter(), seeds=True)  # fmt: skip
            assert not frontier.partitions.started(spec.id)  # 30 URLs pending
            queues = cluster.keys_per_primary("vcrawl:job:*:q:*")
            assert len(queues) == 3 and all(count >= 3 for count in queues.values()), queues  # every primary
            for host in hosts:  # robots.txt known: a batch of the host's URL each
                client.hdel(redis_keys.job_delays(frontier.partitions.for_host(spec.id, host)), host)
            leased = frontier.queue.pump(spec.id, max_batches=64, batch_size=8, per_host=1, interval_ms=0,
                                         lease_ms=60_000, cap=64).batches  # fmt: skip
            assert sorted(batch.host for batch in leased) == sorted(hosts)
            assert {frontier.partitions.for_batch(spec.id, batch.batch_id) for batch in leased} == set(parts)
            done = [frontier.queue.release(spec.id, batch, BatchRelease(pause_ms=0, done=1, counters={"fetched": 1}))
                    for batch in leased]  # fmt: skip
            assert done == [False] * 29 + [True]  # the last release, whichever partition, completes the job
            state = frontier.jobs.raw_state(spec.id)
            assert state["state"] == "completed" and state["fetched"] == "30" and state["pending"] == "0", state
            assert all(frontier.jobs.raw_state(part)["state"] == "completed" for part in parts[1:])
        finally:
            client.close()


def test_a_split_jobs_seed_hosts_are_dealt_evenly_over_the_primaries(tmp_path: Path) -> None:
    """30 seed hosts, 3 primaries: 10 host queues each, where a hash of their names would give each
    whatever it happens to (a process that meets the job later deals them the same); a host that is
    no seed's goes by its hash."""
    with RedisCluster(tmp_path / "cluster") as cluster:
        settings = Settings(redis_url="redis://127.0.0.1:9/0", frontier_url=cluster.url)
        client, later = make_frontier_client(settings), make_frontier_client(settings)
        try:
            frontier = Frontier(client)
            hosts = [f"h{n}.test" for n in range(30)]
            spec = JobSpec.from_dict({"id": "dealt", "seeds": [f"http://{host}/" for host in hosts],
                                      "politeness": {"min_interval_s": 0}})  # fmt: skip
            assert frontier.jobs.create(spec.id, spec.to_json(), time.time(), seeds=spec.seeds)
            parts = frontier.partitions.of(spec.id)
            assert [frontier.partitions.for_host(spec.id, host) for host in hosts] == [*parts] * 10
            assert [Frontier(later).partitions.for_host(spec.id, host) for host in hosts] == [*parts] * 10
            runtime = build_runtime(spec, settings, session=None, client=client)
            admit_links(runtime, frontier, [(f"http://{host}/", 0, 5) for host in hosts], done=0, token="seeds",
                        counters=Counter(), seeds=True)  # fmt: skip
            assert sorted(cluster.keys_per_primary("vcrawl:job:*:q:*").values()) == [10, 10, 10]
            by_hash = parts[zlib.crc32(b"elsewhere.test") % len(parts)]
            assert frontier.partitions.for_host(spec.id, "elsewhere.test") == by_hash
        finally:
            client.close()
            later.close()
