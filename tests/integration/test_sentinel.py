"""vcrawl's clients through Sentinel: a worker process, `vcrawl status` and the job API, each given
only the Sentinels' addresses and the master's name (tests/sentinel_cluster.py; no failover here,
tests/faults/test_failover.py has those)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.cluster import REPO, cluster_env, start_job, stop_worker
from tests.sentinel_cluster import SentinelCluster, start_sentinel_worker
from tests.site import TestSite, link_page
from vcrawl.settings import Settings

pytestmark = [pytest.mark.redis_ha, pytest.mark.slow]

TOKEN = "sentinel-test-token-0123"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A primary, a replica and three Sentinels, and the environment that points vcrawl at them."""
    with SentinelCluster(tmp_path / "ha") as cluster:
        settings = Settings(redis_url=cluster.url, redis_sentinel_master=cluster.master_name, data=str(tmp_path / "d"))
        yield cluster_env(settings)


def vcrawl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def status_by_cli(env: dict[str, str], job_id: str) -> dict[str, Any]:
    done = vcrawl(env, "status", job_id, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_job_runs_and_the_cli_and_the_api_answer_through_sentinel(tmp_path: Path, env: dict[str, str]) -> None:
    assert env["VCRAWL_REDIS_URL"].startswith("sentinel://") and env["VCRAWL_REDIS_SENTINEL_MASTER"]
    with TestSite() as site:
        site.add_page("/", link_page("/a", "/b"))
        site.add_page("/a", link_page("/b"))
        site.add_page("/b", link_page())
        worker = start_sentinel_worker(env, "sentinel-worker", tmp_path / "worker.log")
        try:
            job_id = start_job(env, {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0}})
            deadline = time.monotonic() + 30
            while (status := status_by_cli(env, job_id))["state"] == "running" and time.monotonic() < deadline:
                time.sleep(0.5)
            assert status["state"] == "completed" and status["pages_stored"] == 3, status

            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            with open(tmp_path / "api.log", "ab") as log:
                api = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--port", str(port)],
                                       env={**env, "VCRAWL_API_TOKEN": TOKEN}, cwd=REPO, stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
            try:
                answer = _get_when_up(f"http://127.0.0.1:{port}/api/jobs/{job_id}", tmp_path / "api.log")
                assert answer["state"] == "completed" and answer["pages_stored"] == 3, answer
            finally:
                api.terminate()
                api.wait(10)
        finally:
            stop_worker(worker)


def _get_when_up(url: str, log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    with requests.Session() as http:
        http.trust_env = False  # loopback only
        while True:
            try:
                answer = http.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
                assert answer.status_code == 200, answer.text
                return answer.json()
            except requests.ConnectionError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the job API did not answer in 20 s:\n{log.read_text()[-2000:]}") from None
                time.sleep(0.2)
