"""`vcrawl resume` on the embedded default refuses clearly: no saved state, unknown job, data root in use.

The full Ctrl-C / SIGTERM and resume runs are in tests/faults/test_interrupt_resume.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import redis

from cli.local_redis import LocalRedis
from cli.saved_state import HOME_NAME, RedisHome
from tests.cluster import REPO
from vcrawl import redis_keys


def _vcrawl(*args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")}  # the embedded default
    return subprocess.run(
        [sys.executable, "-m", "cli", *args], env={**base, "PYTHONPATH": str(REPO)},
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _saved_state(data: Path, **jobs: str) -> None:
    """Leave a private Redis's saved state in ``data``, as an interrupted run does, with these job states."""
    with LocalRedis(data / HOME_NAME) as server, redis.Redis.from_url(server.url) as client:
        for job_id, state in jobs.items():
            client.hset(redis_keys.job(job_id), mapping={"state": state, "created_at": 1.0})
            client.zadd(redis_keys.JOBS, {job_id: 1.0})


def test_resume_without_saved_state_says_there_is_nothing_to_resume(tmp_path: Path) -> None:
    done = _vcrawl("resume", "job-1", "--data", str(tmp_path / "empty"))

    assert done.returncode == 1
    assert "no saved crawl state in" in done.stderr and str(tmp_path / "empty") in done.stderr
    assert "Traceback" not in done.stderr


def test_resume_of_an_unknown_or_cancelled_job_is_refused(tmp_path: Path) -> None:
    _saved_state(tmp_path / "data", **{"job-old": "cancelled"})

    unknown = _vcrawl("resume", "job-nope", "--data", str(tmp_path / "data"))
    cancelled = _vcrawl("resume", "job-old", "--data", str(tmp_path / "data"))

    assert unknown.returncode == 1, unknown.stderr
    assert "no job 'job-nope' in the saved state of" in unknown.stderr and "(jobs there: job-old)" in unknown.stderr
    assert cancelled.returncode == 1 and "job job-old was cancelled; it cannot be resumed" in cancelled.stderr
    assert "Traceback" not in unknown.stderr + cancelled.stderr
    assert (tmp_path / "data" / HOME_NAME / "appendonlydir").is_dir()  # the saved state is left alone


def test_a_data_root_in_use_by_another_run_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _saved_state(data)
    other = RedisHome(data)
    assert other.try_lock()  # as a running `vcrawl crawl --data DATA` holds it
    try:
        resumed = _vcrawl("resume", "job-1", "--data", str(data))
        crawled = _vcrawl("crawl", "http://127.0.0.1:9/", "--data", str(data))
    finally:
        other.unlock()

    for done in (resumed, crawled):
        assert done.returncode == 1, done.stderr
        assert f"is in use by another vcrawl run (vcrawl pid {os.getpid()})" in done.stderr
        assert "started" not in done.stderr  # refused before any Redis or worker started
