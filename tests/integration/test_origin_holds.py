"""A host held for its Retry-After, against a real redis-server: the frontier leases and starts none of
its batches until the hold ends, and every listening process hears of the hold at once."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from engine.jobs import admit_links, build_runtime
from frontier import BatchRelease, Frontier, OriginHolds
from tasks.redis_clients import make_frontier_client
from tests.redis_cluster import RedisCluster
from tests.waiting import wait_until
from vcrawl import redis_keys
from vcrawl.jobs import JobSpec
from vcrawl.settings import Settings

HOST = "a.test"


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedis]:
    """A redis-server of its own: the session's worker would pump these jobs otherwise."""
    with LocalRedis(tmp_path_factory.mktemp("holds-redis")) as server:
        yield server


@pytest.fixture
def client(private_redis: LocalRedis) -> redis.Redis:
    return redis.Redis.from_url(private_redis.url, decode_responses=True)


def _impolite_job(client: redis.Redis, frontier: Frontier, urls: int) -> Any:
    """A job without politeness whose one host has ``urls`` URLs queued, four slots free."""
    job = JobSpec.from_dict({"id": f"t-{uuid.uuid4().hex[:8]}", "seeds": [f"http://{HOST}/"],
                             "politeness": {"min_interval_s": 0, "per_host": 4}})  # fmt: skip
    assert frontier.jobs.create(job.id, job.to_json(), time.time())
    runtime = build_runtime(job, Settings(), session=None, client=client)
    links = [(f"http://{HOST}/{n}", 0, 5) for n in range(urls)]
    admit_links(runtime, frontier, links, done=0, token="seeds", counters=Counter(), seeds=True)
    client.hdel(redis_keys.job_delays(job.id), HOST)  # its robots.txt read, no Crawl-delay: all its slots
    return runtime


def _pump(frontier: Frontier, job_id: str, calls: int = 1) -> list[Any]:
    """What ``calls`` pump calls lease (a call leases one batch per host), batches of 2 URLs."""
    return [batch for _ in range(calls) for batch in frontier.queue.pump(
        job_id, max_batches=4, batch_size=2, per_host=4, interval_ms=0, lease_ms=60_000, cap=16).batches]  # fmt: skip


def test_a_held_host_is_neither_leased_nor_started_and_its_release_keeps_the_hold(client: redis.Redis) -> None:
    frontier = Frontier(client)
    runtime = _impolite_job(client, frontier, urls=8)
    first, leased_before = _pump(frontier, runtime.job_id, calls=2)  # two of the host's four slots
    assert frontier.queue.start_lease(runtime.job_id, first.batch_id, 60_000, "run-1", host=HOST) == "go"

    until = frontier.queue.hold_host(runtime.job_id, HOST, 0.6)  # the first batch got a 429 + Retry-After

    assert until > time.time() + 0.4
    assert _pump(frontier, runtime.job_id) == []  # free slots and queued URLs, but held
    # A batch leased before the hold, started by a process that did not hear of it: handed back.
    assert frontier.queue.start_lease(runtime.job_id, leased_before.batch_id, 60_000, "run-2", host=HOST) == "held"
    back = BatchRelease(pause_ms=0, done=0, requeue=leased_before.entries, fetched=False)
    assert frontier.queue.release(runtime.job_id, leased_before, back) is False
    # The first batch's release asks for no wait of its own: the host still waits out the hold.
    done = BatchRelease(pause_ms=0, done=len(first.entries), counters={"fetched": len(first.entries)}, fetched=True)
    assert frontier.queue.release(runtime.job_id, first, done) is False
    assert float(client.zscore(redis_keys.job_ready(runtime.job_id), HOST)) >= until * 1000
    assert _pump(frontier, runtime.job_id) == []

    time.sleep(max(0.0, until - time.time()) + 0.05)
    again = _pump(frontier, runtime.job_id, calls=4)  # over the four free slots
    assert sum(len(batch.entries) for batch in again) == 6  # the rest: the handed-back batch's and the queued
    assert frontier.queue.start_lease(runtime.job_id, again[0].batch_id, 60_000, "run-3", host=HOST) == "go"
    release = BatchRelease(pause_ms=0, done=len(again[0].entries), fetched=True)
    frontier.queue.release(runtime.job_id, again[0], release)
    assert not client.hexists(redis_keys.job_holds(runtime.job_id), HOST)  # an ended hold is dropped


