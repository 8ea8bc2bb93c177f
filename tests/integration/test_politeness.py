"""Per-host politeness for single tasks: gaps measured server-side, no retry storm, no held slot."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
import redis

from cli.local_redis import LocalRedis
from frontier import HostGate
from tests.cluster import cluster_env, start_worker, stop_worker, submit, wait_all
from tests.site import TestSite
from vcrawl.policies import PolitenessPolicy
from vcrawl.settings import Settings

INTERVAL_S = 0.6

pytestmark = pytest.mark.slow


def test_gate_reserves_slots_in_order_and_measures_the_pause_from_the_end(redis_server: LocalRedis) -> None:
    policy = PolitenessPolicy(0.3, jitter=0.0)
    first = HostGate(redis.Redis.from_url(redis_server.url), policy)
    second = HostGate(redis.Redis.from_url(redis_server.url), policy)
    host = f"gate-{time.monotonic_ns()}.test"

    assert first.reserve(host) == 0  # free: start now
    slot = second.reserve(host)  # busy: the next slot, a pause after the first start
    later = second.reserve(host)  # and the one after that
    assert slot > 0 and later - slot == 300
    assert second.reserve("other.test") == 0
    time.sleep(0.35)
    first.release(host)  # a slow first request: the pause now runs from its end
    come_back = second.reserve(host, slot)  # the reserved slot came, but the host rests until then
    assert come_back > slot
    time.sleep(max(0.0, come_back / 1000 - time.time()) + 0.01)
    assert second.reserve(host, slot) == 0


def test_one_slot_worker_keeps_host_gaps_and_serves_other_hosts_meanwhile(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "redis") as server, TestSite("127.0.0.1") as slow, TestSite("127.0.0.2") as other:
        env = cluster_env(
            Settings(redis_url=server.url, data=str(tmp_path / "data"), min_interval_s=INTERVAL_S, interval_jitter=0.2)
        )
        slow_urls = [slow.add_page(f"/p{n}.html", f"<p>{n}</p>") for n in range(6)]
        other_url = other.add_page("/only.html", "<p>other host</p>")
        worker = start_worker(env, "polite", tmp_path / "worker.log", concurrency=1)
        try:
            ids = submit(env, [{"url": url} for url in slow_urls] + [{"url": other_url}])
            records = wait_all(env, ids, {"analyzed"}, 60)
        finally:
            stop_worker(worker)
        log = (tmp_path / "worker.log").read_text()
        runs = sum(1 for line in log.splitlines() if "Task vcrawl.fetch[" in line and line.endswith("received"))

    arrivals = sorted(seen.at for seen in slow.seen)  # robots.txt is a request to the host too
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert len(arrivals) == 7 and len(slow.requests_to("/robots.txt")) == 1  # read once, then cached
    assert min(gaps) >= INTERVAL_S * 0.98, gaps  # never below the interval, measured by the server
    # With one worker slot, the other host's page was fetched while the slow host waited.
    assert other.seen[0].at < arrivals[-1]
    assert all(record["attempts"] == 1 for record in records.values())  # waiting is not an attempt
    # Reserved slots: each task is re-queued a bounded number of times, not once per wake-up.
    assert len(ids) <= runs <= 3 * len(ids), runs
