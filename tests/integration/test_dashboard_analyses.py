"""The dashboard's table of a job's analysis runs, in real headless Chromium."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

import tasks
from tests.integration import test_dashboard as dashboard
from tests.integration.conftest import run_job
from tests.site import TestSite

pytestmark = [pytest.mark.usefixtures("worker"), pytest.mark.browser]

token, dashboard_url, browser = dashboard.token, dashboard.dashboard_url, dashboard.browser
until, text_of = dashboard.until, dashboard.text_of


def test_the_dashboard_lists_a_jobs_analysis_runs(
    dashboard_url: str, token: str, browser: WebDriver, site: TestSite
) -> None:
    site.add_page("/", '<html><body><a href="/a">a</a><a href="/gone">gone</a></body></html>')
    site.add_page("/a", "<html><body>a</body></html>")
    status = run_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0, "jitter": 0}})
    location = tasks.analyze_job(status["job"], "site-report", chunk=1, timeout_s=60)
    browser.get(f"{dashboard_url}/?token={token}")
    selector = f'#jobs-body tr[data-job="{status["job"]}"]'
    row = until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, selector), "row")
    row[0].click()

    runs = until(browser, lambda d: d.execute_script(
        """return [...document.querySelectorAll("#analyses tbody tr")].map((tr) => ({
             run: tr.dataset.run, state: tr.dataset.state, cells: [...tr.cells].map((td) => td.textContent)}));"""
    ), "the analysis runs table")  # fmt: skip

    assert len(runs) == 1 and runs[0]["state"] == "done"
    assert runs[0]["cells"][1] == "site-report" and runs[0]["cells"][3] == "3/3" and runs[0]["cells"][6] == location
    assert browser.find_element(By.ID, "analyses-section").is_displayed()
