"""`celery worker` subprocesses on a private redis-server, for tests that kill or time workers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from engine.trail import StatusTrail
from tests.conftest import TEST_ALLOWED_NETWORKS
from vcrawl.settings import Settings, celery_redis_url

REPO = Path(__file__).resolve().parents[1]


def cluster_env(settings: Settings) -> dict[str, str]:
    """The environment that gives subprocesses exactly ``settings``.

    Settings that allow no network get the session's loopback networks (tests/conftest.py):
    the test sites are on loopback, which vcrawl refuses by default.
    """
    if not settings.allowed_networks:
        settings = replace(settings, allowed_networks=TEST_ALLOWED_NETWORKS)
    return {**os.environ, **settings.to_env(), "PYTHONPATH": str(REPO)}


def start_worker(
    env: dict[str, str],
    name: str,
    log: Path,
    concurrency: int = 2,
    loglevel: str = "INFO",
    queues: str = "download,download.dynamic,analysis",
) -> subprocess.Popen[bytes]:
    """Start ``celery -A tasks worker`` on ``queues`` (threads pool); wait until it answers a ping."""
    command = [
        sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", queues,
        "-P", "threads", "-c", str(concurrency), "-n", f"{name}@%h", "--without-mingle", "--without-gossip",
        "-l", loglevel,
    ]  # fmt: skip
    with open(log, "ab") as out:
        process = subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(env, name)
    except BaseException:
        stop_worker(process)
        raise
    return process


def stop_worker(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker we started (by PID) and reap it."""
    if process.poll() is None:
        process.kill()
        process.wait(10)


def submit(env: dict[str, str], payloads: list[dict[str, Any]]) -> list[str]:
    """Submit payloads with ``crawl.delay`` from another process (a separate producer); return ids."""
    code = "import json, sys, tasks\nfor p in json.loads(sys.argv[1]): print(tasks.crawl.delay(p).id)"
    import json

    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(payloads)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.split()


def wait_all(env: dict[str, str], ids: list[str], states: set[str], timeout_s: float) -> dict[str, dict[str, Any]]:
    """Poll the trails until every task is in one of ``states``; return them."""
    trail = StatusTrail(redis.Redis.from_url(env["VCRAWL_REDIS_URL"], decode_responses=True), 3600)
    deadline = time.monotonic() + timeout_s
    while True:
        records = trail.get_many(ids)
        if all(r is not None and r["state"] in states for r in records.values()):
            return records  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"not all tasks reached {states} in {timeout_s}s: {records}")
        time.sleep(0.1)


def _wait_ready(env: dict[str, str], name: str, timeout_s: float = 30.0) -> None:
    app = Celery(broker=celery_redis_url(env["VCRAWL_REDIS_URL"]))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replies = app.control.ping(timeout=0.5)
        if any(name in node for reply in replies for node in reply):
            return
    raise AssertionError(f"worker {name} did not answer a ping within {timeout_s}s")
