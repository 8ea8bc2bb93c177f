"""What a worker on RabbitMQ says it holds (``tasks/broker/amqp_holdings.py``), on a real Redis: the fetch
batches whose leases go back when it is declared down."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import redis

from cli.local_redis import LocalRedis
from cluster.holdings import held_fetch_batches
from engine.fetch_batch import fetch_task_id
from tasks.broker.amqp_holdings import AmqpHoldings
from vcrawl import redis_keys


def test_a_worker_s_fetches_are_what_it_holds_and_name_their_batches(tmp_path: Path) -> None:
    running = [SimpleNamespace(id=fetch_task_id("j1", "7.ab")), SimpleNamespace(id=fetch_task_id("j1", "8.cd+9.ef")),
               SimpleNamespace(id="an-analysis"), SimpleNamespace(id=None)]  # fmt: skip
    with LocalRedis(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        holdings = AmqpHoldings(lambda: client, requests=lambda: running)
        holdings.report("w1@x", 1000)
        AmqpHoldings(lambda: client, requests=list).report("w2@x", 1000)
        held = holdings.held_by("w1@x")
        assert held_fetch_batches(held) == {"j1": ["7.ab", "8.cd", "9.ef"]}
        assert holdings.held_by("w2@x") == [] and holdings.held_by("never@x") == []
        assert holdings.restore([message.tag for message in held]) == 0  # RabbitMQ gives messages back itself
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
