"""Crawl strategies: the frontier's order per strategy (its scripts on a real redis-server), and
whole jobs on the session's worker, their order checked where the site saw the requests."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from engine.jobs import admit_links, build_runtime
from frontier import Batch, BatchRelease, Frontier
from tests.integration.conftest import run_job
from tests.site import NOT_PAGES, TestSite, link_page
from vcrawl import redis_keys
from vcrawl.jobs import JobSpec
from vcrawl.settings import Settings

FAST = {"min_interval_s": 0.0}
HOST = "a.test"


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedis]:
    """A redis-server of its own: the session's worker would pump these jobs otherwise."""
    with LocalRedis(tmp_path_factory.mktemp("strategy-redis")) as server:
        yield server


@pytest.fixture
def client(private_redis: LocalRedis) -> redis.Redis:
    return redis.Redis.from_url(private_redis.url, decode_responses=True)


def _job(client: redis.Redis, frontier: Frontier, *hosts: str, **spec: Any) -> Any:
    job = JobSpec.from_dict({"id": f"s-{uuid.uuid4().hex[:8]}", "seeds": ["http://a.test/"], "sitemaps": False,
                             "max_pages": 1000, **spec})  # fmt: skip
    assert frontier.jobs.create(job.id, job.to_json(), time.time(), strategy=job.strategy)
    for host in hosts or (HOST,):  # hosts fetched before: full batches at once (no robots.txt wait)
        client.hset(redis_keys.job_next(job.id), host, 0)
    return build_runtime(job, Settings(), session=None, client=client)


def _admit(runtime: Any, frontier: Frontier, token: str, *links: tuple[Any, ...]) -> None:
    """Admit (url, depth[, sitemap level]) links."""
    admit_links(runtime, frontier, [(f"http://{url}", depth, 5, *kind) for url, depth, *kind in links], done=0,
                token=token, counters=Counter())  # fmt: skip


def _pump(frontier: Frontier, job_id: str, max_batches: int = 8, lease_ms: float = 60_000) -> list[Batch]:
    result = frontier.queue.pump(job_id, max_batches=max_batches, batch_size=100, per_host=1, interval_ms=0,
                                 lease_ms=lease_ms, cap=8)  # fmt: skip
    return list(result.batches)


def _paths(batch: Batch) -> list[str]:
    return [entry.url.split(HOST, 1)[1] for entry in batch.entries]


def _scores(client: redis.Redis, job_id: str) -> dict[str, float]:
    """URL -> score of what the host's queue holds."""
    queued = client.zrange(redis_keys.job_queue(job_id, HOST), 0, -1, withscores=True)
    return {json.loads(member)["u"]: score for member, score in queued}


@pytest.mark.parametrize(
    ("strategy", "order"),
    [
        # A sitemap found after the start goes first with every strategy (docs/sitemaps.md); then
        ("breadth-first", ["/map.xml", "/a", "/b", "/a/1", "/a/2"]),  # shallower first, first come first served
        ("depth-first", ["/map.xml", "/a/2", "/a/1", "/b", "/a"]),  # deeper first, last come first served
        ("priority", ["/map.xml", "/b", "/a", "/a/1", "/a/2"]),  # /b's pattern, then 0.5 - 0.1 * depth
    ],
)
def test_a_hosts_queue_is_ordered_by_the_jobs_strategy(client: redis.Redis, strategy: str, order: list[str]) -> None:
    frontier = Frontier(client)
    priorities = [{"pattern": "/b$", "priority": 5}] if strategy == "priority" else []
    runtime = _job(client, frontier, strategy=strategy, priorities=priorities)
    _admit(runtime, frontier, "t1", ("a.test/a", 1), ("a.test/b", 1))
    _admit(runtime, frontier, "t2", ("a.test/a/1", 2), ("a.test/a/2", 2))
    _admit(runtime, frontier, "t3", ("a.test/map.xml", 0, 1))  # a sitemap (level 1), e.g. from robots.txt

    [batch] = _pump(frontier, runtime.job_id)

    assert _paths(batch) == order
    assert frontier.jobs.raw_state(runtime.job_id)["strategy"] == strategy


def test_links_to_a_queued_url_raise_it_in_a_priority_job(client: redis.Redis) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, strategy="priority")
    _admit(runtime, frontier, "t1", ("a.test/x1", 1), ("a.test/x2", 1), ("a.test/x3", 1))
    _admit(runtime, frontier, "t2", ("a.test/x3", 2), ("a.test/x2", 2))  # found again on two other pages
    _admit(runtime, frontier, "t3", ("a.test/x3", 2))

    scores = _scores(client, runtime.job_id)
    assert scores["http://a.test/x3"] < scores["http://a.test/x2"] < scores["http://a.test/x1"]
    [batch] = _pump(frontier, runtime.job_id)
    assert _paths(batch) == ["/x3", "/x2", "/x1"]
    # A link to a URL already leased adds nothing to any queue.
    _admit(runtime, frontier, "t4", ("a.test/x1", 2))
    state = frontier.jobs.raw_state(runtime.job_id)
    assert client.zcard(redis_keys.job_queue(runtime.job_id, HOST)) == 0
    assert state["duplicates"] == "4" and state["admitted"] == "3" and state["pending"] == "3"
    assert client.hlen(redis_keys.job_queued_urls(runtime.job_id)) == 0


