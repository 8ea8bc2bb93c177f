"""A node's fetch statistics in memory (``engine.node_meter``), as the listing figures them
(``cluster.node_stats.node_figures``), and the pool threads that grow and shrink (``cluster.threads``)."""

from __future__ import annotations

import threading
import time

import pytest
from celery.concurrency.thread import TaskPool as CeleryThreadPool

from cluster.node_stats import node_figures
from cluster.threads import ResizableThreads
from engine.node_meter import NodeMeter, NodeTally
from engine.outcomes import Failed, Redirected, Retry, RobotsFetched, Stored
from frontier import Entry
from vcrawl.payloads import FetchedPage


def _entry(url: str = "http://a.example/x") -> Entry:
    return Entry(url, 0)


def test_the_meter_counts_requests_bytes_time_hosts_and_outcomes_then_starts_afresh() -> None:
    meter = NodeMeter()
    meter.request("http://a.example/x", 1000, 0.25)
    meter.request("http://a.example:8080/robots.txt", 20, 0.05)
    meter.request("https://b.example/y", 0, 2.0, redirects=2)  # answered after two redirects
    meter.outcome(Stored(_entry(), FetchedPage("http://a.example/x", "http://a.example/x", "p/x", 200, 1000)))
    meter.outcome(Failed(_entry(), "http_404", 404, "not found"))
    meter.outcome(Retry(_entry(), "timeout", 1.0, "queue"))
    meter.outcome(Redirected(_entry(), "http://a.example/z"))  # neither
    meter.outcome(RobotsFetched(_entry()))  # neither
    tally = meter.take()
    assert tally == NodeTally(requests=5, successes=1, failures=2, bytes=1020, busy_s=pytest.approx(2.3),
                              hosts=frozenset({"a.example", "a.example:8080", "b.example"}))  # fmt: skip
    assert meter.take().empty


def test_a_tally_not_written_comes_back_with_the_next() -> None:
    meter = NodeMeter()
    meter.request("http://a.example/x", 10, 0.1)
    first = meter.take()
    meter.request("http://b.example/x", 5, 0.1)
    meter.put_back(first)
    assert meter.take() == NodeTally(requests=2, bytes=15, busy_s=pytest.approx(0.2),
                                     hosts=frozenset({"a.example", "b.example"}))  # fmt: skip


def test_threads_counting_at_once_lose_nothing() -> None:
    meter = NodeMeter()

    def count() -> None:
        for _ in range(2000):
            meter.request("http://a.example/x", 3, 0.001)

    threads = [threading.Thread(target=count) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    tally = meter.take()
    assert (tally.requests, tally.bytes) == (16000, 48000)


def test_figures_of_a_node_that_joined_within_the_window_count_from_its_join() -> None:
    # Joined 30 s ago; the window is the last 5 minutes: its rates count 30 s, not 5 minutes.
    now_ms = 10 * 60_000 + 20_000
    minutes = list(range(6, 11))
    bucket = {"requests": 40, "successes": 30, "failures": 2, "bytes": 60_000, "busy_ms": 12_000}
    figures = node_figures({**bucket, "joined_ms": now_ms - 30_000}, 4, [{}, {}, {}, {}, bucket], minutes, now_ms)
    assert figures["recent"]["pages_per_s"] == 1.0 and figures["pages_per_s"] == 1.0
    assert figures["bandwidth_bps"] == 5000.0 and figures["bytes_per_s"] == 2000.0
    assert [minute["minute"] for minute in figures["minutes"]] == [360, 420, 480, 540, 600]
    assert figures["minutes"][-1]["requests"] == 40 and figures["hosts_visited"] == 4


def test_celery_threads_pool_cannot_grow_which_is_why_vcrawl_ships_its_own() -> None:
    # Celery 5.7: pool_grow / pool_shrink / --autoscale call pool.grow / pool.shrink, which its
    # threads pool does not have. If a later Celery adds them, tasks.pool may go.
    assert not hasattr(CeleryThreadPool, "grow") and not hasattr(CeleryThreadPool, "shrink")


def _most_at_once(pool: ResizableThreads, calls: int, hold_s: float) -> int:
    """Submit ``calls`` calls that each hold for ``hold_s``; return how many ran at once at most."""
    lock, running, most = threading.Lock(), [0], [0]

    def hold() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(hold_s)
        with lock:
            running[0] -= 1

    for future in [pool.submit(hold) for _ in range(calls)]:
        future.result(timeout=30)
    return most[0]


def test_resizable_threads_run_as_many_calls_at_once_as_their_size_after_growing_and_shrinking() -> None:
    pool = ResizableThreads(2)
    try:
        assert _most_at_once(pool, 8, 0.05) == 2
        pool.resize(5)
        assert _most_at_once(pool, 15, 0.05) == 5
        pool.resize(1)
        assert _most_at_once(pool, 4, 0.02) == 1
        deadline = time.monotonic() + 5
        while pool.threads > 1 and time.monotonic() < deadline:  # idle threads past the size leave
            time.sleep(0.01)
        assert pool.threads == 1
    finally:
        pool.shutdown(wait=True)


def test_after_shrinking_and_growing_again_every_slot_is_used() -> None:
    # Threads start as calls find none idle: the idle count must survive threads leaving after a shrink.
    pool = ResizableThreads(4)
    try:
        assert _most_at_once(pool, 12, 0.05) == 4
        pool.resize(1)
        assert _most_at_once(pool, 6, 0.02) == 1
        pool.resize(4)
        assert _most_at_once(pool, 12, 0.05) == 4
        pool.resize(2)
        pool.resize(5)
        assert _most_at_once(pool, 15, 0.05) == 5
    finally:
        pool.shutdown(wait=True)


def test_a_pool_grown_after_running_with_a_queue_starts_every_new_slot() -> None:
    # Calls queued behind busy threads are taken as each thread finishes: no thread may count itself idle
    # then, or a later grow finds idle counts no thread stands for and starts too few (seen: 5 of 6 slots).
    pool = ResizableThreads(2)
    try:
        assert _most_at_once(pool, 40, 0.01) == 2
        pool.resize(6)
        assert _most_at_once(pool, 12, 0.05) == 6
    finally:
        pool.shutdown(wait=True)


def test_a_shrink_lets_the_task_in_hand_finish() -> None:
    pool = ResizableThreads(2)
    release = threading.Event()
    try:
        futures = [pool.submit(release.wait, 10) for _ in range(2)]
        pool.resize(1)
        release.set()
        assert [future.result(timeout=10) for future in futures] == [True, True]
    finally:
        pool.shutdown(wait=True)


def test_results_and_exceptions_reach_the_future_and_a_shut_pool_takes_no_more() -> None:
    pool = ResizableThreads(1)
    assert pool.submit(lambda a, b: a + b, 2, b=3).result(timeout=5) == 5
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=5)
    pool.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        pool.submit(print)
    with pytest.raises(ValueError):
        ResizableThreads(0)
