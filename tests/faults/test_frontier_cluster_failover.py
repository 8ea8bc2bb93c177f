"""A shard's primary SIGKILLed mid-job at Redis's default ``cluster-node-timeout`` (15 s), the twin of
tests/integration/test_frontier_cluster.py's test at 3 s: vcrawl's cluster client waits out a
failover for up to ``FAILOVER_RETRY_S`` (60 s), so the default timeout keeps the promise too."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.redis_clients import FAILOVER_RETRY_S
from tests.integration.test_frontier_cluster import cluster_crawl, kill_a_shard_primary_mid_job

pytestmark = [pytest.mark.slow, pytest.mark.faults]

REDIS_DEFAULT_NODE_TIMEOUT_MS = 15_000


def test_a_shard_primary_killed_at_the_default_node_timeout_the_job_completes(tmp_path: Path) -> None:
    with cluster_crawl(tmp_path, node_timeout_ms=REDIS_DEFAULT_NODE_TIMEOUT_MS) as running:
        promotion_s = kill_a_shard_primary_mid_job(running)
    assert REDIS_DEFAULT_NODE_TIMEOUT_MS / 1000 <= promotion_s < FAILOVER_RETRY_S