def test_twelve_in_links_give_ten_bonuses_in_each_stay_in_the_queue(client: redis.Redis) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, strategy="priority")
    url, inlinks = "http://a.test/x", redis_keys.job_inlinks(runtime.job_id)
    _admit(runtime, frontier, "t0", ("a.test/x", 1))
    queued = _scores(client, runtime.job_id)[url]
    for n in range(12):
        _admit(runtime, frontier, f"a{n}", ("a.test/x", 2))
    assert _scores(client, runtime.job_id)[url] == queued - 10 * 1e11  # the cap (INLINK_CAP)

    [batch] = _pump(frontier, runtime.job_id)  # leased: it leaves the in-link count
    assert client.hlen(inlinks) == 0
    assert frontier.queue.release(runtime.job_id, batch, BatchRelease(0, 0, requeue=batch.entries)) is False
    assert _scores(client, runtime.job_id)[url] == queued - 10 * 1e11  # its score, bonuses included
    for n in range(12):
        _admit(runtime, frontier, f"b{n}", ("a.test/x", 2))

    assert _scores(client, runtime.job_id)[url] == queued - 20 * 1e11  # ten more in this stay
    assert client.hget(inlinks, url) == "12"


@pytest.mark.parametrize("strategy", ["depth-first", "priority"])
def test_requeued_urls_keep_their_scores(client: redis.Redis, strategy: str) -> None:
    frontier = Frontier(client)
    priorities = [{"pattern": "/p", "priority": 3}] if strategy == "priority" else []
    runtime = _job(client, frontier, strategy=strategy, priorities=priorities)
    _admit(runtime, frontier, "t1", ("a.test/p1", 1), ("a.test/x", 1))
    _admit(runtime, frontier, "t2", ("a.test/p2", 2), ("a.test/p1", 3))  # p1: an in-link (priority jobs)
    before = _scores(client, runtime.job_id)

    # A lease that ran out (its worker died): requeued with one more attempt, in the same places.
    _pump(frontier, runtime.job_id, lease_ms=1)
    time.sleep(0.01)
    assert frontier.queue.reclaim_expired(runtime.job_id, max_attempts=3, interval_ms=0) == (3, 0)
    assert _scores(client, runtime.job_id) == before
    # Handed back by the fetch (a paused job, a retry), or by a ring node that went down.
    client.hset(redis_keys.job_next(runtime.job_id), HOST, 0)
    [batch] = _pump(frontier, runtime.job_id)
    assert frontier.queue.release(runtime.job_id, batch, BatchRelease(0, 0, requeue=batch.entries)) is False
    assert _scores(client, runtime.job_id) == before
    [batch] = _pump(frontier, runtime.job_id)
    assert frontier.queue.hand_over(runtime.job_id, [batch.batch_id], interval_ms=0) == 3
    assert _scores(client, runtime.job_id) == before
    if strategy == "priority":  # still found by in-links once requeued
        _admit(runtime, frontier, "t3", ("a.test/x", 2))
        assert _scores(client, runtime.job_id)["http://a.test/x"] == before["http://a.test/x"] - 1e11


def test_a_cancelled_priority_jobs_url_index_stays_gone_when_its_batches_come_back(client: redis.Redis) -> None:
    frontier = Frontier(client)
    hosts = ("a.test", "b.test", "c.test")
    runtime = _job(client, frontier, *hosts, strategy="priority", scope={"hosts": list(hosts)})
    _admit(runtime, frontier, "t1", *((f"{host}/1", 1) for host in hosts), ("a.test/2", 1))
    _admit(runtime, frontier, "t2", ("a.test/2", 2))  # an in-link
    batches = {batch.host: batch for batch in _pump(frontier, runtime.job_id, lease_ms=1)}
    assert set(batches) == set(hosts)
    index = (redis_keys.job_queued_urls(runtime.job_id), redis_keys.job_inlinks(runtime.job_id))
    assert frontier.jobs.cancel(runtime.job_id, time.time())
    frontier.jobs.forget_if_stopped(runtime.job_id, runtime.bloom.keys)  # the next pump round
    assert not client.exists(*index)

    # The batches in flight hand their URLs back late: released, handed over, reclaimed.
    release = BatchRelease(0, 0, requeue=batches["a.test"].entries)
    assert frontier.queue.release(runtime.job_id, batches["a.test"], release) is not None
    assert frontier.queue.hand_over(runtime.job_id, [batches["b.test"].batch_id], interval_ms=0) == 1
    time.sleep(0.01)
    assert frontier.queue.reclaim_expired(runtime.job_id, max_attempts=3, interval_ms=0) == (1, 0)

    assert not client.exists(*index)


