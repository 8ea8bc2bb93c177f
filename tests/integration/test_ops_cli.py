"""``vcrawl serve``, ``pause``, ``resume`` and ``config`` as subprocesses, on the session's Redis and worker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import tasks
from tests.cluster import REPO, cluster_env
from tests.site import TestSite
from vcrawl.settings import Settings

pytestmark = pytest.mark.usefixtures("worker")


def vcrawl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def get(url: str, token: str | None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_serve_needs_a_token_and_answers_with_it(vcrawl_settings: Settings) -> None:
    env = {k: v for k, v in cluster_env(vcrawl_settings).items() if k != "VCRAWL_API_TOKEN"}
    refused = vcrawl(env, "serve", "--port", "0")
    assert refused.returncode == 2 and "VCRAWL_API_TOKEN" in refused.stderr
    exposed = vcrawl(env, "serve", "--port", "0", "--insecure-local", "--address", "0.0.0.0")
    assert exposed.returncode == 2 and "loopback" in exposed.stderr

    token = "cli-test-token-0123456789"
    command = [sys.executable, "-m", "cli", "serve", "--port", "0"]
    env = {**env, "VCRAWL_API_TOKEN": token}
    process = subprocess.Popen(command, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stderr.readline() if process.stderr else ""
        assert "http://127.0.0.1:" in line, line
        base = line.split("http://", 1)[1].split("/", 1)[0]
        assert get(f"http://{base}/api/jobs", token) == 200
        assert get(f"http://{base}/api/jobs", None) == 401
        assert get(f"http://{base}/openapi.json", None) == 200
    finally:
        process.terminate()
        process.wait(10)


def test_pause_config_and_resume_from_the_command_line(vcrawl_settings: Settings, site: TestSite) -> None:
    env = cluster_env(vcrawl_settings)
    paths = [f"/p{n}" for n in range(20)]
    site.add_page("/", "".join(f'<a href="{p}">x</a>' for p in paths))
    for path in paths:
        site.add_page(path, "<html></html>")
    job = tasks.start_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.3, "jitter": 0}})

    assert vcrawl(env, "pause", job).returncode == 0
    assert tasks.job_status(job)["state"] == "paused"
    assert vcrawl(env, "pause", job).returncode == 1
    changed = vcrawl(env, "config", job, "--interval", "0.02", "--per-host", "2")
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout)["politeness"] == {"min_interval_s": 0.02, "jitter": 0.0, "per_host": 2,
                                                        "obey_robots": True, "robots_token": "vcrawl",
                                                        "retry_after": "auto"}  # fmt: skip
    bad = vcrawl(env, "config", job, "--interval", "-1")
    assert bad.returncode == 2 and "politeness.min_interval_s" in bad.stderr
    assert vcrawl(env, "resume", job).returncode == 0
    deadline = time.monotonic() + 30
    while (status := tasks.job_status(job))["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status["state"] == "completed" and status["pages_stored"] == 21 and status["spec_rev"] == 1
