"""The frontier's scripts against a real redis-server: leases, reclaim, atomic admission, abandon."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from engine.analyze_batch import abandon_analysis
from engine.crawl_env import CrawlEnv
from engine.jobs import JobRuntime, admit_links, build_runtime, lease_ms
from frontier import AdmitRequest, Batch, BatchRelease, Candidate, Entry, Frontier, FrontierQueue, RobotsCache
from frontier.queue import RENEWAL_HOLDS_S
from storage import Storage
from telemetry.alerts import Alerter
from vcrawl import redis_keys
from vcrawl.jobs import JobSpec
from vcrawl.settings import Settings
from views.status import job_status


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedis]:
    """A redis-server of its own: the session's worker would pump these jobs otherwise."""
    with LocalRedis(tmp_path_factory.mktemp("frontier-redis")) as server:
        yield server


@pytest.fixture
def client(private_redis: LocalRedis) -> redis.Redis:
    return redis.Redis.from_url(private_redis.url, decode_responses=True)


def _job(client: redis.Redis, frontier: Frontier, **spec: Any) -> Any:
    job = JobSpec.from_dict({"id": f"t-{uuid.uuid4().hex[:8]}", "seeds": ["http://a.test/"], **spec})
    assert frontier.jobs.create(job.id, job.to_json(), time.time())
    return build_runtime(job, Settings(), session=None, client=client)


def _status(frontier: Frontier, job_id: str) -> dict[str, str]:
    return frontier.jobs.raw_state(job_id)


def test_a_reclaimed_lease_is_requeued_and_its_late_batch_counts_nothing(client: redis.Redis) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, politeness={"min_interval_s": 0})
    urls = ["http://a.test/1", "http://a.test/2"]
    admit_links(runtime, frontier, [(u, 0, 5) for u in urls], done=0, token="seeds", counters=Counter(), seeds=True)
    [batch] = frontier.queue.pump(runtime.job_id, max_batches=4, batch_size=1, per_host=1, interval_ms=0, lease_ms=1,
                                  cap=8).batches  # fmt: skip
    time.sleep(0.01)

    assert frontier.queue.reclaim_expired(runtime.job_id, max_attempts=3, interval_ms=0) == (1, 0)
    # The worker that held the lease comes back late: it must neither start nor count.
    assert frontier.queue.start_lease(runtime.job_id, batch.batch_id, 60_000) == "stale"
    late = BatchRelease(pause_ms=0, done=1, counters={"fetched": 1})
    assert frontier.queue.release(runtime.job_id, batch, late) is None
    state = _status(frontier, runtime.job_id)
    assert state["state"] == "running" and state["pending"] == "2" and "fetched" not in state
    assert state["lease_expired"] == "1"
    # The URL comes back first, with one more attempt; after too many it fails and is finished.
    again = frontier.queue.pump(runtime.job_id, max_batches=4, batch_size=2, per_host=1, interval_ms=0, lease_ms=1,
                                cap=8)  # fmt: skip
    [entry] = [entry for b in again.batches for entry in b.entries]
    assert (entry.url, entry.attempt) == (batch.entries[0].url, 1)
    time.sleep(0.01)
    assert frontier.queue.reclaim_expired(runtime.job_id, max_attempts=1, interval_ms=0) == (0, 1)
    state = _status(frontier, runtime.job_id)
    assert state["failed:lease_expired"] == "1" and state["pending"] == "1"


def test_concurrent_admissions_admit_each_url_once(client: redis.Redis, private_redis: LocalRedis) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, max_pages=100_000)
    urls = [f"http://a.test/p{n}.html" for n in range(300)]
    errors: list[BaseException] = []

    def admit(seed: int) -> None:
        try:
            own = Frontier(redis.Redis.from_url(private_redis.url))
            order = urls[seed * 37 % 300 :] + urls[: seed * 37 % 300]
            for start in range(0, 300, 50):
                chunk = [Candidate("a.test", Entry(url)) for url in order[start : start + 50]]
                own.queue.admit(runtime.job_id, AdmitRequest(chunk, bloom=runtime.bloom, max_pages=100_000, per_host=1))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=admit, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    state = _status(frontier, runtime.job_id)
    assert state["admitted"] == "300" and state["pending"] == "300"
    assert state["duplicates"] == str(7 * 300)
    assert client.zcard(f"vcrawl:job:{{{runtime.job_id}}}:q:a.test") == 300