@pytest.mark.parametrize("stop", ["cancel", "fail"])
def test_a_paused_job_stopped_drops_its_filter_and_url_index_on_the_next_pump(client: redis.Redis, stop: str) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, strategy="priority")
    _admit(runtime, frontier, "t1", ("a.test/1", 1), ("a.test/2", 1))
    _admit(runtime, frontier, "t2", ("a.test/2", 2))  # an in-link
    keys = (*runtime.bloom.keys, redis_keys.job_queued_urls(runtime.job_id), redis_keys.job_inlinks(runtime.job_id))
    assert client.exists(*keys) == len(keys)
    assert frontier.jobs.pause(runtime.job_id, time.time())
    assert runtime.job_id not in frontier.jobs.running_jobs()

    if stop == "cancel":
        assert frontier.jobs.cancel(runtime.job_id, time.time())
    else:
        assert frontier.jobs.fail(runtime.job_id, "broken", time.time())
    assert runtime.job_id in frontier.jobs.running_jobs()  # for the next pump round (engine/pump.py) to see
    assert frontier.queue.pump(runtime.job_id, max_batches=8, batch_size=100, per_host=1, interval_ms=0,
                               lease_ms=60_000, cap=8).stopped  # fmt: skip
    frontier.jobs.forget_if_stopped(runtime.job_id, runtime.bloom.keys)

    assert not client.exists(*keys)
    assert runtime.job_id not in frontier.jobs.running_jobs()
    assert frontier.jobs.raw_state(runtime.job_id)["state"] == ("cancelled" if stop == "cancel" else "failed")


@pytest.mark.parametrize(("strategy", "first"), [("breadth-first", "a.test"), ("priority", "b.test")])
def test_a_priority_job_takes_the_due_host_with_the_best_url_first(
    client: redis.Redis, strategy: str, first: str
) -> None:
    frontier = Frontier(client)
    priorities = [{"pattern": "^http://b", "priority": 2}] if strategy == "priority" else []
    runtime = _job(client, frontier, "a.test", "b.test", strategy=strategy, scope={"hosts": ["a.test", "b.test"]},
                   priorities=priorities)  # fmt: skip
    _admit(runtime, frontier, "t1", ("a.test/1", 1), ("b.test/1", 1))

    [batch] = _pump(frontier, runtime.job_id, max_batches=1)

    assert batch.host == first


def test_each_cycle_takes_its_specs_strategy_and_a_fresh_url_index(client: redis.Redis) -> None:
    frontier = Frontier(client)
    job_id = f"s-{uuid.uuid4().hex[:8]}"
    first = JobSpec.from_dict({"id": job_id, "seeds": ["http://a.test/"], "strategy": "priority", "sitemaps": False})
    bloom_keys = build_runtime(first, Settings(), session=None, client=client).bloom.keys
    assert frontier.jobs.new_cycle(job_id, first.to_json(), firing="f1", bloom_keys=bloom_keys,
                                   strategy=first.strategy).cycle == 1  # fmt: skip
    runtime = build_runtime(first, Settings(), session=None, client=client, cycle=1)
    _admit(runtime, frontier, "t1", ("a.test/x", 1), ("a.test/y", 1))
    _admit(runtime, frontier, "t2", ("a.test/y", 2))
    frontier.jobs.finish_start(job_id, 1)
    assert client.hlen(redis_keys.job_queued_urls(job_id)) == 2 and client.hlen(redis_keys.job_inlinks(job_id)) == 1

    second = JobSpec.from_dict({**first.to_dict(), "strategy": "depth-first"})
    started = frontier.jobs.new_cycle(job_id, second.to_json(), firing="f2", overlap="cancel", bloom_keys=bloom_keys,
                                      strategy=second.strategy)  # fmt: skip

    assert started.cycle == 2 and frontier.jobs.raw_state(job_id)["strategy"] == "depth-first"
    assert not client.exists(redis_keys.job_queued_urls(job_id), redis_keys.job_inlinks(job_id))


# Whole jobs on the session's worker.


def _page_order(site: TestSite) -> list[str]:
    return [seen.path for seen in site.seen if seen.path not in NOT_PAGES]


