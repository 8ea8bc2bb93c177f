"""A redelivered fetch bundle takes over what its dead run leased for itself (``tasks.broker.bundle_ledger``).

A real Redis and frontier; the dead run is played by leasing batches for an owner and noting them, as a
bundle's refill does, and releasing one of them with a hand-over whose analysis was never sent.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import redis

import tasks
from cli.local_redis import LocalRedis
from engine.jobs import start
from engine.runtime_cache import RuntimeCache
from frontier import Frontier
from frontier.queue import RENEWAL_HOLDS_S
from frontier.records import BatchRelease
from tasks.broker.bundle_ledger import BundleLedger
from vcrawl import redis_keys
from vcrawl.settings import Settings


def test_a_redelivered_bundle_hands_back_the_dead_runs_leases_and_sends_its_unsent_analyses(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        frontier = Frontier(client)
        settings = Settings(redis_url=server.url, data=str(tmp_path / "data"))
        runtimes = RuntimeCache(frontier, settings, tasks.deps.session(), client)
        job = tasks.JobSpec.from_dict({"seeds": [f"http://h{n}.example/" for n in range(4)],
                                       "politeness": {"min_interval_s": 0}})  # fmt: skip
        job_id = start(job, frontier, runtimes, tasks.deps.fetchers())
        leased = frontier.queue.pump(job_id, max_batches=8, batch_size=1, per_host=1, interval_ms=0,
                                     lease_ms=600_000, cap=100, owner="dead-run").batches  # fmt: skip
        assert len(leased) == 4
        dead = BundleLedger(client, frontier, job_id, "vcrawl-fetch:bundle-1", keep_s=660)
        dead.note(batch.batch_id for batch in leased)
        assert 0 < client.pttl(redis_keys.bundle_ledger("vcrawl-fetch:bundle-1")) <= 660_000
        handed = {"job": job_id, "batch": leased[0].batch_id, "pages": []}
        frontier.queue.release(
            job_id, leased[0], BatchRelease(pause_ms=0, done=0, host_done=1, handed_on=json.dumps(handed))
        )
        # ... and the worker is killed: the gathered analysis of leased[0] is never sent.

        sent: list[dict[str, Any]] = []
        again = BundleLedger(client, frontier, job_id, "vcrawl-fetch:bundle-1", keep_s=660)
        assert again.take_over(0, sent.append) == (3, 1)
        assert sent == [handed]
        assert frontier.queue.leased_hosts(job_id) == {}  # nothing waits for the leases to run out
        assert client.exists(redis_keys.bundle_ledger("vcrawl-fetch:bundle-1")) == 0
        assert again.take_over(0, sent.append) == (0, 0)  # taken over once

        time.sleep(RENEWAL_HOLDS_S + 0.1)
        back = frontier.queue.pump(job_id, max_batches=8, batch_size=1, per_host=1, interval_ms=0,
                                   lease_ms=60_000, cap=100)  # fmt: skip
        assert {batch.host for batch in leased[1:]} <= {batch.host for batch in back.batches}  # leased again at once

        # A run that ended closes its note; another message's note is its own.
        other = BundleLedger(client, frontier, job_id, "vcrawl-fetch:bundle-2", keep_s=660)
        other.note(batch.batch_id for batch in back.batches)
        other.close()
        assert other.take_over(0, sent.append) == (0, 0) and frontier.queue.in_flight(job_id) == len(back.batches)


def test_on_redis_s_broker_the_ledger_writes_nothing(tmp_path: Path) -> None:
    """Off (the watchdogs of Redis's broker find refills and unsent analyses): no command per refill."""
    with LocalRedis(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        ledger = BundleLedger(client, Frontier(client), "job", "vcrawl-fetch:bundle-3", keep_s=60, enabled=False)
        ledger.note(["1.ab", "2.cd"])
        assert client.exists(redis_keys.bundle_ledger("vcrawl-fetch:bundle-3")) == 0
        client.sadd(redis_keys.bundle_ledger("vcrawl-fetch:bundle-3"), "1.ab")  # an earlier RabbitMQ run's
        assert ledger.take_over(0, lambda _: None) == (0, 0)