def test_abandoned_analysis_finishes_its_pages_exactly_once(client: redis.Redis, tmp_path: Path) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, max_pages=100_000)
    admit_links(runtime, frontier, [("http://a.test/", 0, 5)], done=0, token="seeds", counters=Counter(), seeds=True)
    env = _env(client, frontier, runtime, tmp_path)
    fetched = {"job": runtime.job_id, "batch": "9", "pages": [{"url": "http://a.test/"}], "redirects": []}
    client.hset(redis_keys.job_released(runtime.job_id), "9", json.dumps(fetched))  # as its release does
    links = [(f"http://a.test/p{n}.html", 1, 5) for n in range(1500)]
    # The analysis admitted its first chunk of 1000 links, then failed for good.
    first = [Candidate("a.test", Entry(url, depth)) for url, depth, _ in links[:1000]]
    frontier.queue.admit(runtime.job_id, AdmitRequest(first, bloom=runtime.bloom, max_pages=100_000, per_host=1,
                                                      token="a:9:0"))  # fmt: skip
    assert _status(frontier, runtime.job_id)["pending"] == "1001"

    abandon_analysis(env, fetched, "boom")
    abandon_analysis(env, fetched, "boom again")  # an errback that runs twice changes nothing more

    state = _status(frontier, runtime.job_id)
    assert state["pending"] == "1000" and state["analysis_failed:batch"] == "1"


def test_abandon_after_a_complete_admission_changes_nothing(client: redis.Redis, tmp_path: Path) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, max_pages=100_000)
    admit_links(runtime, frontier, [("http://a.test/", 0, 5)], done=0, token="seeds", counters=Counter(), seeds=True)
    links = [(f"http://a.test/p{n}.html", 1, 5) for n in range(1500)]
    admit_links(runtime, frontier, links, done=1, token="a:7", counters=Counter())
    env = _env(client, frontier, runtime, tmp_path)

    abandon_analysis(env, {"job": runtime.job_id, "batch": "7", "pages": [{}], "redirects": []}, "late errback")

    assert _status(frontier, runtime.job_id)["pending"] == "1500"


def test_links_this_process_saw_in_the_filter_skip_the_round_trip(client: redis.Redis) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, max_pages=3)
    links = [(f"http://a.test/p{n}.html", 1, 5) for n in range(5)]
    assert admit_links(runtime, frontier, links[:3], done=0, token="a:1", counters=Counter()).admitted == 3
    assert all(url in runtime.recent for url, _, _ in links[:3])

    counters: Counter[str] = Counter()
    second = admit_links(runtime, frontier, links, done=0, token="a:2", counters=counters)
    # The first 3 are known here: duplicates without a round trip. The other 2 go to Redis and
    # are over the page limit, so not in the filter: never remembered, refused there every time.
    assert counters["duplicates"] == 3 and (second.duplicates, second.over_limit) == (0, 2)
    assert not any(url in runtime.recent for url, _, _ in links[3:])
    third = admit_links(runtime, frontier, links[3:], done=0, token="a:3", counters=Counter())
    assert third.over_limit == 2
    state = _status(frontier, runtime.job_id)
    assert (state["admitted"], state["duplicates"], state["filtered:max_pages"]) == ("3", "3", "4")


def test_scripts_lost_by_redis_are_loaded_again(client: redis.Redis) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, max_pages=100)
    client.script_flush()  # as after a restart without persistence of the script cache
    admitted = admit_links(runtime, frontier, [("http://a.test/x", 0, 5)], done=0, token="s", counters=Counter())
    assert admitted.admitted == 1 and client.lrange(redis_keys.FRONTIER_WAKE, 0, -1)


def test_an_admission_retried_after_a_failed_chunk_admits_every_link(client: redis.Redis) -> None:
    class FailingOnce(FrontierQueue):
        calls = 0

        def admit(self, *args: Any, **kwargs: Any) -> Any:
            FailingOnce.calls += 1
            if FailingOnce.calls == 2:
                raise redis.ConnectionError("Redis went away between two chunks")
            return super().admit(*args, **kwargs)

    frontier = Frontier(client)
    runtime = _job(client, frontier, max_pages=100_000)
    links = [(f"http://a.test/p{n}.html", 1, 5) for n in range(2500)]  # 3 chunks of at most 1000
    failing = Frontier(client)
    failing.queue = FailingOnce(failing.scripts)
    with pytest.raises(redis.ConnectionError):
        admit_links(runtime, failing, links, done=0, token="a:5", counters=Counter())
    # The retry (same process, same token) must send the same chunks: nothing was remembered.
    admit_links(runtime, frontier, links, done=0, token="a:5", counters=Counter())
    assert _status(frontier, runtime.job_id)["admitted"] == "2500"


