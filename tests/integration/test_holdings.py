"""Who holds which broker message, on a real Redis with real kombu deliveries (``tasks/broker/holdings.py``).

A private redis-server per test: no worker sweeps it but the code under test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Connection

from cli.local_redis import LocalRedis
from cluster.holdings import Holder
from cluster.members import Membership, NodeInfo, NodeRegistration
from tasks.broker.holdings import BrokerHoldings
from vcrawl import redis_keys

QUEUE = "holdings-test"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[Celery, redis.Redis, Any]]:
    """A private Redis, an app on it, its client, and a queue two messages were taken from (unacknowledged)."""
    with LocalRedis(tmp_path / "redis") as server:
        app = Celery("holdings-test", broker=server.url)
        client = redis.Redis.from_url(server.url)
        with Connection(server.url) as connection:
            queue = connection.SimpleQueue(QUEUE)
            queue.put({"n": 1})
            queue.put({"n": 2})
            taken = [queue.get(timeout=5), queue.get(timeout=5)]
            yield app, client, SimpleNamespace(queue=queue, taken=taken)
            queue.close()


def membership_at(client: redis.Redis, ahead_s: float, *alive: str) -> Membership:
    """The members ``alive``, seen ``ahead_s`` seconds from now (Redis clock)."""
    seconds, micros = client.time()
    now_ms = int((seconds + ahead_s) * 1000 + micros / 1000)
    nodes = tuple(NodeInfo(NodeRegistration(name, 0, f"q.{name}"), True, now_ms) for name in alive)
    return Membership(now_ms, 30_000, nodes)


def say_holds(client: redis.Redis, name: str, at_ms: int, tags: set[str], pid: int = 0) -> None:
    holder = Holder(name, at_ms, frozenset(tags), pid or os.getpid(), socket.gethostname())
    client.hset(redis_keys.HOLDERS, name, holder.to_json())


def test_the_consumer_s_unacknowledged_deliveries_are_what_it_holds(broker: tuple[Celery, redis.Redis, Any]) -> None:
    app, client, got = broker
    consumer = SimpleNamespace(task_consumer=SimpleNamespace(channel=got.queue.consumer.channel))
    holdings = BrokerHoldings(app, consumer=consumer, client=lambda: client)
    first, second = (message.delivery_tag for message in got.taken)
    assert holdings.held_tags() >= {first, second}
    got.taken[0].ack()
    assert first not in holdings.held_tags() and second in holdings.held_tags()
    holdings.report("a@box", 123)
    assert json.loads(client.hget(redis_keys.HOLDERS, "a@box"))["tags"] == [second]
    assert holdings.held_counts() == {"a@box": 1}


def test_a_message_nobody_holds_goes_back_and_a_held_one_stays(broker: tuple[Celery, redis.Redis, Any]) -> None:
    app, client, got = broker
    orphan, held = (message.delivery_tag for message in got.taken)
    later = membership_at(client, 10, "a@box")  # both were taken more than the grace ago
    say_holds(client, "a@box", later.now_ms - 1000, {held})
    holdings = BrokerHoldings(app, client=lambda: client)
    found = holdings.orphans(later)
    assert [message.tag for message in found] == [orphan] and found[0].queue == QUEUE
    assert holdings.restore([orphan]) == 1
    assert client.llen(QUEUE) == 1
    back = got.queue.get(timeout=5)
    assert back.payload == {"n": 1}  # the orphan is on its queue again
    assert set(client.hkeys("unacked")) == {held.encode(), back.delivery_tag.encode()}


def test_nothing_goes_back_while_a_live_member_has_not_said_what_it_holds(
    broker: tuple[Celery, redis.Redis, Any],
) -> None:
    app, client, _ = broker
    holdings = BrokerHoldings(app, client=lambda: client)
    later = membership_at(client, 10, "a@box", "b@box")
    say_holds(client, "a@box", later.now_ms - 1000, set())
    assert holdings.orphans(later) == []  # b@box may hold them
    client.delete(redis_keys.HOLDINGS_SWEEP_LOCK)
    say_holds(client, "b@box", later.now_ms - 1000, set())
    assert len(holdings.orphans(later)) == 2
    # Only one worker sweeps at a time: the lock is held for a few seconds.
    assert holdings.orphans(later) == []
    # Taken less than the grace ago: left alone.
    client.delete(redis_keys.HOLDINGS_SWEEP_LOCK)
    assert holdings.orphans(membership_at(client, 1, "a@box", "b@box")) == []


def test_a_worker_restarted_under_its_name_puts_back_what_its_dead_process_held(
    broker: tuple[Celery, redis.Redis, Any],
) -> None:
    app, client, got = broker
    dead = subprocess.Popen(["true"])
    dead.wait(10)
    first, second = (message.delivery_tag for message in got.taken)
    say_holds(client, "w@box", 1, {first}, pid=dead.pid)
    say_holds(client, "live@box", 1, {second}, pid=os.getppid())
    holdings = BrokerHoldings(app, client=lambda: client)
    assert holdings.reclaim_own("live@box") == 0  # its process runs: not ours
    assert holdings.reclaim_own("w@box") == 1
    assert got.queue.get(timeout=5).payload == {"n": 1}
    assert client.hget(redis_keys.HOLDERS, "w@box") is None  # forgotten: the new process speaks for itself
