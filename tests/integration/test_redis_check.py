"""A worker on a Redis that can lose data says so loudly at start-up, and still starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from cli.local_redis import LocalRedis
from tests.cluster import cluster_env, start_worker, stop_worker
from vcrawl.settings import Settings

pytestmark = pytest.mark.slow


def test_a_worker_warns_when_redis_can_lose_data(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        client.config_set("appendonly", "no")
        client.config_set("save", "")
        client.config_set("maxmemory", "100mb")
        client.config_set("maxmemory-policy", "allkeys-lru")
        env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data")))
        log = tmp_path / "worker.log"
        worker = start_worker(env, "careless-redis", log)  # it still starts: a warning, not a refusal
        stop_worker(worker)
    text = log.read_text()
    assert "REDIS CAN LOSE DATA: appendonly is no and save is empty" in text
    assert "REDIS CAN LOSE DATA: maxmemory-policy is allkeys-lru" in text


def test_a_worker_on_a_persistent_redis_does_not_warn(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "redis") as server:  # AOF on, noeviction: what the README asks for
        env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data")))
        log = tmp_path / "worker.log"
        stop_worker(start_worker(env, "careful-redis", log))
    assert "REDIS CAN LOSE DATA" not in log.read_text()