def test_a_batch_that_fetched_nothing_keeps_the_hosts_crawl_delay(client: redis.Redis) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, politeness={"min_interval_s": 0})
    admit_links(runtime, frontier, [("http://a.test/1", 0, 5)], done=0, token="s", counters=Counter(), seeds=True)
    delays = redis_keys.job_delays(runtime.job_id)
    client.hset(delays, "a.test", 1000)  # robots.txt said Crawl-delay: 1
    [batch] = frontier.queue.pump(runtime.job_id, max_batches=1, batch_size=1, per_host=1, interval_ms=0, lease_ms=9000,
                                  cap=8).batches  # fmt: skip
    handed_back = BatchRelease(pause_ms=0, done=0, requeue=batch.entries, fetched=False)
    frontier.queue.release(runtime.job_id, batch, handed_back)
    assert client.hget(delays, "a.test") == "1000"
    [batch] = frontier.queue.pump(runtime.job_id, max_batches=1, batch_size=1, per_host=1, interval_ms=0, lease_ms=9000,
                                  cap=8).batches  # fmt: skip
    fetched = BatchRelease(pause_ms=0, done=1, crawl_delay_s=None)  # fetched: no Crawl-delay now
    frontier.queue.release(runtime.job_id, batch, fetched)
    assert client.hget(delays, "a.test") is None


def test_a_released_batch_keeps_what_it_hands_on_until_it_is_analysed(client: redis.Redis) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, politeness={"min_interval_s": 0})
    admit_links(runtime, frontier, [("http://a.test/", 0, 5)], done=0, token="s", counters=Counter(), seeds=True)
    [batch] = frontier.queue.pump(runtime.job_id, max_batches=1, batch_size=1, per_host=1, interval_ms=0, lease_ms=9000,
                                  cap=8).batches  # fmt: skip
    assert frontier.queue.start_lease(runtime.job_id, batch.batch_id, 9000) == "go"
    fetched = {"job": runtime.job_id, "batch": batch.batch_id, "pages": [{"url": "http://a.test/"}], "redirects": []}
    frontier.queue.release(runtime.job_id, batch, BatchRelease(pause_ms=0, done=0, handed_on=json.dumps(fetched)))
    # Its worker dies before sending the analysis; the fetch message comes again and finds:
    assert frontier.queue.start_lease(runtime.job_id, batch.batch_id, 9000) == "stale"
    assert frontier.queue.handed_on(runtime.job_id, batch.batch_id) == fetched
    admit_links(runtime, frontier, [], done=1, token=f"a:{batch.batch_id}", counters=Counter(),
                analysed_batch=batch.batch_id)  # fmt: skip
    assert frontier.queue.handed_on(runtime.job_id, batch.batch_id) is None
    assert _status(frontier, runtime.job_id)["state"] == "completed"


def test_an_analysis_of_a_release_this_redis_never_saw_finishes_nothing(client: redis.Redis) -> None:
    """A failover to a replica that missed a batch's release: the batch is still leased here (its
    fetch runs again), so its analysis, still running from before, must not finish its pages."""
    frontier = Frontier(client)
    runtime = _job(client, frontier, politeness={"min_interval_s": 0})
    admit_links(runtime, frontier, [("http://a.test/", 0, 5)], done=0, token="s", counters=Counter(), seeds=True)
    [batch] = frontier.queue.pump(runtime.job_id, max_batches=1, batch_size=1, per_host=1, interval_ms=0, lease_ms=9000,
                                  cap=8).batches  # fmt: skip
    late = admit_links(runtime, frontier, [("http://a.test/next", 1, 5)], done=1, token=f"a:{batch.batch_id}",
                       counters=Counter(), analysed_batch=batch.batch_id)  # fmt: skip
    assert late.repeated and late.admitted == 0
    state = _status(frontier, runtime.job_id)
    assert state["state"] == "running" and state["pending"] == "1"  # "/" is not finished twice later
    # The fetch runs again, releases, and its analysis finishes the page once.
    assert frontier.queue.start_lease(runtime.job_id, batch.batch_id, 9000) == "go"
    fetched = {"job": runtime.job_id, "batch": batch.batch_id, "pages": [{"url": "http://a.test/"}], "redirects": []}
    frontier.queue.release(runtime.job_id, batch, BatchRelease(pause_ms=0, done=0, handed_on=json.dumps(fetched)))
    admit_links(runtime, frontier, [], done=1, token=f"a:{batch.batch_id}", counters=Counter(),
                analysed_batch=batch.batch_id)  # fmt: skip
    assert _status(frontier, runtime.job_id)["state"] == "completed"


