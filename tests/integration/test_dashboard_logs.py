"""The dashboard's log panel, in real headless Chromium: the shown job's lines of the cluster log stream."""

from __future__ import annotations

import logging
import socket
import uuid

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

import tasks
from tasks.redis_clients import make_redis_client
from telemetry.log_context import ContextFilter, log_context
from telemetry.log_stream import StreamShipper
from tests.integration import test_dashboard as dashboard
from vcrawl.settings import Settings

pytestmark = [pytest.mark.usefixtures("worker"), pytest.mark.browser]

token, dashboard_url, browser = dashboard.token, dashboard.dashboard_url, dashboard.browser
until = dashboard.until


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_dashboard_shows_the_jobs_log_lines(
    vcrawl_settings: Settings, dashboard_url: str, token: str, browser: WebDriver
) -> None:
    job = f"dash-logs-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{_closed_port()}/x"
    tasks.start_job({"id": job, "seeds": [url], "scope": {"hosts": ["127.0.0.1"]}, "allowed_networks": ["127.0.0.0/8"]})
    # A line shipped as a worker ships it (this test's worker runs in-process, without Celery's log set-up).
    shipper = StreamShipper(lambda: make_redis_client(vcrawl_settings), maxlen=1000, queue_size=100,
                            default_level=logging.WARNING, poll_s=60)  # fmt: skip
    shipper.addFilter(ContextFilter("dash@box"))
    source = logging.getLogger("tests.dashboard.logs")
    source.addHandler(shipper)
    try:
        with log_context(job=job, url=url):
            source.warning("something to see <b>not bold</b>")
        shipper.flush(timeout_s=5)
    finally:
        source.removeHandler(shipper)
        shipper.close()

    browser.get(f"{dashboard_url}/?token={token}")
    selector = f'#jobs-body tr[data-job="{job}"]'
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, selector), "the job's row")[0].click()
    rows = until(browser, lambda d: d.execute_script(
        """return [...document.querySelectorAll("#logs tbody tr[data-level]")].map(
             (tr) => [...tr.cells].map((td) => td.textContent));"""
    ), "the log panel's lines")  # fmt: skip

    assert browser.find_element(By.ID, "logs-section").is_displayed()
    ours = [row for row in rows if row[5] == "something to see <b>not bold</b>"]  # text, never markup
    assert ours and ours[0][1:5] == ["WARNING", "dash@box", "tests.dashboard.logs", url]