def test_a_hold_only_lengthens_what_is_there(client: redis.Redis) -> None:
    frontier = Frontier(client)
    runtime = _impolite_job(client, frontier, urls=2)
    longer = frontier.queue.hold_host(runtime.job_id, HOST, 5.0)
    frontier.queue.hold_host(runtime.job_id, HOST, 0.1)  # a later, shorter one

    assert int(client.hget(redis_keys.job_holds(runtime.job_id), HOST)) == round(longer * 1000)
    assert int(client.hget(redis_keys.job_next(runtime.job_id), HOST)) == round(longer * 1000)


def test_every_listening_process_hears_of_a_hold_at_once(private_redis: LocalRedis) -> None:
    """Two processes' copies (each on its own connection): the hold one process's batch sets in the
    frontier reaches the other's within milliseconds, and only for that job and host."""
    here, there = (OriginHolds(redis.Redis.from_url(private_redis.url)).start() for _ in range(2))
    try:
        frontier = Frontier(redis.Redis.from_url(private_redis.url, decode_responses=True))
        job_id = f"t-{uuid.uuid4().hex[:8]}"
        assert there.left_s(job_id, HOST) == 0.0

        sent = time.monotonic()
        frontier.queue.hold_host(job_id, HOST, 3.0)
        wait_until(lambda: there.left_s(job_id, HOST) > 0, 2.0, "the other process hears of the hold")
        heard_after_s = time.monotonic() - sent

        assert 2.5 < there.left_s(job_id, HOST) <= 3.0 and here.left_s(job_id, HOST) > 2.5
        assert there.left_s(job_id, "b.test") == 0.0 and there.left_s("another-job", HOST) == 0.0
        assert heard_after_s < 0.5, heard_after_s  # about a millisecond on an idle machine
    finally:
        here.stop()
        there.stop()


def test_a_process_whose_subscription_dropped_subscribes_again(private_redis: LocalRedis) -> None:
    listening = OriginHolds(redis.Redis.from_url(private_redis.url)).start()
    try:
        client = redis.Redis.from_url(private_redis.url)
        client.client_kill_filter(_type="pubsub")  # as a Redis restart or failover would
        frontier = Frontier(redis.Redis.from_url(private_redis.url, decode_responses=True))
        job_id = f"t-{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + 10.0
        while listening.left_s(job_id, HOST) == 0.0 and time.monotonic() < deadline:
            frontier.queue.hold_host(job_id, HOST, 30.0)  # announced again until heard
            time.sleep(0.2)
        assert listening.left_s(job_id, HOST) > 0.0
    finally:
        listening.stop()


@pytest.mark.slow
def test_holds_on_every_shard_of_a_redis_cluster_are_heard_by_every_process(tmp_path: Path) -> None:
    """A job split over a cluster's primaries: a hold set on any shard (its host's partition) keeps the
    host from being leased, and reaches the processes listening through other nodes."""
    with RedisCluster(tmp_path / "cluster") as cluster:
        settings = Settings(redis_url="redis://127.0.0.1:9/0", frontier_url=cluster.url)
        client = make_frontier_client(settings)
        listeners = [OriginHolds(make_frontier_client(settings)).start() for _ in range(2)]
        try:
            frontier = Frontier(client)
            spec = JobSpec.from_dict({"id": f"t-{uuid.uuid4().hex[:8]}", "seeds": ["http://h0.test/"],
                                      "scope": {"domains": ["test"]}, "politeness": {"min_interval_s": 0}})  # fmt: skip
            assert frontier.jobs.create(spec.id, spec.to_json(), time.time())
            runtime = build_runtime(spec, settings, session=None, client=client)
            hosts = [f"h{n}.test" for n in range(12)]
            admit_links(runtime, frontier, [(f"http://{host}/", 0, 5) for host in hosts], done=0, token="seeds",
                        counters=Counter(), seeds=True)  # fmt: skip
            by_part = {frontier.partitions.for_host(spec.id, host): host for host in reversed(hosts)}
            held = set(by_part.values())  # a host of each partition: one on every primary
            for host in held:
                frontier.queue.hold_host(spec.id, host, 30.0)
            for listening in listeners:
                wait_until(lambda listening=listening: all(listening.left_s(spec.id, h) > 0 for h in held), 5.0,
                           "every hold heard")  # fmt: skip
            leased = frontier.queue.pump(spec.id, max_batches=64, batch_size=8, per_host=1, interval_ms=0,
                                         lease_ms=60_000, cap=64).batches  # fmt: skip
            assert len({frontier.partitions.for_host(spec.id, host) for host in held}) == 3  # every shard
            assert sorted(batch.host for batch in leased) == sorted(set(hosts) - held)
        finally:
            for listening in listeners:
                listening.stop()
            client.close()