def test_one_admission_finishes_several_batches_and_only_those_whose_release_this_redis_saw(
    client: redis.Redis,
) -> None:
    """Batches a bundle released together are finished by one admission (engine.fetch_bundle). One
    whose release a failover lost is still leased here: it is left to be fetched and finished again."""
    frontier = Frontier(client)
    hosts = ("a.test", "b.test", "c.test")
    runtime = _job(client, frontier, seeds=[f"http://{host}/" for host in hosts], politeness={"min_interval_s": 0})
    admit_links(runtime, frontier, [(f"http://{host}/", 0, 5) for host in hosts], done=0, token="s",
                counters=Counter(), seeds=True)  # fmt: skip
    batches = frontier.queue.pump(runtime.job_id, max_batches=3, batch_size=1, per_host=1, interval_ms=0,
                                  lease_ms=9000, cap=8).batches  # fmt: skip
    assert sorted(batch.host for batch in batches) == sorted(hosts)
    for batch in batches[:2]:  # the third one's release is lost
        fetched = {"job": runtime.job_id, "batch": batch.batch_id, "pages": [{"url": batch.entries[0].url}]}
        frontier.queue.release(runtime.job_id, batch, BatchRelease(pause_ms=0, done=0, handed_on=json.dumps(fetched)))
    finishes = {batch.batch_id: 1 for batch in batches}
    links = [("http://a.test/next", 1, 5)]
    first = admit_links(runtime, frontier, links, done=3, token="a:g1", counters=Counter(), analysed_batch=finishes)
    assert first.admitted == 1 and not first.repeated
    state = _status(frontier, runtime.job_id)
    assert state["pending"] == "2", state  # /next and the third batch's page
    assert all(frontier.queue.handed_on(runtime.job_id, batch.batch_id) is None for batch in batches[:2])
    again = admit_links(runtime, frontier, links, done=3, token="a:g1", counters=Counter(), analysed_batch=finishes)
    assert again.repeated and _status(frontier, runtime.job_id)["pending"] == "2"  # a retried task: nothing twice
    # None of them there: nothing is finished (each is fetched and finished again).
    late = admit_links(runtime, frontier, [], done=2, token="a:g2", counters=Counter(),
                       analysed_batch={batches[0].batch_id: 1, batches[1].batch_id: 1})  # fmt: skip
    assert late.repeated and _status(frontier, runtime.job_id)["pending"] == "2"


def test_a_release_retried_after_its_reply_was_lost_still_hands_its_pages_on(client: redis.Redis) -> None:
    """The release ran, its reply was lost with the connection (a failover), redis-py sent it again:
    the second call finds the lease gone but the hand-over kept, and says the release stands (seen
    in acceptance check 15: taken for a reclaimed batch, the pages were never analysed)."""
    frontier = Frontier(client)
    runtime = _job(client, frontier, politeness={"min_interval_s": 0})
    admit_links(runtime, frontier, [("http://a.test/", 0, 5)], done=0, token="s", counters=Counter(), seeds=True)
    [batch] = frontier.queue.pump(runtime.job_id, max_batches=1, batch_size=1, per_host=1, interval_ms=0, lease_ms=9000,
                                  cap=8).batches  # fmt: skip
    fetched = {"job": runtime.job_id, "batch": batch.batch_id, "pages": [{"url": "http://a.test/"}], "redirects": []}
    release = BatchRelease(pause_ms=0, done=0, handed_on=json.dumps(fetched))
    assert frontier.queue.release(runtime.job_id, batch, release) is False
    assert frontier.queue.release(runtime.job_id, batch, release) is False  # the retry: not "reclaimed" (None)
    assert frontier.queue.handed_on(runtime.job_id, batch.batch_id) == fetched
    admit_links(runtime, frontier, [], done=1, token=f"a:{batch.batch_id}", counters=Counter(),
                analysed_batch=batch.batch_id)  # fmt: skip
    assert _status(frontier, runtime.job_id)["state"] == "completed"


def test_batch_ids_differ_between_pump_calls_even_when_the_sequence_goes_back(client: redis.Redis) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, politeness={"min_interval_s": 0})
    admit_links(runtime, frontier, [("http://a.test/", 0, 5)], done=0, token="s", counters=Counter(), seeds=True)

    def lease() -> Batch:
        [batch] = frontier.queue.pump(runtime.job_id, max_batches=1, batch_size=1, per_host=1, interval_ms=0,
                                      lease_ms=9000, cap=8).batches  # fmt: skip
        return batch

    first = lease()
    handed_back = BatchRelease(pause_ms=0, done=0, requeue=first.entries, fetched=False)
    frontier.queue.release(runtime.job_id, first, handed_back)
    client.hincrby(redis_keys.job(runtime.job_id), "batch_seq", -1)  # a failover lost the last increment
    second = lease()
    assert first.batch_id.split(".")[0] == second.batch_id.split(".")[0] and first.batch_id != second.batch_id


