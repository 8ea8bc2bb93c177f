"""One ``vcrawl serve`` over two real clusters: two redis-servers, each with its own ``celery worker`` process.

Jobs are started, watched and cancelled on each cluster through ``/api/clusters/NAME/...`` and run on that
cluster's worker only; a third cluster that never answers, and then one whose Redis stops, are shown down
with their error while the other goes on; the dashboard in real headless Chromium switches between them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from tests.celery_setup import LocalRedisProcess
from tests.cluster import REPO, cluster_env, identify_clients, start_worker, stop_worker
from tests.integration import test_dashboard as dashboard
from tests.ports import free_port
from tests.site import TestSite, link_page
from tests.waiting import wait_until
from vcrawl import redis_keys
from vcrawl.settings import Settings

pytestmark = pytest.mark.slow

browser, until, text_of = dashboard.browser, dashboard.until, dashboard.text_of
TOKEN = "monitor-test-token-0123456789"
GONE_PASSWORD = "s3cret-gone-pw"  # in the URL of the cluster nobody listens for: never shown, never logged
LEAVES = 6


@dataclass
class Monitor:
    """The two clusters, their workers, the site they crawl and the server over them."""

    url: str
    redis: dict[str, LocalRedisProcess]
    workers: dict[str, subprocess.Popen[bytes]]
    site: TestSite
    log: Path


def call(url: str, method: str = "GET", body: Any = None, timeout_s: float = 15.0) -> tuple[int, Any]:
    """One API request with the token; (status, JSON body)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {TOKEN}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture(scope="module")
