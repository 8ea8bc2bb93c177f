"""A failover Sentinel runs while the old primary is still up (``SENTINEL FAILOVER``): with the fence,
no acknowledged write is lost; without it, the old primary takes writes for ~10 s and they are wiped.

Real processes (tests/sentinel_cluster.py: a primary, a replica, three Sentinels); the writer is
vcrawl's own client (tasks.redis_clients.make_redis_client), which follows the primary through the
Sentinels and retries through a failover.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from tasks.redis_clients import make_fence, make_redis_client
from tests.sentinel_cluster import SentinelCluster
from vcrawl.settings import Settings

pytestmark = [pytest.mark.redis_ha, pytest.mark.slow]

SENTINEL_RECONFIGURES_S = 8.0  # Sentinel turns a primary that should be a replica after ~8-10 s
WRITES_LIMIT = 200_000


class Writer:
    """RPUSHes 0, 1, 2, ... through vcrawl's client and keeps the numbers Redis acknowledged."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.acked: list[int] = []
        self.errors: list[str] = []
        self.longest_wait_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fence-test-writer", daemon=True)

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set() and number < WRITES_LIMIT:
            asked = time.monotonic()
            try:
                self.client.rpush("fence-test", number)
            except redis.RedisError as error:  # retries ran out: counted, the number is tried again
                self.errors.append(f"{type(error).__name__}: {error}")
                continue
            finally:
                self.longest_wait_s = max(self.longest_wait_s, time.monotonic() - asked)
            self.acked.append(number)
            number += 1
            time.sleep(0.002)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(90)


@contextmanager
def cluster_and_settings(tmp_path: Path) -> Iterator[tuple[SentinelCluster, Settings]]:
    with SentinelCluster(tmp_path / "ha") as cluster:
        yield cluster, Settings(redis_url=cluster.url, redis_sentinel_master=cluster.master_name, data=str(tmp_path))


def fail_over_under_writes(cluster: SentinelCluster, settings: Settings) -> tuple[Writer, int, list[int]]:
    """SENTINEL FAILOVER while a writer writes; return the writer, the old primary's port, and the
    acknowledged numbers missing on the new primary once things settle."""
    with Writer(make_redis_client(settings)) as writer:
        deadline = time.monotonic() + 10
        while len(writer.acked) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        old = cluster.failover()
        new, _ = cluster.wait_promotion(old, 30)
        at_promotion = len(writer.acked)
        deadline = time.monotonic() + 20
        while len(writer.acked) < at_promotion + 200 and time.monotonic() < deadline:
            time.sleep(0.05)
    with redis.Redis(port=new, decode_responses=True) as client:
        kept = set(map(int, client.lrange("fence-test", 0, -1)))
    return writer, old, [number for number in writer.acked if number not in kept]


def role(port: int) -> str:
    with redis.Redis(port=port, decode_responses=True, socket_timeout=2) as client:
        return str(client.execute_command("ROLE")[0])


def test_with_the_fence_a_manual_failover_loses_no_acknowledged_write(tmp_path: Path) -> None:
    with cluster_and_settings(tmp_path) as (cluster, settings):
        fence = make_fence(settings)
        assert fence is not None
        fence.start()
        try:
            time.sleep(0.5)  # the listeners are subscribed
            started = time.monotonic()
            writer, old, lost = fail_over_under_writes(cluster, settings)
            assert lost == [], f"{len(lost)} acknowledged writes lost, first {lost[:5]}"
            assert writer.errors == [], writer.errors[:3]
            # The old primary was made a replica by the fence, not ~10 s later by Sentinel ...
            kinds = [event.kind for _, event in fence.fenced]
            assert "switched" in kinds and role(old) == "slave", (kinds, role(old))
            # ... paused at the first sign, the failover's start, before the replica was even chosen ...
            assert kinds[0] == "trying", kinds
            assert not fence.failover_running()
            # ... and the writer waited at most a moment (a held write, a reconnect), well under that.
            assert writer.longest_wait_s < SENTINEL_RECONFIGURES_S, writer.longest_wait_s
            assert time.monotonic() - started < 60
        finally:
            fence.stop()


def test_without_the_fence_the_old_primary_takes_writes_that_are_then_wiped(tmp_path: Path) -> None:
    """What the fence is for (and that the test above can fail): the same failover, nobody fencing."""
    with cluster_and_settings(tmp_path) as (cluster, settings):
        _, _, lost = fail_over_under_writes(cluster, settings)
        assert len(lost) > 100, f"only {len(lost)} writes lost without the fence"


def test_a_failover_under_way_is_seen_so_a_late_abort_does_not_unpause(tmp_path: Path) -> None:
    """An abort from a Sentinel that lost the election may come while the winner still promotes: the
    fence lifts the pause only when no Sentinel runs a failover (``failover_in_progress``)."""
    with cluster_and_settings(tmp_path) as (cluster, settings):
        fence = make_fence(settings)
        assert fence is not None and not fence.failover_running()
        old = cluster.failover()
        deadline = time.monotonic() + 5
        seen = False
        while not seen and time.monotonic() < deadline:
            seen = fence.failover_running()
            time.sleep(0.01)
        assert seen, "no Sentinel reported the failover under way"
        cluster.wait_promotion(old, 30)
        deadline = time.monotonic() + 10
        while fence.failover_running() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not fence.failover_running()
