"""Secrets stay out of logs: a worker run with every kind of secret set, its log searched for them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from cli.local_redis import LocalRedis
from frontier import Frontier
from tests.cluster import REPO, cluster_env, start_worker, stop_worker
from tests.site import TestSite
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = pytest.mark.slow

SECRETS = {
    "redis": "redis-pass-5f1c9a",
    "smtp": "smtp-pass-7b2d4e",
    "api": "api-token-9e8f7a6b5c4d3e2f",
    "flower": "flower-pass-3c4d5e",
    "proxy": "proxy-pass-1a2b3c",
    "api_auth": "api-auth-4d5e6f7a8b",
}


def test_no_secret_reaches_the_worker_log(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "redis") as server, TestSite() as site:
        redis.Redis.from_url(server.url).config_set("requirepass", SECRETS["redis"])
        url = server.url.replace("redis://", f"redis://:{SECRETS['redis']}@")
        settings = Settings(redis_url=url, data=str(tmp_path / "data"), smtp_host="127.0.0.1", smtp_port=9,
                            smtp_user="ops", smtp_password=SECRETS["smtp"], alert_email_to=("ops@example.test",),
                            api_token=SECRETS["api"], api_auth={"ACME": f"Bearer {SECRETS['api_auth']}"})  # fmt: skip
        env = {**cluster_env(settings), "FLOWER_BASIC_AUTH": f"ops:{SECRETS['flower']}"}
        site.add_page("/", '<a href="/a">a</a>')
        site.add_page("/a", "a")
        site.add_page("/v1/items", '{"items": [{"id": 1}]}', Content_Type="application/json")
        api_rule = {"pattern": "/v1/", "page_type": "api", "auth": "ACME", "api": {"records": "items"}}
        api_job = {"seeds": [site.url("/v1/items")], "politeness": {"min_interval_s": 0}, "rules": [api_rule]}
        # A proxy with credentials that refuses connections: its failures are logged and alerted.
        proxy = f"http://user:{SECRETS['proxy']}@127.0.0.1:9/"
        job = {"seeds": [site.url("/")], "proxies": [proxy], "limits": {"retries": 1},
               "politeness": {"min_interval_s": 0}}  # fmt: skip
        log = tmp_path / "worker.log"
        worker = start_worker(env, "secretive", log, loglevel="DEBUG")  # the chattiest level ops may use
        try:
            code = "import json, sys, tasks; print(tasks.start_job(json.loads(sys.argv[1])))"
            started = subprocess.run([sys.executable, "-c", code, json.dumps(job)], env=env, cwd=REPO,
                                     capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
            job_id = started.stdout.split()[-1]
            frontier = Frontier(redis.Redis.from_url(url))
            deadline = time.monotonic() + 40
            while (status := job_status(frontier, job_id))["state"] == "running" and time.monotonic() < deadline:
                time.sleep(0.1)
            failures = frontier.stats.failures(job_id)
            # An api job whose secret the worker read from its VCRAWL_API_AUTH_ACME variable.
            api_started = subprocess.run([sys.executable, "-c", code, json.dumps(api_job)], env=env, cwd=REPO,
                                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
            api_id = api_started.stdout.split()[-1]
            deadline = time.monotonic() + 40
            while (api_status := job_status(frontier, api_id))["state"] == "running" and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            stop_worker(worker)
    assert status["state"] == "completed" and status["failed"] == {"proxy_error": 1}, status
    # What operators read: the worker log (DEBUG), the CLI's output, the job's status and failures.
    assert api_status["state"] == "completed" and api_status["records"] == 1, api_status
    [api_request] = site.requests_to("/v1/items")
    assert api_request.headers["Authorization"] == f"Bearer {SECRETS['api_auth']}"
    text = log.read_text() + started.stdout + started.stderr + json.dumps(status) + json.dumps(failures)
    text += api_started.stdout + api_started.stderr + json.dumps(api_status)
    leaked = [name for name, secret in SECRETS.items() if secret in text]
    assert leaked == [], f"secrets in the worker log: {leaked}"