def monitor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitor]:
    """Clusters ``east`` (the server's own, its VCRAWL_REDIS_URL) and ``west`` (``--cluster``), each with a
    worker; ``gone`` (VCRAWL_MONITOR_CLUSTERS) a port nobody listens on; ``vcrawl serve`` over the three."""
    root = tmp_path_factory.mktemp("monitor")
    servers: dict[str, LocalRedisProcess] = {}
    workers: dict[str, subprocess.Popen[bytes]] = {}
    serve = None
    with TestSite() as site:
        try:
            for name in ("east", "west"):
                servers[name] = LocalRedisProcess(root / f"redis-{name}").start()
                env = cluster_env(Settings(redis_url=servers[name].url, data=str(root / f"data-{name}")))
                workers[name] = start_worker(env, f"{name}@monitor", root / f"worker-{name}.log", concurrency=4)
            identify_clients(site, {process.pid: name for name, process in workers.items()})
            port, log = free_port(), root / "serve.log"
            gone = f"gone=redis://:{GONE_PASSWORD}@127.0.0.1:{free_port()}/0"
            settings = Settings(redis_url=servers["east"].url, data=str(root / "data-east"), api_token=TOKEN,
                                monitor_clusters=(gone,))  # fmt: skip
            with log.open("wb") as out:
                serve = subprocess.Popen(
                    [sys.executable, "-m", "cli", "serve", "--port", str(port), "--name", "east",
                     "--cluster", f"west={servers['west'].url}"],
                    env=cluster_env(settings), cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            wait_until(lambda: _answers(url) or serve.poll() is not None, 30.0, lambda: log.read_text())
            assert serve.poll() is None, log.read_text()
            yield Monitor(url, servers, workers, site, log)
        finally:
            if serve is not None and serve.poll() is None:
                serve.terminate()
                serve.wait(10)
            for process in workers.values():
                stop_worker(process)
            for server in servers.values():
                server.teardown()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/openapi.json", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _leaf_site(site: TestSite, prefix: str, leaves: int) -> str:
    site.add_page(f"/{prefix}/", link_page(*(f"/{prefix}/p{n}" for n in range(leaves))))
    for n in range(leaves):
        site.add_page(f"/{prefix}/p{n}", "<html><body>leaf</body></html>")
    return site.url(f"/{prefix}/")


def _start(monitor: Monitor, cluster: str, seed: str, interval_s: float = 0.0) -> str:
    status, body = call(f"{monitor.url}/api/clusters/{cluster}/jobs", "POST",
                        {"seeds": [seed], "politeness": {"min_interval_s": interval_s, "jitter": 0}})  # fmt: skip
    assert status == 201, body
    return str(body["id"])


def _state(monitor: Monitor, cluster: str, job: str) -> str:
    status, body = call(f"{monitor.url}/api/clusters/{cluster}/jobs/{job}")
    assert status == 200, body
    return str(body["state"])


def _finished(monitor: Monitor, cluster: str, job: str) -> dict[str, Any]:
    wait_until(lambda: _state(monitor, cluster, job) != "running", 60.0, f"job {job} on {cluster} ends", 0.2)
    return call(f"{monitor.url}/api/clusters/{cluster}/jobs/{job}")[1]


def _jobs_in(server: LocalRedisProcess) -> set[str]:
    with redis.Redis.from_url(server.url, decode_responses=True) as client:
        return set(client.zrange(redis_keys.JOBS, 0, -1))


def _clusters(monitor: Monitor) -> dict[str, dict[str, Any]]:
    status, body = call(f"{monitor.url}/api/clusters")
    assert status == 200, body
    assert GONE_PASSWORD not in json.dumps(body)
    return {entry["name"]: entry for entry in body["clusters"]}


def test_the_monitor_lists_the_clusters_and_runs_a_job_on_each_on_its_own(monitor: Monitor) -> None:
    clusters = _clusters(monitor)
    assert list(clusters) == ["east", "gone", "west"]  # its own, then VCRAWL_MONITOR_CLUSTERS, then --cluster
    assert clusters["east"]["default"] and clusters["east"]["up"] and clusters["west"]["up"]
    assert clusters["east"]["nodes"] == {"alive": 1, "total": 1} == clusters["west"]["nodes"]
    assert not clusters["gone"]["up"] and "Connection refused" in clusters["gone"]["error"]
    assert clusters["gone"]["url"].startswith("redis://:***@127.0.0.1:")
    status, body = call(f"{monitor.url}/api/clusters/gone/jobs")
    assert status == 503 and body["cluster"] == "gone" and "is down" in body["error"], body

    east_job = _start(monitor, "east", _leaf_site(monitor.site, "east", LEAVES))
    west_job = _start(monitor, "west", _leaf_site(monitor.site, "west", LEAVES))
    for cluster, job in (("east", east_job), ("west", west_job)):
        status = _finished(monitor, cluster, job)
        assert status["state"] == "completed" and status["pages_stored"] == LEAVES + 1, status

    # Each job lives in its cluster's Redis only, and its pages were fetched by that cluster's worker only.
    assert east_job in _jobs_in(monitor.redis["east"]) and east_job not in _jobs_in(monitor.redis["west"])
    assert west_job in _jobs_in(monitor.redis["west"]) and west_job not in _jobs_in(monitor.redis["east"])
    fetchers: dict[str, set[str]] = {"east": set(), "west": set()}
    for seen in monitor.site.seen:
        if (prefix := seen.path.split("/")[1]) in fetchers:
            fetchers[prefix].add(seen.client)
    assert fetchers == {"east": {"east"}, "west": {"west"}}

    # The listings: each cluster's own; today's unscoped routes are the default cluster's (east).
    listed = {name: [row["job"] for row in call(f"{monitor.url}/api/clusters/{name}/jobs")[1]["jobs"]]
              for name in ("east", "west")}  # fmt: skip
    assert east_job in listed["east"] and west_job not in listed["east"]
    assert west_job in listed["west"] and east_job not in listed["west"]
    unscoped = [row["job"] for row in call(f"{monitor.url}/api/jobs")[1]["jobs"]]
    assert east_job in unscoped and west_job not in unscoped
    assert call(f"{monitor.url}/api/clusters/west/jobs/{east_job}")[0] == 404
    assert _clusters(monitor)["west"]["jobs"]["states"].get("completed", 0) >= 1


def test_a_job_is_cancelled_on_its_cluster_and_the_other_goes_on(monitor: Monitor) -> None:
    slow = _start(monitor, "west", _leaf_site(monitor.site, "west-slow", 40), interval_s=0.5)
    quick = _start(monitor, "east", _leaf_site(monitor.site, "east-quick", LEAVES))
    wait_until(lambda: call(f"{monitor.url}/api/clusters/west/jobs/{slow}")[1]["pages_fetched"] >= 2, 30.0,
               "the slow job fetches")  # fmt: skip
    status, body = call(f"{monitor.url}/api/clusters/west/jobs/{slow}/cancel", "POST")
    assert status == 200 and body == {"job": slow, "state": "cancelled"}, body
    assert call(f"{monitor.url}/api/clusters/east/jobs/{slow}/cancel", "POST")[0] == 404  # not east's job
    assert _finished(monitor, "east", quick)["state"] == "completed"
    assert _state(monitor, "west", slow) == "cancelled"
    fetched = _finished(monitor, "west", slow)["pages_fetched"]
    assert fetched < 41, "cancelled well before its end"


@pytest.mark.browser
def test_the_dashboard_switches_clusters_and_shows_each_ones_jobs(monitor: Monitor, browser: WebDriver) -> None:
    east_job = _start(monitor, "east", _leaf_site(monitor.site, "east-ui", 2))
    west_job = _start(monitor, "west", _leaf_site(monitor.site, "west-ui", 2))
    browser.get(f"{monitor.url}/?token={TOKEN}")
    until(browser, lambda d: d.find_element(By.ID, "cluster-picker").is_displayed(), "the cluster picker")
    until(browser, lambda d: text_of(d, '#clusters tr[data-cluster="gone"][data-up="0"]'), "gone listed as down")
    assert "is down" not in text_of(browser, "#jobs-body")
    assert GONE_PASSWORD not in browser.page_source

    # The default cluster first: its job, not the other's.
    until(browser, lambda d: d.find_element(By.ID, "jobs").get_attribute("data-cluster") == "east", "east shown")
    until(browser, lambda d: text_of(d, f'#jobs-body tr[data-job="{east_job}"]'), "east's job")
    assert not text_of(browser, f'#jobs-body tr[data-job="{west_job}"]')

    Select(browser.find_element(By.ID, "cluster-select")).select_by_value("west")
    until(browser, lambda d: text_of(d, f'#jobs-body tr[data-job="{west_job}"]'), "west's job after the switch")
    assert not text_of(browser, f'#jobs-body tr[data-job="{east_job}"]')
    until(browser, lambda d: text_of(d, "#job-id") == west_job, "west's newest job shown")

    browser.find_element(By.CSS_SELECTOR, '#clusters tr[data-cluster="gone"]').click()
    until(browser, lambda d: "Cluster gone is down" in text_of(d, "#jobs-body"), "the down cluster says so")
    assert browser.find_element(By.ID, "job").is_displayed() is False

    browser.find_element(By.CSS_SELECTOR, '#clusters tr[data-cluster="east"]').click()
    until(browser, lambda d: text_of(d, f'#jobs-body tr[data-job="{east_job}"]'), "east's job again")
    dashboard.ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(dashboard.ARTIFACTS / "dashboard-clusters.png"))