@pytest.mark.usefixtures("worker")
def test_a_priority_job_fetches_its_high_priority_pages_first(site: TestSite) -> None:
    links = [f"/{kind}/{n}" for n in range(1, 6) for kind in ("blog", "shop")]  # blog/1, shop/1, blog/2, ...
    site.add_page("/", link_page(*links))
    for path in links:
        site.add_page(path, link_page())
    job = {"seeds": [site.url("/")], "max_pages": 7, "politeness": FAST}  # 6 of the 10 links are admitted

    status = run_job({**job, "strategy": "priority", "priorities": [{"pattern": "/shop/", "priority": 10}]})
    by_priority = _page_order(site)
    site.seen.clear()
    run_job({**job, "strategy": "breadth-first"})
    by_breadth = _page_order(site)

    assert status["state"] == "completed" and status["pages_stored"] == 7
    assert by_priority == ["/", "/shop/1", "/shop/2", "/shop/3", "/blog/1", "/blog/2", "/blog/3"]
    assert by_breadth == ["/", "/blog/1", "/shop/1", "/blog/2", "/shop/2", "/blog/3", "/shop/3"]


@pytest.mark.usefixtures("worker")
def test_a_depth_first_job_goes_deeper_before_the_shallower_siblings(site: TestSite) -> None:
    site.add_page("/", link_page("/a", "/b", "/c"))
    site.add_page("/a", link_page())
    site.add_page("/b", link_page())
    site.add_page("/c", link_page("/c/1"))
    site.add_page("/c/1", link_page("/c/1/x"))
    site.add_page("/c/1/x", link_page())
    # One URL a batch (a host paced at 2 s gets one: engine.jobs.paced_batch_size), a gap between
    # them: each page's links are queued before the host's next turn.
    polite = {"min_interval_s": 2.0, "jitter": 0}

    status = run_job({"seeds": [site.url("/")], "strategy": "depth-first", "politeness": polite})

    assert status["state"] == "completed" and status["pages_stored"] == 6
    assert _page_order(site) == ["/", "/c", "/c/1", "/c/1/x", "/b", "/a"]


ROBOTS = "User-agent: *\nDisallow: /private/\n"


@pytest.mark.usefixtures("worker")
@pytest.mark.parametrize("strategy", ["breadth-first", "depth-first", "priority"])
def test_every_strategy_fetches_each_page_once_obeys_robots_and_completes(site: TestSite, strategy: str) -> None:
    site.add_page("/robots.txt", ROBOTS, Content_Type="text/plain")
    # A small graph with cycles, a disallowed part and a page past the depth limit.
    site.add_page("/", link_page("/a.html", "/b.html", "/private/p.html", "/a.html#top"))
    site.add_page("/a.html", link_page("/b.html", "/c.html", "/"))
    site.add_page("/b.html", link_page("/a.html", "/c.html", "/private/q.html"))
    site.add_page("/c.html", link_page("/d.html", "/a.html"))
    site.add_page("/d.html", link_page("/e.html"))  # depth 3 links to depth 4: not followed
    site.add_page("/private/p.html", link_page())
    site.add_page("/e.html", link_page())

    priorities = [{"pattern": "/c", "priority": 1}] if strategy == "priority" else []
    status = run_job({"seeds": [site.url("/")], "max_depth": 3, "strategy": strategy, "priorities": priorities,
                      "politeness": FAST})  # fmt: skip

    assert status["state"] == "completed" and status["strategy"] == strategy
    assert Counter(_page_order(site)) == {"/": 1, "/a.html": 1, "/b.html": 1, "/c.html": 1, "/d.html": 1}
    assert status["pages_stored"] == 5 and status["pending"] == 0 and status["queued"] == 0
    assert status["robots_blocked"] == 2 and status["robots_fetched"] == 1
    assert status["admitted"] == 7 and status["filtered"]["depth"] == 1 and status["duplicates"] >= 5


@pytest.mark.usefixtures("worker")
def test_a_priority_job_reads_its_sitemap_first_and_orders_pages_by_the_sitemaps_priority(site: TestSite) -> None:
    listed = {"/low": 0.1, "/high": 0.9, "/mid": 0.5}
    items = "".join(f"<url><loc>{site.url(path)}</loc><priority>{p}</priority></url>" for path, p in listed.items())
    sitemap = f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{items}</urlset>'
    site.add_page("/robots.txt", f"User-agent: *\nSitemap: {site.url('/map.xml')}\n", Content_Type="text/plain")
    site.add_page("/map.xml", sitemap, Content_Type="application/xml")
    site.add_page("/", link_page())
    for path in listed:
        site.add_page(path, link_page())

    status = run_job({"seeds": [site.url("/")], "strategy": "priority", "politeness": FAST})

    assert status["state"] == "completed" and status["pages_stored"] == 4 and status["sitemaps_read"] == 1
    # The sitemap before any page; then 0.9 - 0.1 (depth 1), the seed's 0.5, 0.5 - 0.1, 0.1 - 0.1.
    assert _page_order(site) == ["/map.xml", "/high", "/", "/mid", "/low"]
