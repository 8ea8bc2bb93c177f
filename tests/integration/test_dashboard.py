"""The dashboard (``/``) in real headless Chromium, over the real job API, Redis and worker of the session."""

from __future__ import annotations

import os
import secrets
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

import tasks
from cluster.members import NodeRegistry
from cluster.membership import registration_for
from cluster.node_stats import NodeStats
from engine.node_meter import NodeTally
from fetchers.browser import _CHROMIUM_FLAGS
from frontier import Frontier
from tests.integration.conftest import api_server
from tests.site import TestSite
from vcrawl.settings import Settings

pytestmark = [pytest.mark.usefixtures("worker"), pytest.mark.browser]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
WAIT_S = 30.0
T = TypeVar("T")
PAGES = 60  # at 4 pages/s the job runs ~15 s, long enough to watch it and cancel it


@pytest.fixture(scope="module")
def token() -> str:
    return secrets.token_urlsafe(24)


@pytest.fixture(scope="module")
def dashboard_url(vcrawl_settings: Settings, token: str) -> Iterator[str]:
    """The API and dashboard on a free loopback port (``tasks`` is configured by ``vcrawl_settings``)."""
    with api_server(token) as url:
        yield url


@pytest.fixture
def browser(vcrawl_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[WebDriver]:
    """A fresh headless Chromium per test (so sessionStorage starts empty), always quit."""
    missing = [
        p for p in (vcrawl_settings.chromium_path, vcrawl_settings.chromedriver_path) if not os.access(p, os.X_OK)
    ]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"headless Chromium is required in CI; missing: {missing}")
        pytest.skip(f"no browser here ({missing}); `apt-get install chromium chromium-driver`")
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must never download a driver
    options = Options()
    options.binary_location = vcrawl_settings.chromium_path
    for flag in _CHROMIUM_FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(vcrawl_settings.chromedriver_path), options=options)
    try:
        driver.set_page_load_timeout(10)
        driver.set_script_timeout(10)
        driver.set_window_size(1280, 1000)
        yield driver
    finally:
        driver.quit()


def until(driver: WebDriver, condition: Callable[[WebDriver], T], what: str) -> T:
    """Wait (at most WAIT_S) until ``condition(driver)`` is truthy; return its value."""
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition, f"not within {WAIT_S}s: {what}")


def text_of(driver: WebDriver, css: str) -> str:
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0].text if found else ""


def chart_total(driver: WebDriver) -> int:
    return int(driver.find_element(By.ID, "chart").get_attribute("data-total") or 0)


def api_status(url: str, token: str | None) -> int:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_without_a_token_the_page_asks_for_one_and_the_api_refuses(dashboard_url: str, browser: WebDriver) -> None:
    assert api_status(dashboard_url + "/api/jobs", None) == 401
    assert api_status(dashboard_url + "/api/queues", "wrong") == 401

    browser.get(dashboard_url + "/")
    login = browser.find_element(By.ID, "login")
    assert login.is_displayed() and not browser.find_element(By.ID, "app").is_displayed()

    # A wrong token: the API answers 401 and the page asks again.
    browser.find_element(By.ID, "token-input").send_keys("not-the-token")
    browser.find_element(By.ID, "btn-login").click()
    until(browser, lambda d: "401" in text_of(d, "#login-msg"), "the login form says the token was rejected")
    assert login.is_displayed() and not browser.find_element(By.ID, "app").is_displayed()
    assert browser.execute_script("return sessionStorage.getItem('vcrawl-token')") is None