def test_a_cluster_whose_redis_stops_is_shown_down_and_the_other_still_works(monitor: Monitor) -> None:
    west = monitor.redis["west"]
    west.kill("SIGKILL")
    try:
        started = time.monotonic()
        clusters = wait_until(lambda: (c := _clusters(monitor)) and not c["west"]["up"] and c, 20.0, "west down")
        assert time.monotonic() - started < 10.0
        assert clusters["east"]["up"] and "Connection refused" in clusters["west"]["error"], clusters["west"]
        status, body = call(f"{monitor.url}/api/clusters/west/jobs")
        assert status == 503 and "cluster west is down" in body["error"], body

        job = _start(monitor, "east", _leaf_site(monitor.site, "east-alone", LEAVES))
        assert _finished(monitor, "east", job)["state"] == "completed"
        with urllib.request.urlopen(monitor.url + "/", timeout=5) as page:
            assert page.status == 200
    finally:
        west.start()  # same port, its data
    wait_until(lambda: _clusters(monitor)["west"]["up"], 20.0, "west answers again")
    assert west_job_count(monitor) >= 1
    assert GONE_PASSWORD not in monitor.log.read_text(errors="replace")
    assert "cluster west" in monitor.log.read_text(errors="replace")  # the serve's log says it went down


def west_job_count(monitor: Monitor) -> int:
    return len(call(f"{monitor.url}/api/clusters/west/jobs")[1]["jobs"])
