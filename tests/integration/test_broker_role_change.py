"""A worker whose Redis is made a replica under it (Sentinel demoting an old primary, an operator's
REPLICAOF) reconnects instead of exiting: real redis-server processes and a real `celery worker`.

Redis ends the worker's blocked BRPOP with ``-UNBLOCKED ... (master -> replica?)`` and its writes
with ``READONLY``; kombu raises both as channel errors, and Celery stops the worker for good
("Unrecoverable error") unless ``broker_channel_error_retry`` is on (celeryconfig.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from cli.local_redis import LocalRedis
from tests.cluster import cluster_env, start_worker, stop_worker, submit, wait_all
from tests.site import TestSite, link_page
from vcrawl.settings import Settings

pytestmark = [pytest.mark.redis_ha, pytest.mark.slow]


def test_a_worker_whose_redis_becomes_a_replica_reconnects_and_works_on(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "a") as primary, LocalRedis(tmp_path / "b") as other, TestSite() as site:
        site.add_page("/", link_page())
        env = cluster_env(Settings(redis_url=primary.url, data=str(tmp_path / "data")))
        log = tmp_path / "worker.log"
        worker = start_worker(env, "guarded", log, concurrency=1)
        try:
            time.sleep(1.0)  # the consumer is blocked in BRPOP
            server = redis.Redis.from_url(primary.url)
            server.replicaof("127.0.0.1", other.port)
            time.sleep(3.0)
            assert worker.poll() is None, log.read_text()[-2000:]
            server.replicaof("NO", "ONE")  # the primary again: the worker reconnects and works on
            [task] = submit(env, [{"url": site.url("/")}])
            done = wait_all(env, [task], {"failed", "analyzed"}, timeout_s=60)
            assert done[task]["state"] == "analyzed", done
            text = log.read_text()
            assert "Unrecoverable error" not in text, text[-2000:]
        finally:
            stop_worker(worker)
