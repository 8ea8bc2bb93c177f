"""A configuration a run cannot work with stops it before it starts: in ``vcrawl crawl``,
``vcrawl submit``, ``tasks.start_job`` and at worker start-up, with one message naming the
variable (here an ``hdfs://`` data root without ``VCRAWL_HDFS_USER``), instead of a job that
waits forever while every fetch batch fails in a worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import tasks
from cli.local_redis import LocalRedis
from cli.progress import report, summary_of
from engine.jobs import start
from tasks import deps
from tests.cluster import REPO
from tests.integration.conftest import AlertSinks
from tests.site import TestSite
from tests.webhdfs_server import WebHdfsTestServer
from vcrawl.errors import ConfigError
from vcrawl.jobs import JobSpec
from vcrawl.settings import Settings

pytestmark = pytest.mark.slow

_NO_USER = "VCRAWL_HDFS_USER must be set for hdfs:// storage"


def _environment(**variables: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")}
    return {**base, "PYTHONPATH": str(REPO), **variables}


def _run(command: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``command`` to its end (a minute at most); return it and the seconds it took."""
    started = time.monotonic()
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - started


@pytest.fixture
def hdfs() -> Iterator[WebHdfsTestServer]:
    """A WebHDFS server, to show that a refused run never sends it a request."""
    with WebHdfsTestServer() as server:
        yield server


def test_crawl_with_hdfs_data_and_no_user_exits_at_once_naming_the_variable(
    site: TestSite, hdfs: WebHdfsTestServer, tmp_path: Path
) -> None:
    page = site.add_page("/", "<p>hello</p>")
    env = _environment(VCRAWL_DATA=f"hdfs://{hdfs.namenode}/crawl")

    done, took_s = _run([sys.executable, "-m", "cli", "crawl", page, "--allow-network", "127.0.0.0/8",
                         "--max-pages", "1", "--log-dir", str(tmp_path / "logs")], env)  # fmt: skip

    assert done.returncode != 0
    assert took_s < 20
    assert _NO_USER in done.stderr and "configuration error" in done.stderr
    assert "Traceback" not in done.stderr
    assert "redis-server" not in done.stderr and "worker" not in done.stderr  # nothing was started
    assert hdfs.requests == [] and site.seen == []


def test_submit_with_hdfs_data_and_no_user_is_refused_before_the_job_exists(
    redis_server: LocalRedis, hdfs: WebHdfsTestServer, tmp_path: Path
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text("id: refused-hdfs\nseeds: [http://127.0.0.1:9/]\n", encoding="utf-8")
    env = _environment(VCRAWL_REDIS_URL=redis_server.url, VCRAWL_DATA=f"hdfs://{hdfs.namenode}/crawl")

    done, took_s = _run([sys.executable, "-m", "cli", "submit", str(job_file)], env)

    assert done.returncode != 0 and took_s < 20
    assert _NO_USER in done.stderr and "Traceback" not in done.stderr
    assert not redis_server_has_job(redis_server, "refused-hdfs")
    assert hdfs.requests == []


def redis_server_has_job(server: LocalRedis, job_id: str) -> bool:
    """True if the job hash exists in ``server``'s Redis."""
    import redis

    from vcrawl import redis_keys

    with redis.Redis.from_url(server.url) as client:
        return bool(client.exists(redis_keys.job(job_id)))


def test_start_job_raises_config_error_and_writes_nothing(
    vcrawl_settings: Settings, redis_server: LocalRedis, hdfs: WebHdfsTestServer
) -> None:
    tasks.configure(replace(vcrawl_settings, data=f"hdfs://{hdfs.namenode}/crawl", hdfs_user=None))
    try:
        with pytest.raises(ConfigError, match="VCRAWL_HDFS_USER"):
            tasks.start_job({"id": "refused-start", "seeds": ["http://127.0.0.1:9/"]})
    finally:
        tasks.configure(vcrawl_settings)
    assert not redis_server_has_job(redis_server, "refused-start")
    assert tasks.job_status("refused-start") is None
    assert hdfs.requests == []


def test_a_worker_with_hdfs_data_and_no_user_exits_naming_the_variable(
    redis_server: LocalRedis, hdfs: WebHdfsTestServer
) -> None:
    env = _environment(VCRAWL_REDIS_URL=redis_server.url, VCRAWL_DATA=f"hdfs://{hdfs.namenode}/crawl")
    command = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "download,analysis", "-P", "threads",
               "-c", "1", "-n", "refused@localhost", "--without-mingle", "--without-gossip"]  # fmt: skip

    done, took_s = _run(command, env)

    assert done.returncode == 1 and took_s < 30
    assert f"vcrawl: configuration error: {_NO_USER}" in done.stderr
    assert hdfs.requests == []


def test_a_configuration_error_inside_a_task_fails_the_job_releases_its_batch_and_alerts(
    worker: object, site: TestSite, vcrawl_settings: Settings, alert_sinks: AlertSinks, hdfs: WebHdfsTestServer
) -> None:
    # A worker whose configuration cannot store (its environment differs from the submitter's, which
    # passed the check): the job is recorded past the submitter's check, and its fetch batch raises
    # when it comes to store the page.
    site.add_page("/", "<html><body><a href='/a.html'>a</a></body></html>")
    tasks.configure(replace(vcrawl_settings, data=f"hdfs://{hdfs.namenode}/crawl", hdfs_user=None))
    try:
        spec = JobSpec.from_dict({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0}})
        job_id = start(spec, deps.frontier(), deps.runtimes(), deps.fetchers())
        deadline = time.monotonic() + 30
        while (status := tasks.job_status(job_id))["state"] == "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        # fail_job hands the batch back just after the state changes (engine.jobs.fail_job says why):
        # a read between the two sees it still in flight.
        while status["state"] == "failed" and status["in_flight_batches"] and time.monotonic() < deadline:
            time.sleep(0.05)
            status = tasks.job_status(job_id)
    finally:
        tasks.configure(vcrawl_settings)

    assert status["state"] == "failed" and _NO_USER in status["error"], status
    # The seed and its origin's sitemap discovery went back to the queue.
    assert status["in_flight_batches"] == 0 and status["queued"] == 2, status
    assert not hdfs.requests  # the store was never reached: nothing half-written
    subject = f"job {job_id} failed: configuration error"
    deadline = time.monotonic() + 5
    while not [hook for hook in alert_sinks.webhooks if hook["subject"] == subject] and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a second alert would have arrived by now
    hooks = [hook for hook in alert_sinks.webhooks if hook["subject"] == subject]
    assert len(hooks) == 1 and _NO_USER in hooks[0]["details"]["error"]


def test_the_summary_of_a_failed_job_prints_its_error(capsys: pytest.CaptureFixture[str]) -> None:
    status = {"job": "j1", "state": "failed", "seeds": ["http://a.test/"], "created_at": 1.0, "finished_at": 2.0,
              "elapsed_s": 1.0, "error": _NO_USER}  # fmt: skip
    report(summary_of(status, 1.0, "/data"), as_json=True)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("job j1 failed:") and f"error: {_NO_USER}" in out
    assert json.loads(out[-1])["error"] == _NO_USER
