"""Cluster settings changed without restarts: `vcrawl config set` reaches a running worker within seconds;
settings that need a restart are refused with the reason; `vcrawl config list` says where each value comes from."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from api import JobApi
from cli.local_redis import LocalRedis
from cluster.live_settings import POLL_S, LiveSettingsStore
from tests.cluster import REPO, cluster_env, start_worker, stop_worker
from tests.site import Response, TestSite
from vcrawl.settings import Settings

AGENT = "vcrawl-env-agent/1"


def vcrawl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[dict[str, str], TestSite]]:
    with LocalRedis(tmp_path / "redis") as server, TestSite() as site:
        env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data"), user_agents=(AGENT,)))
        worker = start_worker(env, "live", tmp_path / "worker.log", concurrency=2)
        try:
            yield env, site
        finally:
            stop_worker(worker)


def crawl(env: dict[str, str], site: TestSite, path: str) -> dict[str, Any]:
    """One job of one page on the running worker; its final status."""
    job = Path(env["VCRAWL_DATA"]) / f"{uuid.uuid4().hex[:8]}.json"
    job.parent.mkdir(parents=True, exist_ok=True)
    job.write_text(json.dumps({"seeds": [site.url(path)], "politeness": {"min_interval_s": 0, "jitter": 0,
                                                                       "obey_robots": False}}))  # fmt: skip
    done = vcrawl(env, "submit", str(job), "--wait", "--json", "--timeout", "60")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_live_setting_reaches_the_running_worker_and_unset_brings_the_environment_back(cluster: Any) -> None:
    env, site = cluster
    for n in range(3):
        site.add_page(f"/p{n}", "<html><body>page</body></html>")
    site.add_response("/slow", Response(b"<html><body>slow</body></html>", delay_s=2.5))

    assert crawl(env, site, "/p0")["pages_stored"] == 1
    assert site.requests_to("/p0")[0].headers["User-Agent"] == AGENT
    assert crawl(env, site, "/slow")["pages_stored"] == 1  # the shipped 15 s read timeout waits for it

    for name, value in (("VCRAWL_USER_AGENTS", '["live-agent/2"]'), ("read_timeout_s", "1")):
        done = vcrawl(env, "config", "set", name, value)
        assert done.returncode == 0, done.stderr
    time.sleep(POLL_S + 0.5)

    assert crawl(env, site, "/p1")["pages_stored"] == 1
    assert site.requests_to("/p1")[0].headers["User-Agent"] == "live-agent/2"
    timed_out = crawl(env, site, "/slow")
    assert timed_out["pages_stored"] == 0 and "timeout" in json.dumps(timed_out["failed"]), timed_out

    listing = {row["name"]: row for row in json.loads(vcrawl(env, "config", "list", "--json").stdout)}
    assert listing["VCRAWL_USER_AGENTS"]["source"] == "cluster"
    assert listing["VCRAWL_USER_AGENTS"]["value"] == ["live-agent/2"]
    assert listing["VCRAWL_REDIS_URL"]["source"] == "environment" and not listing["VCRAWL_REDIS_URL"]["live"]
    assert listing["VCRAWL_CONNECT_TIMEOUT_S"]["live"] and listing["VCRAWL_SMTP_PASSWORD"]["value"] == "(not set)"

    assert vcrawl(env, "config", "unset", "VCRAWL_USER_AGENTS").returncode == 0
    time.sleep(POLL_S + 0.5)
    assert crawl(env, site, "/p2")["pages_stored"] == 1
    assert site.requests_to("/p2")[0].headers["User-Agent"] == AGENT


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("VCRAWL_REDIS_URL", "redis://127.0.0.1:1/0", "restart"),
        ("VCRAWL_SMTP_PASSWORD", "x", "a secret"),
        ("VCRAWL_TOTAL_TIMEOUT_S", "5", "Celery's configuration"),
        ("VCRAWL_READ_TIMEOUT_S", "soon", "must be a number"),
        ("VCRAWL_NO_SUCH", "1", "no setting"),
    ],
)
def test_what_cannot_change_live_is_refused_with_the_reason(tmp_path: Path, name: str, value: str, says: str) -> None:
    with LocalRedis(tmp_path / "redis") as server:
        env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data")))
        done = vcrawl(env, "config", "set", name, value)
        listing = json.loads(vcrawl(env, "config", "list", "--json").stdout)
    assert done.returncode == 2
    assert says in done.stderr, done.stderr
    assert all(row["source"] != "cluster" for row in listing)


def test_the_api_lists_sets_and_unsets_cluster_settings(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "redis") as server:
        store = LiveSettingsStore(redis.Redis.from_url(server.url), Settings(redis_url=server.url))
        unused = lambda *a: None  # noqa: E731 - the job routes are not called here
        api = JobApi(token="t", start_job=unused, job_status=unused, jobs=unused, cancel=unused, pause=unused,
                     resume=unused, reconfigure=unused, failures=unused, host_stats=unused, stats=unused,
                     queues=unused, cluster_settings=store.listing, set_setting=store.set,
                     unset_setting=store.unset)  # fmt: skip
        auth = {"Authorization": "Bearer t", "Host": "127.0.0.1", "Content-Type": "application/json"}

        def call(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
            status, _, payload = api.handle(method, path, auth, lambda: json.dumps(body or {}).encode())
            return status, json.loads(payload)

        assert call("PUT", "/api/config/VCRAWL_CONNECT_TIMEOUT_S", {"value": "2.5"}) == (
            200, {"name": "VCRAWL_CONNECT_TIMEOUT_S", "value": "2.5"})  # fmt: skip
        status, refused = call("PUT", "/api/config/VCRAWL_DATA", {"value": "/elsewhere"})
        assert status == 422 and "restart" in refused["error"]
        status, refused = call("PUT", "/api/config/VCRAWL_CONNECT_TIMEOUT_S", {"value": 3})
        assert status == 422 and refused["field"] == "value"
        rows = {row["name"]: row for row in call("GET", "/api/config")[1]["settings"]}
        assert rows["VCRAWL_CONNECT_TIMEOUT_S"] == {"name": "VCRAWL_CONNECT_TIMEOUT_S", "value": 2.5,
                                                        "source": "cluster", "live": True}  # fmt: skip
        assert rows["VCRAWL_DATA"]["why_not_live"].startswith("where a process connects or stores")
        assert call("DELETE", "/api/config/connect_timeout_s") == (200, {"name": "connect_timeout_s", "removed": True})
        assert store.values() == {}
