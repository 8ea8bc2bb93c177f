"""Admissions and releases wait for a replica (``WAIT``) while the primary has one, and only then:
real redis-server processes, the second made a replica of the first with REPLICAOF."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from cli.local_redis import LocalRedis
from frontier.scripts import ReplicaWait, ScriptLoader
from vcrawl import redis_keys

pytestmark = pytest.mark.redis_ha


def waits(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def write_through(loader: ScriptLoader, marker: str) -> None:
    # Any of the frontier's scripts carries the WAIT; drop_filter on an unknown job changes nothing.
    loader.run_with_wake("drop_filter", [redis_keys.job("no-such-job")], [], wake=False, also=[("SET", marker, "1")])


def test_writes_wait_for_a_connected_replica_and_a_lone_primary_waits_for_nothing(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "primary") as primary, LocalRedis(tmp_path / "replica") as second:
        client, replica = redis.Redis.from_url(primary.url), redis.Redis.from_url(second.url)
        write_through(ScriptLoader(client, ReplicaWait(client, timeout_ms=100)), "alone")
        assert waits(client) == 0  # no replica: no WAIT, no 100 ms lost per write

        replica.replicaof("127.0.0.1", primary.port)
        deadline = time.monotonic() + 20
        while replica.info("replication").get("master_link_status") != "up" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert replica.info("replication").get("master_link_status") == "up"

        loader = ScriptLoader(client, ReplicaWait(client, timeout_ms=1000))
        for n in range(20):
            write_through(loader, f"marker-{n}")
            assert replica.get(f"marker-{n}") == b"1"  # the replica had it when the call returned
        assert waits(client) == 20
        ScriptLoader(client).run_with_wake("drop_filter", [redis_keys.job("x")], [], wake=False)
        assert waits(client) == 20  # a loader without a ReplicaWait never waits