def test_the_dashboard_follows_a_running_job_and_cancels_it(
    dashboard_url: str, token: str, browser: WebDriver, site: TestSite
) -> None:
    paths = [f"/p{n}" for n in range(PAGES)]
    links = ["/missing", *paths]  # a 404 first, so a failure shows early
    site.add_page("/", "<html><body>" + "".join(f'<a href="{p}">{p}</a>' for p in links) + "</body></html>")
    for path in paths:
        site.add_page(path, "<html><body>leaf</body></html>")
    job = tasks.start_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.25, "jitter": 0}})
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        browser.get(f"{dashboard_url}/?token={token}")
        assert "token" not in browser.current_url  # taken from the address bar at once
        assert browser.execute_script("return sessionStorage.getItem('vcrawl-token')") == token

        row = f'#jobs-body tr[data-job="{job}"]'
        until(browser, lambda d: text_of(d, row), "the job's row")
        until(browser, lambda d: text_of(d, "#job-id") == job, "the newest job is selected")
        assert text_of(browser, "#job-state") == "running"

        # The chart is fed by /stats while the job runs: its total grows between two reads.
        first = until(browser, chart_total, "a first fetched page on the chart")
        until(browser, lambda d: chart_total(d) > first, "the chart's total grows")
        chart = browser.find_element(By.ID, "chart")
        points = int(chart.get_attribute("data-points") or 0)
        assert points >= 1 and points == len(chart.find_elements(By.CSS_SELECTOR, "rect.bar"))
        assert chart_total(browser) <= tasks.job_status(job)["pages_fetched"]
        until(browser, lambda d: text_of(d, '#statuses tr[data-status="200"]'), "status 200 counted")
        until(browser, lambda d: "http_404" in text_of(d, "#failures tr.failure"), "the 404 among the failures")
        assert site.url("/missing") in text_of(browser, "#failures tr.failure td.url")
        host = site.base.split("//", 1)[1]
        until(browser, lambda d: text_of(d, f'#hosts tr[data-host="{host}"]'), "the site's host listed")
        for queue in ("download", "download.dynamic", "analysis"):
            depth = text_of(browser, f'#queues tr[data-queue="{queue}"] td.num')
            assert depth.replace(",", "").isdigit(), (queue, depth)

        cancel = browser.find_element(By.ID, "btn-cancel")
        until(browser, lambda d: cancel.is_enabled(), "Cancel enabled while running")
        cancel.click()
        until(
            browser,
            lambda d: text_of(d, "#job-state") == "cancelled" and tasks.job_status(job)["state"] == "cancelled",
            "the page and the API say cancelled",
        )
        until(browser, lambda d: "cancelled" in text_of(d, f"{row} td.state"), "the job's row says cancelled")
        assert "job is cancelled" in text_of(browser, "#action-msg")
        assert not any(browser.find_element(By.ID, b).is_enabled() for b in ("btn-cancel", "btn-pause", "btn-resume"))
    finally:
        browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))
        tasks.cancel_job(job)  # a failed test must not leave the job running for the rest of the session


def test_the_dashboard_lists_the_ring_nodes(dashboard_url: str, token: str, browser: WebDriver) -> None:
    client = redis.Redis.from_url(tasks.settings().redis_url)
    registry = NodeRegistry(Frontier(client).scripts, timeout_s=30)
    alive, gone = registration_for("web-a@box", 150), registration_for("web-b@box", 50)
    registry.beat(gone, leaving=True)  # a node that left: listed, not on the ring
    joined_ms = registry.beat(alive)
    stats = NodeStats(client)  # what web-a's heartbeats would have written for its fetches
    stats.join("web-a@box", joined_ms)
    stats.add("web-a@box", NodeTally(requests=12, successes=10, failures=1, bytes=2_500_000, busy_s=10.0,
                                     hosts=frozenset({"a.example", "b.example"})), joined_ms)  # fmt: skip
    try:
        browser.get(f"{dashboard_url}/?token={token}")
        rows = until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#nodes tbody tr[data-node]") or None,
                     "the ring nodes are listed")  # fmt: skip
        cells = {row.get_attribute("data-node"): [c.text for c in row.find_elements(By.TAG_NAME, "td")] for row in rows}
        assert cells["web-a@box"][:5] == ["web-a@box", "150", "up", "100.0%", "0"]
        # slots (none said: a registration of no worker), requests, OK, failed, hosts visited, bytes, bandwidth
        assert cells["web-a@box"][7:14] == ["\u2013", "12", "10", "1", "2", "2.5 MB", "250 kB/s"]
        assert cells["web-b@box"][:3] == ["web-b@box", "50", "left"]
        # The session's worker is a member too (a plain worker, weight 0): one more, alive.
        assert "2 of 3 alive" in text_of(browser, "#nodes-caption")
        assert cells["pytest@localhost"][:3] == ["pytest@localhost", "0", "up"]
    finally:
        registry.beat(alive, leaving=True)
        for name in ("web-a@box", "web-b@box"):
            registry.forget(name)
        # The session worker's ring view may still hold web-a@box (weight 150) for up to a second and
        # route a later test's host to its queue, which nobody consumes: read the ring afresh.
        tasks.deps.ring_view().invalidate()