def test_a_hosts_queue_is_shared_out_while_few_batches_are_in_flight_and_batched_in_full_after(
    client: redis.Redis,
) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, politeness={"min_interval_s": 0}, scope={"hosts": ["a.test"]})
    admit_links(runtime, frontier, [("http://a.test/", 0, 5)], done=0, token="seeds", counters=Counter(), seeds=True)
    links = [(f"http://a.test/{n}", 1, 5) for n in range(40)]
    admit_links(runtime, frontier, links, done=0, token="more", counters=Counter())
    client.hdel(redis_keys.job_delays(runtime.job_id), "a.test")  # its robots.txt is known: not paced

    def size(cap: int) -> int:
        pumped = frontier.queue.pump(runtime.job_id, max_batches=1, batch_size=32, per_host=4, interval_ms=0,
                                     lease_ms=9000, cap=cap)  # fmt: skip
        [batch] = pumped.batches
        return len(batch.entries)

    assert size(cap=64) == 11  # 41 URLs over 4 free slots
    assert size(cap=64) == 10  # 30 over the 3 left
    assert size(cap=4) == 20  # half the cap in flight already: a full batch (all that is left)


def test_paced_hosts_batches_are_marked(client: redis.Redis) -> None:
    frontier = Frontier(client)
    eager = _job(client, frontier, politeness={"min_interval_s": 0}, scope={"hosts": ["a.test", "b.test"]})
    urls = [("http://a.test/1", 0, 5), ("http://a.test/2", 0, 5), ("http://b.test/1", 0, 5)]
    admit_links(eager, frontier, urls, done=0, token="seeds", counters=Counter(), seeds=True)
    client.hdel(redis_keys.job_delays(eager.job_id), "a.test")  # a.test's robots.txt is known: no delay
    batches = frontier.queue.pump(eager.job_id, max_batches=4, batch_size=8, per_host=4, interval_ms=0, lease_ms=9000,
                                cap=8).batches  # fmt: skip
    # b.test was never fetched: one request at a time until its robots.txt is known, so paced.
    # a.test's two URLs are shared out over its free slots (the job has few batches in flight):
    # one now, the other in the pump's next round.
    assert {(batch.host, len(batch.entries), batch.paced) for batch in batches} == {("a.test", 1, False),
                                                                                     ("b.test", 1, True)}  # fmt: skip
    polite = _job(client, frontier, politeness={"min_interval_s": 0.5})
    admit_links(polite, frontier, urls[:1], done=0, token="seeds", counters=Counter(), seeds=True)
    client.hdel(redis_keys.job_delays(polite.job_id), "a.test")
    [batch] = frontier.queue.pump(polite.job_id, max_batches=4, batch_size=1, per_host=1, interval_ms=500,
                                  lease_ms=9000, cap=8).batches  # fmt: skip
    assert batch.paced  # an interval paces every host of the job
    assert Batch.from_dict(batch.to_dict()) == batch


def test_a_failed_job_stops_like_a_cancelled_one_and_says_why(client: redis.Redis) -> None:
    frontier = Frontier(client)
    runtime = _job(client, frontier, politeness={"min_interval_s": 0})
    urls = [("http://a.test/1", 0, 5), ("http://a.test/2", 0, 5)]
    admit_links(runtime, frontier, urls, done=0, token="seeds", counters=Counter(), seeds=True)
    [batch] = frontier.queue.pump(runtime.job_id, max_batches=1, batch_size=1, per_host=1, interval_ms=0,
                                  lease_ms=9000, cap=8).batches  # fmt: skip
    assert client.exists(*runtime.bloom.keys)

    assert frontier.jobs.fail(runtime.job_id, "ConfigError: VCRAWL_HDFS_USER must be set", 123.5)
    state = _status(frontier, runtime.job_id)
    assert (state["state"], state["error"], state["finished_at"]) == (
        "failed", "ConfigError: VCRAWL_HDFS_USER must be set", "123.5")  # fmt: skip
    assert not frontier.jobs.fail(runtime.job_id, "again", 124.0)  # final: neither failed again nor cancelled
    assert not frontier.jobs.cancel(runtime.job_id, 124.0)
    assert not frontier.jobs.is_running(runtime.job_id)
    # The batch in flight is handed back unfetched; nothing more is dispatched.
    assert frontier.queue.start_lease(runtime.job_id, batch.batch_id, 9000) == "stopped"
    handed_back = BatchRelease(pause_ms=0, done=0, requeue=batch.entries, fetched=False)
    assert frontier.queue.release(runtime.job_id, batch, handed_back) is False
    assert not client.zrange(redis_keys.job_ready(runtime.job_id), 0, -1)
    pumped = frontier.queue.pump(runtime.job_id, max_batches=1, batch_size=1, per_host=1, interval_ms=0,
                                 lease_ms=9000, cap=8)  # fmt: skip
    assert pumped.stopped and not pumped.batches
    # The pump forgets it as it forgets a cancelled job: out of the running set, its filter gone.
    frontier.jobs.forget_if_stopped(runtime.job_id, runtime.bloom.keys)
    assert runtime.job_id not in frontier.jobs.running_jobs()
    assert not client.exists(*runtime.bloom.keys)
    status = job_status(frontier, runtime.job_id)
    assert status is not None and status["state"] == "failed"
    assert status["error"] == "ConfigError: VCRAWL_HDFS_USER must be set" and status["finished_at"] == 123.5


