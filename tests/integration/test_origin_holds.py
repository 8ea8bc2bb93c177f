"""A host held for its Retry-After, against a real redis-server: the frontier leases and starts none of
its batches until the hold ends, and every listening process hears of the hold at once."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from engine.jobs import admit_links, build_runtime
from frontier import BatchRelease, Frontier, OriginHolds
from tasks.redis_clients import make_frontier_client
from tests.cluster import cluster_env, identify_clients, start_job, start_worker, stop_worker
from tests.redis_cluster import RedisCluster
from tests.site import Response, Seen, TestSite, link_page
from tests.waiting import wait_until
from vcrawl import redis_keys
from vcrawl.jobs import JobSpec
from vcrawl.settings import Settings
from views.status import job_status

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
        wait_until(lambda: here.left_s(job_id, HOST) > 0, 2.0, "the setting process hears of it too")  # no race

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


# --- two real worker processes crawling a site that answers one URL 429 + Retry-After ------------------

RETRY_AFTER_S = 3
ORDINARY = [f"/p{n}.html" for n in range(40)]
RACE_S = 0.5
"""A request another batch sent before it heard of the hold cannot be recalled: at most one per other batch
of the host in flight, sent within this of the 429 (milliseconds, measured; the rest is slack for a loaded
machine)."""


@dataclass
class Workers:
    env: dict[str, str]
    redis_url: str
    names: dict[int, str]  # pid -> worker name


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    """A redis-server and two `celery -A tasks worker` processes (two threads each) at the shipped settings."""
    work = tmp_path_factory.mktemp("holds-workers")
    with LocalRedis(work / "redis") as server:
        env = cluster_env(Settings(redis_url=server.url, data=str(work / "data")))
        processes = []
        try:
            for name in ("w1", "w2"):
                processes.append(start_worker(env, name, work / f"{name}.log", concurrency=2, loglevel="WARNING"))
            yield Workers(
                env, server.url, {process.pid: name for name, process in zip(("w1", "w2"), processes, strict=True)}
            )
        finally:
            for process in processes:
                stop_worker(process)


def _throttling_site(site: TestSite, throttled_at: int) -> None:
    """40 ordinary pages (0.1 s each) and, as the ``throttled_at``-th link, one URL answered 429 with
    ``Retry-After: 3`` once, then 200."""
    links = [*ORDINARY[:throttled_at], "/throttled.html", *ORDINARY[throttled_at:]]
    site.add_page("/", link_page(*links))
    for path in ORDINARY:
        site.add_response(path, Response(link_page().encode(), delay_s=0.1))
    busy = Response(b"slow down", 429, {"Retry-After": str(RETRY_AFTER_S)})
    site.add_sequence("/throttled.html", [busy, Response(link_page().encode())])


def _crawl(workers: Workers, site: TestSite, politeness: dict[str, Any]) -> dict[str, Any]:
    """Run a job of the site on the two workers (shipped defaults but ``politeness``) to its end."""
    identify_clients(site, workers.names)
    job_id = start_job(workers.env, {"seeds": [site.url("/")], "politeness": politeness})
    frontier = Frontier(redis.Redis.from_url(workers.redis_url))
    status = wait_until(lambda: (s := job_status(frontier, job_id)) and s["state"] != "running" and s, 90.0,
                        lambda: f"job {job_id} done: {job_status(frontier, job_id)}")  # fmt: skip
    assert status["state"] == "completed" and status["failed"] == {}, status
    assert status["pages_stored"] == len(ORDINARY) + 2, status  # the index, the 40, the throttled one at last
    return status


def _after_the_429(site: TestSite) -> tuple[float, list[Seen], float]:
    """(when the 429 went out, the requests that arrived after it, when the throttled URL came again)."""
    throttled, again = site.requests_to("/throttled.html")
    after = sorted((seen for seen in site.seen if seen.at > throttled.at and seen is not again), key=lambda s: s.at)
    return throttled.at, after, again.at


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "politeness", "throttled_at"),
    [
        # Several batches of the host in flight at once, over both processes, each sending its next
        # request as soon as the last is answered.
        pytest.param("impolite", {"min_interval_s": 0, "per_host": 4}, 5, id="impolite"),
        # Paced batches (0.25 s apart, with jitter) in bundles: two of the host's at once.
        pytest.param("paced", {"per_host": 2}, 10, id="paced"),
    ],
)
def test_a_retry_after_holds_its_origin_at_every_worker(
    two_workers: Workers, kind: str, politeness: dict[str, Any], throttled_at: int
) -> None:
    with TestSite("127.0.0.2") as site:
        _throttling_site(site, throttled_at)
        status = _crawl(two_workers, site, politeness)
    sent_429, after, again_at = _after_the_429(site)
    raced = [seen for seen in after if seen.at < sent_429 + RACE_S]
    held = [seen for seen in after if sent_429 + RACE_S <= seen.at < sent_429 + RETRY_AFTER_S]
    first_after_hold = min(seen.at for seen in after if seen.at >= sent_429 + RACE_S)
    senders = {seen.client for seen in site.seen if seen.at < sent_429 and seen.path in ORDINARY}
    print(
        f"{kind}: requests before the 429 from {sorted(map(str, senders))}; after it, {len(raced)} sent before "
        f"the hold was heard (last {max((s.at - sent_429 for s in raced), default=0) * 1000:.1f} ms after), then "
        f"none for {first_after_hold - sent_429:.3f} s; the throttled URL again after {again_at - sent_429:.3f} s; "
        f"job {status['elapsed_s']} s"
    )

    assert held == [], [(seen.path, seen.client, round(seen.at - sent_429, 3)) for seen in held]
    assert len(raced) <= politeness["per_host"] - 1, [(s.path, s.client, round(s.at - sent_429, 3)) for s in raced]
    assert first_after_hold >= sent_429 + RETRY_AFTER_S and again_at >= sent_429 + RETRY_AFTER_S
    if kind == "impolite":  # the hold reached batches of the host fetching in the other process too
        assert senders == {"w1", "w2"}, senders


@pytest.mark.slow
def test_a_retry_after_holds_only_its_url_when_the_job_says_url(two_workers: Workers) -> None:
    """``politeness.retry_after: url``, the opt-in for a site known to misuse Retry-After: the host's other
    pages go on during the wait, and the URL itself waits it out, as before."""
    with TestSite("127.0.0.3") as site:
        _throttling_site(site, throttled_at=5)
        _crawl(two_workers, site, {"min_interval_s": 0, "per_host": 4, "retry_after": "url"})
    sent_429, after, again_at = _after_the_429(site)

    assert len([seen for seen in after if seen.at < sent_429 + RETRY_AFTER_S]) >= 10  # 0.1 s pages, 4 at once
    assert again_at >= sent_429 + RETRY_AFTER_S
