"""What a worker on RabbitMQ says it holds (``tasks/broker/amqp_holdings.py``), on a real Redis: the fetch
batches whose leases go back when it is declared down."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import redis

import tasks
from cli.local_redis import LocalRedis
from cluster.holdings import held_fetch_batches
from engine.analyze_batch import analysis_task_id
from engine.fetch_batch import fetch_task_id
from engine.jobs import start
from engine.runtime_cache import RuntimeCache
from frontier import Frontier
from frontier.records import BatchRelease
from tasks.broker.amqp_holdings import AmqpHoldings
from vcrawl import redis_keys
from vcrawl.settings import Settings


def test_a_worker_s_fetches_are_what_it_holds_and_name_their_batches(tmp_path: Path) -> None:
    running = [SimpleNamespace(id=fetch_task_id("j1", "7.ab")), SimpleNamespace(id=fetch_task_id("j1", "8.cd+9.ef")),
               SimpleNamespace(id="an-analysis"), SimpleNamespace(id=None)]  # fmt: skip
    with LocalRedis(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        holdings = AmqpHoldings(lambda: client, requests=lambda: running, frontier=lambda: Frontier(client))
        holdings.report("w1@x", 1000)
        AmqpHoldings(lambda: client, requests=list).report("w2@x", 1000)
        held = holdings.held_by("w1@x")
        assert held_fetch_batches(held) == {"j1": ["7.ab", "8.cd", "9.ef"]}
        assert holdings.held_by("w2@x") == [] and holdings.held_by("never@x") == []
        # RabbitMQ gives the messages back itself; no batch of theirs was released, so no analysis is sent
        assert holdings.restore([message.tag for message in held]) == 0
        holdings.forget("w1@x")
        assert holdings.held_by("w1@x") == []


def test_a_bundle_s_refills_are_held_with_it(tmp_path: Path) -> None:
    """A bundle's refills (noted in its ledger, tasks/broker/bundle_ledger.py) go back when its worker is declared
    down, with the batches its task id names, not when RabbitMQ hands its message back (2-3 heartbeats later)."""
    bundle, other = fetch_task_id("j1", "8.cd+9.ef"), fetch_task_id("j2", "3.xy")
    running = [SimpleNamespace(id=bundle), SimpleNamespace(id=other)]
    with LocalRedis(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        client.sadd(redis_keys.bundle_ledger(bundle), "11.gh", "10.ef")
        holdings = AmqpHoldings(lambda: client, requests=lambda: running)
        holdings.report("w1@x", 1000)
        held = holdings.held_by("w1@x")
        assert held_fetch_batches(held) == {"j1": ["8.cd", "9.ef", "10.ef", "11.gh"], "j2": ["3.xy"]}
        assert {message.task_id: message.refills for message in held} == {bundle: ("10.ef", "11.gh"), other: ()}


def test_a_dead_member_s_analyses_are_sent_again_at_once(tmp_path: Path) -> None:
    """What RabbitMQ would hand back only when it notices a partition (60-90 s): the analyses of the batches
    the dead member's bundle released (its own and its refills) and of the analysis it held, sent when it is
    declared down; a batch still leased, or already admitted, sends nothing."""
    with LocalRedis(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        frontier = Frontier(client)
        settings = Settings(redis_url=server.url, data=str(tmp_path / "data"))
        runtimes = RuntimeCache(frontier, settings, tasks.deps.session(), client)
        job = tasks.JobSpec.from_dict({"seeds": [f"http://h{n}.example/" for n in range(4)],
                                       "politeness": {"min_interval_s": 0}})  # fmt: skip
        job_id = start(job, frontier, runtimes, tasks.deps.fetchers())
        a, b, c, d = frontier.queue.pump(job_id, max_batches=8, batch_size=1, per_host=1, interval_ms=0,
                                         lease_ms=600_000, cap=100).batches  # fmt: skip
        for batch in (a, b, c):  # released, their analyses not admitted (never sent, or held)
            handed = json.dumps({"job": job_id, "batch": batch.batch_id, "pages": []})
            frontier.queue.release(job_id, batch, BatchRelease(pause_ms=0, done=0, host_done=1, handed_on=handed))
        bundle = fetch_task_id(job_id, f"{a.batch_id}+{d.batch_id}")
        client.sadd(redis_keys.bundle_ledger(bundle), b.batch_id)  # a refill of the bundle
        sent: list[dict] = []
        holdings = AmqpHoldings(lambda: client, requests=list, send_analysis=sent.append, frontier=lambda: frontier)
        assert holdings.restore([bundle, analysis_task_id(job_id, c.batch_id), "not-ours"]) == 3
        assert sorted(item["batch"] for item in sent) == sorted([a.batch_id, b.batch_id, c.batch_id])
