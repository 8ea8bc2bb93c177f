"""Per-host politeness: gaps measured server-side, and a waiting host never holds a worker slot."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
import redis

from frontier import HostGate
from tests.cluster import cluster_env, start_worker, stop_worker, submit, wait_all
from tests.site import TestSite
from vcrawl.local_redis import LocalRedis
from vcrawl.policies import PolitenessPolicy
from vcrawl.settings import Settings

INTERVAL_S = 0.6

pytestmark = pytest.mark.slow


def test_gate_holds_a_host_for_the_pause_across_clients(redis_server: LocalRedis) -> None:
    first = HostGate(redis.Redis.from_url(redis_server.url), PolitenessPolicy(0.3, jitter=0.0))
    second = HostGate(redis.Redis.from_url(redis_server.url), PolitenessPolicy(0.3, jitter=0.0))

    assert first.try_claim("gate.test") == 0.0
    wait_s = second.try_claim("gate.test")
    assert 0.2 < wait_s <= 0.3
    assert second.try_claim("other.test") == 0.0
    time.sleep(wait_s + 0.02)
    assert second.try_claim("gate.test") == 0.0


def test_one_slot_worker_keeps_host_gaps_and_serves_other_hosts_meanwhile(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "redis") as server, TestSite("127.0.0.1") as slow, TestSite("127.0.0.2") as other:
        env = cluster_env(
            Settings(redis_url=server.url, data=str(tmp_path / "data"), min_interval_s=INTERVAL_S, interval_jitter=0.2)
        )
        slow_urls = [slow.add_page(f"/p{n}.html", f"<p>{n}</p>") for n in range(4)]
        other_url = other.add_page("/only.html", "<p>other host</p>")
        worker = start_worker(env, "polite", tmp_path / "worker.log", concurrency=1)
        try:
            ids = submit(env, [{"url": url} for url in slow_urls] + [{"url": other_url}])
            records = wait_all(env, ids, {"analyzed"}, 60)
        finally:
            stop_worker(worker)

    arrivals = sorted(seen.at for seen in slow.seen)
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert len(arrivals) == 4
    assert min(gaps) >= INTERVAL_S * 0.98, gaps  # never below the interval, measured by the server
    # With one worker slot, the other host's page was fetched while the slow host waited.
    assert other.seen[0].at < arrivals[-1]
    assert all(record["attempts"] == 1 for record in records.values())  # waiting is not an attempt