def test_only_a_running_or_paused_job_can_fail(client: redis.Redis) -> None:
    frontier = Frontier(client)
    paused = _job(client, frontier)
    assert frontier.jobs.pause(paused.job_id, time.time())
    assert frontier.jobs.fail(paused.job_id, "boom", time.time())
    assert frontier.jobs.resume(paused.job_id) is None  # a failed job does not come back
    assert _status(frontier, paused.job_id)["state"] == "failed"

    completed = _job(client, frontier)
    admit_links(completed, frontier, [], done=0, token="seeds", counters=Counter(), seeds=True)
    assert _status(frontier, completed.job_id)["state"] == "completed"
    assert not frontier.jobs.fail(completed.job_id, "too late", time.time())
    assert "error" not in _status(frontier, completed.job_id)
    assert not frontier.jobs.fail("no-such-job", "nothing to fail", time.time())


class _Runtimes:
    """Hands out one prepared runtime (what RuntimeCache does from Redis)."""

    def __init__(self, runtime: JobRuntime) -> None:
        self._runtime = runtime

    def get(self, job_id: str, cycle: int = 0) -> JobRuntime:
        return self._runtime


def _env(client: redis.Redis, frontier: Frontier, runtime: JobRuntime, data: Path) -> CrawlEnv:
    """What an analysis errback uses: the frontier and the job's runtime (no alert goes out)."""
    return CrawlEnv(frontier, _Runtimes(runtime), RobotsCache(client), Storage(str(data)), Alerter(), lambda key: False)


def _paced_batch(client: redis.Redis) -> tuple[Frontier, Any, Batch]:
    """A job paced at 0.25 s with one host's two URLs leased as one batch (not started)."""
    frontier = Frontier(client)
    runtime = _job(client, frontier, politeness={"min_interval_s": 0.25})
    admit_links(runtime, frontier, [("http://a.test/1", 0, 5), ("http://a.test/2", 0, 5)], done=0, token="seeds",
                counters=Counter(), seeds=True)  # fmt: skip
    [batch] = frontier.queue.pump(runtime.job_id, max_batches=1, batch_size=2, per_host=1, interval_ms=250,
                                  lease_ms=60_000, cap=8).batches  # fmt: skip
    return frontier, runtime, batch


def test_a_paced_batch_renews_its_lease_before_each_further_request_and_learns_when_it_lost_it(
    client: redis.Redis,
) -> None:
    """``renew_lease``: go, stopped (paused or another cycle), stale (its deadline passed and it was
    reclaimed); the deadline set at the start covers the whole batch and stays."""
    frontier, runtime, batch = _paced_batch(client)
    assert frontier.queue.start_lease(runtime.job_id, batch.batch_id, 60_000) == "go"
    assert frontier.queue.renew_lease(runtime.job_id, batch.batch_id) == "go"
    assert frontier.queue.renew_lease(runtime.job_id, batch.batch_id, cycle=2) == "stopped"  # not its cycle
    assert frontier.jobs.pause(runtime.job_id, 1.0)
    assert frontier.queue.renew_lease(runtime.job_id, batch.batch_id) == "stopped"
    assert frontier.jobs.resume(runtime.job_id) is not None
    assert frontier.queue.reclaim_expired(runtime.job_id, max_attempts=3, interval_ms=0) == (0, 0)
    assert frontier.queue.start_lease(runtime.job_id, batch.batch_id, 1) == "go"  # a deadline 1 ms away
    assert frontier.queue.renew_lease(runtime.job_id, batch.batch_id) == "go"  # does not move it
    time.sleep(0.01)
    # one lease: both URLs (a paced job's host takes a whole batch before its robots.txt is read)
    assert frontier.queue.reclaim_expired(runtime.job_id, max_attempts=3, interval_ms=0) == (len(batch.entries), 0)
    assert len(batch.entries) == 2
    assert frontier.queue.renew_lease(runtime.job_id, batch.batch_id) == "stale"


