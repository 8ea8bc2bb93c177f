"""A worker SIGKILLed during a slow download: the task is redelivered to a new worker and completes.

Runs against its own redis-server and `celery worker` subprocesses, so the session's
in-process worker cannot take the task.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from tasks.trail import StatusTrail
from tests.site import Response, TestSite
from vcrawl.local_redis import LocalRedis
from vcrawl.settings import Settings, celery_redis_url

REPO = Path(__file__).resolve().parents[2]
VISIBILITY_TIMEOUT_S = 6.0

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Environment for worker and producer subprocesses on a private redis-server."""
    with LocalRedis(tmp_path / "redis") as server:
        settings = Settings(
            redis_url=server.url,
            data=str(tmp_path / "data"),
            min_interval_s=0.0,
            total_timeout_s=4.0,
            read_timeout_s=3.0,
            max_retry_after_s=1.0,
            fetch_backoff_s=0.05,
            visibility_timeout_s=VISIBILITY_TIMEOUT_S,
        )
        yield {**os.environ, **settings.to_env(), "PYTHONPATH": str(REPO)}


def _start_worker(env: dict[str, str], name: str, log: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "download,analysis", "-P", "threads",
        "-c", "2", "-n", f"{name}@%h", "--without-mingle", "--without-gossip", "-l", "INFO",
    ]  # fmt: skip
    with open(log, "ab") as out:
        return subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def _wait_ready(env: dict[str, str], name: str, timeout_s: float = 30.0) -> None:
    app = Celery(broker=celery_redis_url(env["VCRAWL_REDIS_URL"]))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replies = app.control.ping(timeout=0.5)
        if any(name in node for reply in replies for node in reply):
            return
    raise AssertionError(f"worker {name} did not answer a ping within {timeout_s}s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(10)


def test_sigkilled_worker_task_is_redelivered_and_completes(cluster_env: dict[str, str], tmp_path: Path) -> None:
    with TestSite() as site:
        url = site.add_response("/slow.html", Response(b"<a href='/next'>next</a>", delay_s=2.5))
        first = _start_worker(cluster_env, "first", tmp_path / "first.log")
        second = None
        try:
            _wait_ready(cluster_env, "first")
            submit = subprocess.run(
                [sys.executable, "-c", f"import tasks; print(tasks.crawl.delay({{'url': {url!r}}}).id)"],
                env=cluster_env, cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
            task_id = submit.stdout.strip().splitlines()[-1]
            deadline = time.monotonic() + 20
            while not site.requests_to("/slow.html") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert site.requests_to("/slow.html"), "the first worker never started the download"

            os.kill(first.pid, signal.SIGKILL)  # mid-download: the message is unacked
            first.wait(10)
            second = _start_worker(cluster_env, "second", tmp_path / "second.log")

            trail = StatusTrail(redis.Redis.from_url(cluster_env["VCRAWL_REDIS_URL"], decode_responses=True), 3600)
            deadline = time.monotonic() + VISIBILITY_TIMEOUT_S + 40
            record = trail.get(task_id)
            while (record is None or record["state"] != "analyzed") and time.monotonic() < deadline:
                time.sleep(0.2)
                record = trail.get(task_id)
            assert record is not None and record["state"] == "analyzed", record
            assert record["attempts"] == 2  # the killed attempt and the redelivered one
            assert len(site.requests_to("/slow.html")) == 2
            assert Path(record["save_path"]).exists()
        finally:
            _stop(first)
            if second is not None:
                _stop(second)
