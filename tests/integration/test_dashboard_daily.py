"""The dashboard's per-day chart in real headless Chromium, over the session's job API, Redis and worker."""

from __future__ import annotations

import time

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

import tasks
from frontier.statistics import stats_day
from tests.integration import test_dashboard as dashboard
from tests.integration.conftest import run_job
from tests.site import TestSite
from vcrawl import redis_keys

pytestmark = [pytest.mark.usefixtures("worker"), pytest.mark.browser]

# The dashboard tests' fixtures: a token, the API and dashboard on a free port, a fresh Chromium per test.
token, dashboard_url, browser = dashboard.token, dashboard.dashboard_url, dashboard.browser
until, text_of = dashboard.until, dashboard.text_of
EARLIER = 7  # pages of an earlier day, counted as the release script counts them


def daily_total(driver: WebDriver) -> int:
    return int(driver.find_element(By.ID, "daily-chart").get_attribute("data-total") or 0)


def test_the_dashboard_draws_the_days_of_a_job_next_to_its_minutes(
    dashboard_url: str, token: str, browser: WebDriver, site: TestSite
) -> None:
    site.add_page("/", "<html><body>" + "".join(f'<a href="/d{n}">{n}</a>' for n in range(8)) + "</body></html>")
    for n in range(8):
        site.add_page(f"/d{n}", "<html><body>day</body></html>")
    status = run_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0, "jitter": 0}})
    job, fetched = status["job"], status["pages_fetched"]
    assert status["state"] == "completed" and fetched == 9
    earlier = stats_day(time.time() - 3 * 86400)
    client = tasks.deps.frontier_client()
    key = redis_keys.job_day_stats(job, earlier)
    client.hset(key, mapping={"fetched": EARLIER, "stored": EARLIER, "bytes": 700, "failed:timeout": 1})
    client.expire(key, 600)
    try:
        browser.get(f"{dashboard_url}/?token={token}")
        row = until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f'#jobs-body tr[data-job="{job}"]'), "row")
        row[0].click()
        until(browser, lambda d: text_of(d, "#job-id") == job, "the job is selected")
        until(browser, lambda d: daily_total(d) == fetched + EARLIER, "the days' pages on the per-day chart")

        # Read in one script: the dashboard redraws the chart every few seconds, and an element
        # held across a redraw is stale.
        chart = browser.execute_script(
            """const chart = document.getElementById("daily-chart");
            return {points: chart.getAttribute("data-points"), shown: chart.getBoundingClientRect().height > 0,
                    bars: [...chart.querySelectorAll("rect.bar")].map((bar) => ({
                      day: bar.getAttribute("data-day"), fetched: bar.getAttribute("data-fetched"),
                      failed: bar.getAttribute("data-failed"), height: Number(bar.getAttribute("height") || 0),
                      now: bar.classList.contains("now")}))};"""
        )
        bars = chart["bars"]
        by_day = {bar["day"]: bar for bar in bars}
        assert chart["points"] == "14" and len(bars) == 14 and chart["shown"]
        assert list(by_day)[-1] == stats_day(time.time()) and bars[-1]["now"]
        assert by_day[stats_day(time.time())]["fetched"] == str(fetched)
        assert by_day[earlier]["fetched"] == str(EARLIER) and by_day[earlier]["failed"] == "1"
        assert by_day[earlier]["height"] > 0
        assert "14 days" in text_of(browser, "#daily-caption")
        minutes = browser.find_element(By.ID, "chart")
        assert minutes.is_displayed() and int(minutes.get_attribute("data-total") or 0) == fetched
        # Side by side: the per-day chart is next to the per-minute one, not below it.
        assert (
            browser.find_element(By.ID, "daily-section").location["y"]
            == browser.find_element(By.ID, "rate").location["y"]
        )
    finally:
        dashboard.ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(dashboard.ARTIFACTS / "dashboard-daily.png"))
        client.delete(key)
