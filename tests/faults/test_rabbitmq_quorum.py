"""vcrawl on RabbitMQ quorum queues (``VCRAWL_RABBITMQ_QUORUM=true``): a three-node cluster loses nothing
when the node leading the ``download`` queue is SIGKILLed mid-crawl, and a task retried with a countdown
waits in the broker (Celery's native delayed delivery), not in a worker.

Real processes: RabbitMQ nodes on loopback (tests/rabbitmq.py), a redis-server, ``celery worker``
subprocesses and test sites on distinct 127.0.0.x addresses. Marker ``rabbitmq``: ``make test-rabbitmq``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from celeryconfig import ANALYSIS_QUEUE, DOWNLOAD_QUEUE, DYNAMIC_QUEUE
from cli.local_redis import LocalRedis
from engine.jobs import paced_batch_size
from engine.trail import TERMINAL_STATES
from frontier import Frontier
from storage import Storage
from storage.records import read_records
from tests.cluster import cluster_env, start_job, start_worker, stop_worker, submit, wait_all
from tests.faults.test_faults import Note, fault_settings, fetches, serve_pages, stop_gracefully, wait_done
from tests.rabbitmq import LocalRabbitMQ, RabbitCluster
from tests.site import Response, TestSite
from tests.waiting import wait_until
from vcrawl.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.rabbitmq]

VCRAWL_QUEUES = (DOWNLOAD_QUEUE, DYNAMIC_QUEUE, ANALYSIS_QUEUE)


def queue_listing(node: LocalRabbitMQ, *columns: str) -> list[dict]:
    """``rabbitmqctl list_queues COLUMNS`` of ``node`` as dicts."""
    done = node.ctl("list_queues", "name", *columns, "--formatter", "json")
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout or b"[]"))


def quorum_env(redis_server: LocalRedis, data: Path, broker_urls: list[str], shipped: bool = False,
               **changes: Any) -> dict[str, str]:  # fmt: skip
    """The fault tests' settings (short fetch timeouts; ``shipped``: the shipped settings), vcrawl's queues as
    quorum queues on ``broker_urls`` (Celery fails over between them in their order)."""
    base = Settings(redis_url=redis_server.url, data=str(data)) if shipped else fault_settings(redis_server, data)
    settings = replace(base, broker_url=";".join(broker_urls), rabbitmq_quorum=True)
    return cluster_env(replace(settings, **changes))


def test_a_countdown_retry_waits_in_the_broker_and_the_worker_goes_on(tmp_path: Path, fault_report: Note) -> None:
    """A 503 with ``Retry-After: 8`` is retried 8 s later through the ``celery_delayed_*`` quorum queues,
    while the worker (one thread: prefetch 1) fetches other pages; a sub-second backoff is retried too.

    Held in the worker instead (direct exchanges: Celery's ETA path), the retry would take its one
    prefetch slot: with global QoS off on quorum queues, Celery's raised prefetch never reaches the
    running consumer, and the other pages would wait the 8 s out.
    """
    with LocalRabbitMQ(tmp_path / "rabbit") as node, LocalRedis(tmp_path / "redis") as server, \
            TestSite("127.0.0.5") as busy, TestSite("127.0.0.6") as other:  # fmt: skip
        # Retry-After up to 10 s is waited for; one host's pages back to back (its own politeness aside).
        env = quorum_env(server, tmp_path / "data", [node.url], max_retry_after_s=10.0, min_interval_s=0.0)
        later = busy.add_sequence("/later", [Response(b"busy", 503, {"Retry-After": "8"}), Response(b"<p>ok</p>")])
        flaky = busy.add_sequence("/flaky", [Response(b"busy", 503), Response(b"<p>ok</p>")])  # backoff 0.2 s
        others = [other.add_page(f"/o{n}", "<p>other</p>") for n in range(5)]
        worker = start_worker(env, "single", tmp_path / "worker.log", concurrency=1)
        try:
            [later_id] = submit(env, [{"url": later}])
            wait_until(lambda: busy.requests_to("/later"), 20, "the first request to /later")
            other_ids = submit(env, [{"url": url} for url in others])  # while the retry waits
            delayed = wait_until(lambda: [q["name"] for q in queue_listing(node, "messages")
                                          if q["name"].startswith("celery_delayed_") and q["messages"]],
                                 5, "the retry in a celery_delayed_* queue", poll_s=0.2)  # fmt: skip
            records = wait_all(env, other_ids, set(TERMINAL_STATES), 20)
            [flaky_id] = submit(env, [{"url": flaky}])
            records |= wait_all(env, [later_id, flaky_id], set(TERMINAL_STATES), 30)
            assert worker.poll() is None
        finally:
            stop_worker(worker)
    first, second = busy.requests_to("/later")
    other_fetched = sorted(seen.at for seen in other.seen if seen.path.startswith("/o"))
    fault_report(
        retry_waited_s=round(second.at - first.at, 2),
        delayed_queues=delayed,
        others_fetched_within_s=round(other_fetched[-1] - first.at, 2),
        flaky_retry_after_s=round(busy.requests_to("/flaky")[1].at - busy.requests_to("/flaky")[0].at, 2),
    )
    assert {records[i]["state"] for i in (later_id, flaky_id, *other_ids)} == {"analyzed"}, records
    assert records[later_id]["attempts"] == 2 and records[flaky_id]["attempts"] == 2
    assert second.at - first.at >= 8.0  # Retry-After honoured: the ETA header holds the exact time
    assert len(other_fetched) == 5 and other_fetched[-1] < second.at  # the worker was not held by the retry
    # A 0.2 s backoff goes through the broker as one second (Celery refuses a countdown under 1 s there).
    flaky_first, flaky_second = busy.requests_to("/flaky")
    assert 0.9 <= flaky_second.at - flaky_first.at < 5.0


def test_the_download_queues_leader_node_sigkilled_mid_crawl_loses_nothing(tmp_path: Path, fault_report: Note) -> None:
    """Three RabbitMQ nodes, vcrawl's queues quorum queues (a leader and two followers each); the node
    leading ``download`` is SIGKILLed with the crawl under way. The queues elect new leaders on the
    surviving two, the workers connected to the dead node fail over to the next node of their
    ``VCRAWL_BROKER_URL`` list, and every page is fetched and stored."""
    with RabbitCluster(tmp_path / "rabbits", size=3) as cluster, LocalRedis(tmp_path / "redis") as server, \
            TestSite("127.0.0.7") as a, TestSite("127.0.0.8") as b:  # fmt: skip
        data = tmp_path / "data"
        urls = cluster.urls
        # Each worker lists the nodes in its own order: their connections (and the queues' first
        # leaders, placed on the node of the client that declared them) spread over the cluster.
        # The shipped settings and job limits: the promise holds with the defaults users run.
        envs = [quorum_env(server, data, urls[n:] + urls[:n], shipped=True) for n in range(2)]
        expected = {site.base: serve_pages(site, 60) for site in (a, b)}
        job = {"seeds": [a.url("/"), b.url("/")], "politeness": {"min_interval_s": 0.1, "jitter": 0}}
        workers = [start_worker(env, f"w{n}", tmp_path / f"w{n}.log") for n, env in enumerate(envs)]
        try:
            types = {q["name"]: q["type"] for q in queue_listing(cluster.nodes[0], "type")}
            job_id = start_job(envs[0], job)
            frontier = Frontier(redis.Redis.from_url(server.url))
            wait_until(lambda: len(fetches(a)) + len(fetches(b)) >= 30, 30, "30 pages fetched")
            leader = cluster.leader_of(DOWNLOAD_QUEUE)
            analysis_leader = cluster.leader_of(ANALYSIS_QUEUE)
            fetched_before = len(fetches(a)) + len(fetches(b))
            leader.kill()
            killed_at = time.monotonic()
            status = wait_done(lambda: frontier, job_id, 90)
            completed_after_s = time.monotonic() - killed_at
            new_leader = cluster.leader_of(DOWNLOAD_QUEUE)
            alive = [worker.poll() is None for worker in workers]
        finally:
            for worker in workers:
                stop_gracefully(worker)  # a warm shutdown ships the spooled records
            for worker in workers:
                stop_worker(worker)
    fetch_log = list(read_records(Storage(str(data)), f"jobs/{job_id}/fetch-log"))  # the job's output, per page
    logged = Counter(entry["url"] for entry in fetch_log if entry["outcome"] == "stored")
    pages = [path for path in (data / "jobs" / job_id / "pages").rglob("*") if path.is_file()]
    seen = {site.base: fetches(site) for site in (a, b)}
    refetched = {base: sum(counts.values()) - len(counts) for base, counts in seen.items()}
    fault_report(fault="RabbitMQ node leading the download quorum queue SIGKILLed mid-crawl (3 nodes)",
                 killed=leader.node, analysis_leader=analysis_leader.node, new_leader=new_leader.node,
                 pages_fetched_before_kill=fetched_before, completed_s_after_kill=round(completed_after_s, 1),
                 state=status["state"], pages_expected=122, pages_stored=status["pages_stored"],
                 fetch_log_lines=len(fetch_log), page_files=len(pages), refetched=refetched)  # fmt: skip
    assert {types.get(name) for name in VCRAWL_QUEUES} == {"quorum"}, types
    assert new_leader is not leader
    assert alive == [True, True]  # both workers outlived the node, the one connected to it included
    assert status["state"] == "completed", status
    assert status["pages_stored"] == 122 and status["failed"] == {}
    for site in (a, b):
        assert set(seen[site.base]) == set(expected[site.base])  # every page, as an undisturbed run
        # One paced batch per host in flight when the node died (politeness 1 per host). Its message goes
        # back to the queue; a batch found fetched before is not fetched again (its analysis goes again),
        # one cut mid-way is, whole: at most a paced batch's URLs (8 at 0.1 s, engine.jobs.paced_batch_size).
        assert refetched[site.base] <= paced_batch_size(0.1, Settings().frontier_batch), seen[site.base].most_common(3)
    # Every page in the job's output, once; a page fetched again is logged again, nothing else is.
    assert len(logged) == 122 and len(pages) == 122
    assert sum(logged.values()) - len(logged) <= sum(refetched.values()), logged.most_common(3)
