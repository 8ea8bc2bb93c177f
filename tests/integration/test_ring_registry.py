"""Ring membership and handover against a real redis-server (no workers): beats, timeouts, one
watcher per death, a dead node's batches back to its hosts' new owners, and the listing."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from cluster.members import NodeRegistration, NodeRegistry, RingView
from cluster.membership import NodeWatcher, RingKeeper, node_queue, nodes_listing, registration_for
from engine.jobs import admit_links, build_runtime
from engine.runtime_cache import RuntimeCache
from frontier import Frontier
from telemetry.alerts import Alert
from vcrawl import redis_keys
from vcrawl.jobs import JobSpec
from vcrawl.settings import Settings


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedis]:
    """A redis-server of its own: ring nodes registered here must not steer the session's worker."""
    with LocalRedis(tmp_path_factory.mktemp("ring-redis")) as server:
        yield server


@pytest.fixture
def client(private_redis: LocalRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(private_redis.url, decode_responses=True)
    client.flushall()
    yield client
    client.flushall()


def node(name: str, weight: int = 100) -> NodeRegistration:
    return NodeRegistration(name, weight, node_queue(name), "box", 1, time.time())


def test_a_node_is_alive_while_it_beats_and_out_after_its_timeout(client: redis.Redis) -> None:
    # Beats are dated back on the Redis clock instead of slept for: with a 0.5 s timeout and 0.3 s
    # sleeps, a stall of 0.2 s on a loaded machine took a node that had just beaten off the ring.
    registry = NodeRegistry(Frontier(client).scripts, timeout_s=5)
    registry.beat(node("a@box", 150))
    registry.beat(node("b@box", 80))
    membership = registry.membership()
    assert [(n.name, n.weight, n.alive) for n in membership.nodes] == [("a@box", 150, True), ("b@box", 80, True)]
    assert membership.ring.members == {"a@box": 150, "b@box": 80} and membership.silent() == []
    now_ms = membership.now_ms
    client.zadd(redis_keys.NODE_BEATS, {"a@box": now_ms - 3_000, "b@box": now_ms - 3_000})  # 2 s to go
    assert all(n.alive for n in registry.membership().nodes)
    registry.beat(node("a@box", 150))  # a beats again, b stays silent past its timeout
    client.zadd(redis_keys.NODE_BEATS, {"b@box": now_ms - 6_000})
    membership = registry.membership()
    assert {n.name: n.alive for n in membership.nodes} == {"a@box": True, "b@box": False}
    assert [n.name for n in membership.silent()] == ["b@box"] and membership.ring.members == {"a@box": 150}
    assert membership.queue_of("any.host:80") == "download.node.a@box"


def test_at_the_shipped_node_timeout_a_node_is_out_after_30_s_and_claimed_once(client: redis.Redis) -> None:
    # The twin of the two tests around it at VCRAWL_NODE_TIMEOUT_S's default: the beats are dated
    # back on the Redis clock rather than waited for.
    registry = NodeRegistry(Frontier(client).scripts, timeout_s=Settings().node_timeout_s)
    for name in ("fresh@box", "stale@box"):
        registry.beat(node(name))
    now_ms = registry.membership().now_ms
    client.zadd(redis_keys.NODE_BEATS, {"fresh@box": now_ms - 29_000, "stale@box": now_ms - 31_000})
    membership = registry.membership()
    assert {n.name: n.alive for n in membership.nodes} == {"fresh@box": True, "stale@box": False}
    assert membership.ring.members == {"fresh@box": 100}
    [silent] = membership.silent()
    assert [registry.claim_down(silent) for _ in range(3)] == [True, False, False]


def test_exactly_one_watcher_claims_a_death_and_a_node_that_beats_again_rejoins(client: redis.Redis) -> None:
    # A 5 s timeout and a beat dated back past it: the beat after the claim must count as alive
    # however slow the machine (a 0.2 s timeout failed on a 0.2 s stall).
    registry = NodeRegistry(Frontier(client).scripts, timeout_s=5)
    beat_ms = registry.beat(node("c@box"))
    client.zadd(redis_keys.NODE_BEATS, {"c@box": beat_ms - 6_000})
    [silent] = registry.membership().silent()
    wins: list[bool] = []
    threads = [threading.Thread(target=lambda: wins.append(registry.claim_down(silent))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wins.count(True) == 1
    membership = registry.membership()
    assert membership.silent() == [] and membership.node("c@box").down_at_ms is not None  # type: ignore[union-attr]
    registry.beat(node("c@box"))  # it comes back (a restart under the same name)
    back = registry.membership().node("c@box")
    assert back is not None and back.alive and back.down_at_ms is None


def test_a_node_that_leaves_is_out_at_once(client: redis.Redis) -> None:
    registry = NodeRegistry(Frontier(client).scripts, timeout_s=30)
    registry.beat(node("d@box"))
    registry.beat(node("d@box"), leaving=True)
    [gone] = registry.membership().nodes
    assert not gone.alive and gone.last_beat_ms == 0 and registry.membership().silent() == [gone]


def _job(client: redis.Redis, frontier: Frontier, hosts: list[str]) -> Any:
    job = JobSpec.from_dict({"id": f"ring-{uuid.uuid4().hex[:8]}", "seeds": [f"http://{h}/" for h in hosts],
                             "politeness": {"min_interval_s": 2.0, "per_host": 1}})  # fmt: skip
    assert frontier.jobs.create(job.id, job.to_json(), time.time())
    runtime = build_runtime(job, Settings(), session=None, client=client)
    seeds = [(f"http://{h}/p{i}", 0, 5) for h in hosts for i in range(2)]
    admit_links(runtime, frontier, seeds, done=0, token="seeds", counters=Counter(), seeds=True)
    return runtime


def test_a_dead_nodes_batches_go_back_to_its_hosts_new_owners_and_no_other(client: redis.Redis) -> None:
    frontier = Frontier(client)
    hosts = [f"h{i}.test" for i in range(12)]
    runtime = _job(client, frontier, hosts)
    batches = frontier.queue.pump(runtime.job_id, max_batches=50, batch_size=1, per_host=1, interval_ms=500,
                                  lease_ms=60_000, cap=50).batches  # fmt: skip
    assert {b.host for b in batches} == set(hosts)  # one batch in flight per host
    client.hset(redis_keys.job_delays(runtime.job_id), "h0.test", 3000)  # h0 asked for a Crawl-delay of 3 s
    registry = NodeRegistry(frontier.scripts, timeout_s=30)
    registry.beat(node("a@box"))
    registry.beat(node("b@box"))
    before = registry.membership().ring
    owners = before.owners(hosts)
    assert set(owners.values()) == {"a@box", "b@box"}
    drained: list[str] = []
    alerts: list[tuple[str, Alert]] = []
    cache = RuntimeCache(frontier, Settings(), session=None, client=client)
    watcher = NodeWatcher(frontier, registry, cache, lambda q: drained.append(q) or 3,
                          alert=lambda cause, alert: alerts.append((cause, alert)))  # fmt: skip
    assert watcher.check() == []  # nobody is dead

    registry.beat(node("b@box"), leaving=True)
    handed_over_from_ms = time.time() * 1000  # taken before: a stall after the check cannot shrink the waits
    [report] = watcher.check()
    b_hosts = {h for h, owner in owners.items() if owner == "b@box"}
    assert (report.node, report.batches, report.urls) == ("b@box", len(b_hosts), len(b_hosts))
    assert report.messages_moved == 3
    assert drained == ["download.node.b@box"]
    left = frontier.queue.leased_hosts(runtime.job_id)
    assert set(left.values()) == set(hosts) - b_hosts  # a's batches untouched
    state = frontier.jobs.raw_state(runtime.job_id)
    assert state["handed_over"] == str(len(b_hosts)) and "lease_expired" not in state
    # The URLs come back for the new owner with no attempt counted, each host after its wait (the
    # job's 2 s interval, h0's 3 s Crawl-delay), counted from the handover on the Redis clock.
    nexts = client.hgetall(redis_keys.job_next(runtime.job_id))
    for host in b_hosts:
        wait_ms = 3000 if host == "h0.test" else 2000
        assert float(nexts[host]) >= handed_over_from_ms + wait_ms - 5, host  # 5 ms: clock rounding
    again = frontier.queue.pump(runtime.job_id, max_batches=50, batch_size=1, per_host=1, interval_ms=500,
                                lease_ms=60_000, cap=50)  # fmt: skip
    assert again.batches == ()  # not before their wait (2 s: a loaded machine does not stall that long here)
    [(cause, alert)] = alerts
    assert cause == "node:b@box:down" and "left" in alert.subject and alert.details["batches"] == len(b_hosts)
    assert watcher.check() == []  # handed over once
    # but its queue is drained at every check while it is down: its unacknowledged messages come back
    assert drained == ["download.node.b@box"] * 2


def test_a_dead_nodes_messages_move_to_the_shared_queue_first_in_line(client: redis.Redis) -> None:
    from celeryconfig import queue_lists
    from tasks.broker.queues import move_queue

    shared, own = queue_lists("download"), queue_lists("download.node.x@box")
    client.lpush(shared[0], "waiting")
    client.lpush(own[0], "m1", "m2")  # kombu publishes with LPUSH: m1 is the oldest
    client.lpush(own[2], "low")
    assert move_queue(client, "download.node.x@box", "download") == 3
    assert [client.llen(key) for key in own] == [0, 0, 0, 0]
    assert client.rpop(shared[0]) == "m1" and client.rpop(shared[0]) == "m2"  # taken next, oldest first
    assert client.rpop(shared[0]) == "waiting" and client.lrange(shared[2], 0, -1) == ["low"]


def test_the_listing_shows_each_nodes_hosts_and_the_dead(client: redis.Redis) -> None:
    frontier = Frontier(client)
    hosts = [f"h{i}.test:8080" for i in range(30)]
    _job(client, frontier, hosts)
    registry = NodeRegistry(frontier.scripts, timeout_s=30)
    for name, weight in (("a@box", 150), ("b@box", 80), ("c@box", 200)):
        registry.beat(node(name, weight))
    registry.beat(node("c@box", 200), leaving=True)
    listing = nodes_listing(registry.membership(), frontier)
    rows = {row["name"]: row for row in listing["nodes"]}
    assert [rows[n]["alive"] for n in ("a@box", "b@box", "c@box")] == [True, True, False]
    assert rows["c@box"]["state"] == "left" and rows["c@box"]["hosts"] == []
    owned = rows["a@box"]["hosts"] + rows["b@box"]["hosts"]
    assert sorted(owned) == sorted(hosts) and len(set(owned)) == len(owned)
    assert rows["a@box"]["share"] == round(150 / 230, 4) and listing["hosts"] == 30
    assert registry.forget("c@box") and not registry.forget("a@box")
    assert [n.name for n in registry.membership().nodes] == ["a@box", "b@box"]


def test_the_keeper_beats_and_counts_pages_per_second(client: redis.Redis) -> None:
    frontier = Frontier(client)
    registry = NodeRegistry(frontier.scripts, timeout_s=30)
    cache = RuntimeCache(frontier, Settings(), session=None, client=client)
    watcher = NodeWatcher(frontier, registry, cache, lambda q: 0)
    view = RingView(registry)
    keeper = RingKeeper(registry, watcher, registration_for("k@box", 120), beat_s=0.1, view=view).start()
    try:
        assert view.current().ring.members == {"k@box": 120}  # on the ring before its first batch
        for _ in range(10):
            registry.count_pages("k@box", 5)
            time.sleep(0.1)
        row = nodes_listing(registry.membership(), frontier)["nodes"][0]
        assert row["pages"] == 50 and row["pages_per_s"] > 0 and row["heartbeat_age_s"] < 1
    finally:
        keeper.stop(leave=True)
    assert registry.membership().node("k@box").alive is False  # type: ignore[union-attr]