def test_a_second_copy_of_a_batch_s_message_neither_starts_nor_renews_the_lease_the_first_holds(
    client: redis.Redis,
) -> None:
    """At-least-once delivery: a copy of a fetch message delivered while the first run still fetches
    (put back after a failover, say) does nothing; the first run's retried call still goes on."""
    frontier, runtime, batch = _paced_batch(client)
    assert frontier.queue.start_lease(runtime.job_id, batch.batch_id, 60_000, "first") == "go"
    assert frontier.queue.start_lease(runtime.job_id, batch.batch_id, 60_000, "first") == "go"  # a retried call
    assert frontier.queue.start_lease(runtime.job_id, batch.batch_id, 60_000, "copy") == "taken"
    assert frontier.queue.renew_lease(runtime.job_id, batch.batch_id, token="copy") == "taken"
    assert frontier.queue.renew_lease(runtime.job_id, batch.batch_id, token="first") == "go"
    # A failover lost the start (the replica has the pump's lease, no owner): the run that started
    # it adopts it at its next renewal, and a copy arriving later finds it taken.
    lease = json.loads(client.hget(redis_keys.job_leases(runtime.job_id), batch.batch_id))
    del lease["o"]
    client.hset(redis_keys.job_leases(runtime.job_id), batch.batch_id, json.dumps(lease))
    assert frontier.queue.renew_lease(runtime.job_id, batch.batch_id, token="first") == "go"
    assert frontier.queue.start_lease(runtime.job_id, batch.batch_id, 60_000, "copy") == "taken"


def test_at_the_shipped_lease_length_a_renewal_keeps_the_deadline_and_learns_of_a_lease_handed_over(
    client: redis.Redis,
) -> None:
    """The twin of the renewal test above at the lease a paced batch gets with the shipped limits
    (engine.jobs.lease_ms): the renewal leaves the deadline where the start set it, and a lease
    taken away (handed over, as for a worker declared down) is stale at the next renewal."""
    frontier, runtime, batch = _paced_batch(client)
    shipped_ms = lease_ms(runtime)
    assert runtime.limits.total_timeout_s == Settings().total_timeout_s  # shipped
    assert shipped_ms == (runtime.limits.total_timeout_s * runtime.batch_size + 60) * 1000  # per URL, plus a minute
    assert frontier.queue.start_lease(runtime.job_id, batch.batch_id, shipped_ms, "run") == "go"
    deadline = json.loads(client.hget(redis_keys.job_leases(runtime.job_id), batch.batch_id))["t"]
    assert frontier.queue.renew_lease(runtime.job_id, batch.batch_id, token="run") == "go"
    assert json.loads(client.hget(redis_keys.job_leases(runtime.job_id), batch.batch_id))["t"] == deadline
    assert frontier.queue.hand_over(runtime.job_id, [batch.batch_id], 250) == len(batch.entries)  # queued again
    assert frontier.queue.renew_lease(runtime.job_id, batch.batch_id, token="run") == "stale"


def test_a_bundle_leases_hosts_due_soon_ahead_started_for_itself_at_their_due_time(client: redis.Redis) -> None:
    """``pump(ahead_ms=..., owner=...)``: a host due within the window is leased now, its batch says
    when it is due (never earlier), and its lease is already started for the owner (a copy with
    another token finds it taken); without the window, the same host is not leased before it is due."""
    frontier = Frontier(client)
    runtime = _job(client, frontier, politeness={"min_interval_s": 0.25})
    admit_links(runtime, frontier, [("http://a.test/1", 0, 5), ("http://a.test/2", 0, 5)], done=0, token="seeds",
                counters=Counter(), seeds=True)  # fmt: skip
    shape = {"max_batches": 8, "batch_size": 1, "per_host": 1, "interval_ms": 250, "lease_ms": 60_000, "cap": 8}
    [first] = frontier.queue.pump(runtime.job_id, **shape).batches
    assert first.due_in_s == 0.0
    assert frontier.queue.start_lease(runtime.job_id, first.batch_id, 60_000, "run-1") == "go"
    frontier.queue.release(runtime.job_id, first, BatchRelease(pause_ms=400, done=1, host_delay_ms=400))
    not_yet = frontier.queue.pump(runtime.job_id, **shape)
    assert not_yet.batches == () and not_yet.next_due_s is not None and 0.2 < not_yet.next_due_s <= 0.4
    [ahead] = frontier.queue.pump(runtime.job_id, **shape, ahead_ms=1000, owner="bundle-1").batches
    assert ahead.host == "a.test" and [entry.url for entry in ahead.entries] == ["http://a.test/2"]
    assert 0.2 < ahead.due_in_s <= 0.4  # from the host's next time, not from the call
    assert frontier.queue.start_lease(runtime.job_id, ahead.batch_id, 60_000, "a-copy") == "taken"
    assert frontier.queue.renew_lease(runtime.job_id, ahead.batch_id, token="bundle-1") == "go"
    lease = json.loads(client.hget(redis_keys.job_leases(runtime.job_id), ahead.batch_id))
    assert lease["o"] == "bundle-1" and lease["s"] >= lease["t"] - 60_000  # started at its due time


