"""The Redis Cluster harness (tests/redis_cluster.py) itself: it forms, fails over and rebalances for real.

Each test has a cluster of its own (3 primaries, 1 replica each, node timeout 3 s) in ``tmp_path``;
the harness stops every node it started, also when a test fails.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster as ClusterClient

from tests.redis_cluster import SLOTS, RedisCluster

pytestmark = [pytest.mark.redis_ha, pytest.mark.slow]

PROMOTION_TIMEOUT_S = 30.0
PRELOADED_KEYS = 3000
WRITER_MAX_OPS = 1_000_000  # a bound on the background loop besides its stop event
WRITER_MAX_S = 120.0


def test_cluster_forms_and_serves_keys_in_every_slot_range(tmp_path: Path) -> None:
    with RedisCluster(tmp_path) as cluster:
        primaries = cluster.primary_ports()
        assert len(primaries) == 3 and len(cluster.ports) == 6
        assert sorted(cluster.replica_of(port) for port in primaries) == sorted(set(cluster.ports) - set(primaries))
        assert cluster.url.startswith("redis-cluster://")
        listed = cluster.url.removeprefix("redis-cluster://").split(",")
        assert sorted(listed) == sorted(f"127.0.0.1:{port}" for port in primaries)
        assert sorted(cluster.slot_owner_counts().values()) == [5461, 5461, 5462]

        with cluster.client() as client:
            keys = [f"harness:{number}" for number in range(300)]
            for key in keys:
                assert client.set(key, key.encode())
            assert [client.get(key) for key in keys] == [key.encode() for key in keys]
            # Keys went to every primary, each answering for its own slots.
            assert len({client.get_node_from_key(key).port for key in keys}) == 3
        assert sorted(cluster.keys_per_primary()) == sorted(primaries)
        assert sum(cluster.keys_per_primary("harness:*").values()) == len(keys)
        assert all(cluster.commandstats_total(port) > 0 and cluster.cpu_seconds(port) > 0 for port in primaries)


def test_killed_primary_is_replaced_by_its_replica_with_replicated_keys(tmp_path: Path) -> None:
    with RedisCluster(tmp_path) as cluster:
        with cluster.client() as client:
            victim = cluster.primary_ports()[0]
            replica = cluster.replica_of(victim)
            keys = [key for key in (f"victim:{n}" for n in range(400)) if client.get_node_from_key(key).port == victim]
            # One connection to the primary: WAIT counts the replicas that acknowledged *this
            # connection's* writes, so the writes and the WAIT must share it.
            with redis.Redis(host="127.0.0.1", port=victim, single_connection_client=True) as direct:
                for key in keys:
                    direct.set(key, key.encode())
                assert direct.execute_command("WAIT", 1, 5000) == 1

            cluster.kill_primary(victim)
            new_primary, seconds = cluster.wait_promotion(victim, timeout_s=PROMOTION_TIMEOUT_S)

            assert new_primary == replica and seconds < PROMOTION_TIMEOUT_S
            assert victim not in cluster.primary_ports() and new_primary in cluster.primary_ports()
            assert cluster.slot_owner_counts()[new_primary] > 0
            assert keys and [client.get(key) for key in keys] == [key.encode() for key in keys]


class _Writer(threading.Thread):
    """Writes and reads back keys through its own cluster client until told to stop.

    ``acked`` holds the value of every SET the cluster acknowledged; a SET that raised may or may
    not have been applied, so its key goes to ``uncertain`` and is left out of the check.
    """

    def __init__(self, client: ClusterClient, preloaded: list[str]) -> None:
        super().__init__(name="cluster-writer", daemon=True)
        self.client = client
        self.preloaded = preloaded
        self.acked: dict[str, bytes] = {}
        self.uncertain: set[str] = set()
        self.errors: list[str] = []
        self.wrong_reads: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + WRITER_MAX_S
        for number in range(WRITER_MAX_OPS):
            if self.stop.is_set() or time.monotonic() > deadline:
                return
            # A new key, and an overwrite of a preloaded one: both land in slots that are moving.
            for key in (f"live:{number}", self.preloaded[number % len(self.preloaded)]):
                value = f"{key}={number}".encode()
                try:
                    self.client.set(key, value)
                    self.acked[key] = value
                    if key not in self.uncertain and (read := self.client.get(key)) != value:
                        self.wrong_reads.append(f"{key}: wrote {value!r}, read {read!r}")
                except redis.RedisError as error:
                    self.uncertain.add(key)
                    self.errors.append(f"{key}: {error!r}")


def test_rebalance_onto_a_new_primary_loses_no_acknowledged_write(tmp_path: Path) -> None:
    with RedisCluster(tmp_path) as cluster:
        preloaded = [f"pre:{number}" for number in range(PRELOADED_KEYS)]
        with cluster.client() as client:
            for key in preloaded:
                client.set(key, b"initial")

        writer = _Writer(cluster.client(), preloaded)
        writer.start()
        try:
            new_primary = cluster.add_primary()
            written_before = len(writer.acked)
            seconds = cluster.rebalance()
            written_during = len(writer.acked) - written_before
        finally:
            writer.stop.set()
            writer.join(30)
            writer.client.close()
        assert not writer.is_alive()

        counts = cluster.slot_owner_counts()
        assert len(counts) == 4 and new_primary in counts, counts
        assert all(slots > 0 for slots in counts.values()) and sum(counts.values()) == SLOTS, counts
        assert cluster.keys_per_primary()[new_primary] > 0
        assert written_during > 100, (written_during, seconds)
        assert writer.wrong_reads == []
        assert writer.errors == []

        with cluster.client() as client:
            checked = [key for key in writer.acked if key not in writer.uncertain]
            found = client.mget_nonatomic(checked)
        lost = [key for key, value in zip(checked, found, strict=True) if value != writer.acked[key]]
        assert lost == [], f"{len(lost)} acknowledged writes lost of {len(checked)}, e.g. {lost[:5]}"