def test_renewing_several_leases_in_one_call_answers_each_as_a_renewal_of_its_own(client: redis.Redis) -> None:
    """``renew_leases``: go for a lease held by its token, taken for one held by another run, stale for
    one gone, stopped for another cycle and, for all, while the job is paused; a lease whose start
    was lost is adopted. A write: the renewals counter moves when nothing else was written."""
    frontier = Frontier(client)
    runtime = _job(client, frontier, politeness={"min_interval_s": 0.25, "per_host": 4})
    urls = [(f"http://a.test/{n}", 0, 5) for n in range(4)]
    admit_links(runtime, frontier, urls, done=0, token="seeds", counters=Counter(), seeds=True)
    client.hdel(redis_keys.job_delays(runtime.job_id), "a.test")  # its robots.txt is known: four slots
    shape = {"max_batches": 8, "batch_size": 1, "per_host": 4, "interval_ms": 0, "lease_ms": 60_000, "cap": 8}
    mine, other, gone, unstarted = (frontier.queue.pump(runtime.job_id, **shape).batches[0] for _ in range(4))
    assert frontier.queue.start_lease(runtime.job_id, mine.batch_id, 60_000, "me") == "go"
    assert frontier.queue.start_lease(runtime.job_id, other.batch_id, 60_000, "someone") == "go"
    assert frontier.queue.start_lease(runtime.job_id, gone.batch_id, 60_000, "me") == "go"
    frontier.queue.hand_over(runtime.job_id, [gone.batch_id], 0)
    renewals = redis_keys.job_renewals(runtime.job_id)
    ask = [(mine.batch_id, 0, "me"), (other.batch_id, 0, "me"), (gone.batch_id, 0, "me"), (mine.batch_id, 7, "me")]
    assert frontier.queue.renew_leases(runtime.job_id, ask) == ["go", "taken", "stale", "stopped"]
    assert client.get(renewals) == "1"
    assert frontier.queue.renew_leases(runtime.job_id, [(unstarted.batch_id, 0, "me")]) == ["go"]  # adopted
    assert client.get(renewals) == "1"  # the adoption was the write
    assert frontier.queue.renew_lease(runtime.job_id, unstarted.batch_id, token="someone") == "taken"
    assert frontier.jobs.pause(runtime.job_id, 1.0)
    assert frontier.queue.renew_leases(runtime.job_id, [(mine.batch_id, 0, "me")]) == ["stopped"]
    assert frontier.queue.renew_leases(runtime.job_id, []) == []


def test_a_handed_over_host_waits_its_pause_plus_the_time_a_renewal_holds(client: redis.Redis) -> None:
    """A batch in a bundle may still send one request on a renewal it got up to RENEWAL_HOLDS_S before
    its lease was handed over: the host's next request then waits its interval plus that hold."""
    frontier = Frontier(client)
    runtime = _job(client, frontier, politeness={"min_interval_s": 0.25})
    admit_links(runtime, frontier, [("http://a.test/1", 0, 5), ("http://a.test/2", 0, 5)], done=0, token="seeds",
                counters=Counter(), seeds=True)  # fmt: skip
    client.hdel(redis_keys.job_delays(runtime.job_id), "a.test")  # robots.txt known
    [batch] = frontier.queue.pump(runtime.job_id, max_batches=1, batch_size=1, per_host=1, interval_ms=250,
                                  lease_ms=lease_ms(runtime), cap=8).batches  # fmt: skip
    assert frontier.queue.start_lease(runtime.job_id, batch.batch_id, lease_ms(runtime), "run") == "go"
    seconds, micros = client.time()
    assert frontier.queue.hand_over(runtime.job_id, [batch.batch_id], 250) == 1
    due_ms = float(client.zscore(redis_keys.job_ready(runtime.job_id), "a.test"))
    assert due_ms - (seconds * 1000 + micros // 1000) >= 250 + RENEWAL_HOLDS_S * 1000  # ms, as Redis counts
