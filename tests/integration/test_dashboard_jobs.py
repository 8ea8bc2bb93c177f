"""The dashboard's job forms in real headless Chromium, and the API's refusal of cross-site requests.

A job started from the form, its field errors shown at the input, a running job's live settings
changed and read back, and a cross-site form POST refused (also without a token, --insecure-local).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

import tasks
from tests.integration import test_dashboard as dashboard
from tests.integration.conftest import api_server, wait_for_batches_released
from tests.site import NOT_PAGES, TestSite
from vcrawl.settings import Settings

pytestmark = pytest.mark.usefixtures("worker")

# The dashboard tests' fixtures: a token, the API and dashboard on a free port, a fresh Chromium per test.
token, dashboard_url, browser = dashboard.token, dashboard.dashboard_url, dashboard.browser
until, text_of = dashboard.until, dashboard.text_of
PAGES = 40  # at 0.3 s a page the job runs ~12 s: long enough to see it running, then it is cancelled


@pytest.fixture(scope="module")
def open_api_url(vcrawl_settings: Settings) -> Iterator[str]:
    """The API without a token, as ``vcrawl serve --insecure-local`` runs it."""
    with api_server(None) as url:
        yield url


def call(url: str, method: str, body: bytes | None = None, **headers: str) -> tuple[int, Any]:
    """One request with exactly these headers (``Sec_Fetch_Site`` → ``Sec-Fetch-Site``); (status, JSON body)."""
    request = urllib.request.Request(url, data=body, method=method)
    for name, value in headers.items():
        request.add_header(name.replace("_", "-"), value)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def leaf_site(site: TestSite, pages: int) -> None:
    site.add_page("/", "<html><body>" + "".join(f'<a href="/p{n}">{n}</a>' for n in range(pages)) + "</body></html>")
    for n in range(pages):
        site.add_page(f"/p{n}", "<html><body>leaf</body></html>")


def fill(driver: WebDriver, element_id: str, text: str) -> None:
    element = driver.find_element(By.ID, element_id)
    element.clear()
    if text:
        element.send_keys(text)


def error_at(driver: WebDriver, form: str, field: str) -> str:
    """The error shown at ``field``'s input (``yaml``: under the YAML box) of ``form``."""
    return text_of(driver, f'#{form} .field-error[data-for="{field}"]')


def open_new_job_form(driver: WebDriver, url: str, token: str) -> None:
    driver.get(f"{url}/?token={token}")
    until(driver, lambda d: d.find_element(By.ID, "app").is_displayed(), "the dashboard")
    until(driver, open_details("new-job-details"), "the job form opens")
    until(driver, lambda d: d.find_element(By.ID, "nj-seeds").is_displayed(), "the job form shown")


def open_details(element_id: str) -> Callable[[WebDriver], bool]:
    """A wait condition that clicks the ``<details>``'s summary until it is open.

    One click can miss: the dashboard shows before its first refresh fills the jobs table above the form,
    and rows drawn between Selenium's locating the summary and its click move it. Once in CI the form
    stayed shut for 30 s after a single click.
    """

    def opened(driver: WebDriver) -> bool:
        details = driver.find_element(By.ID, element_id)
        if details.get_attribute("open") is not None:
            return True
        details.find_element(By.TAG_NAME, "summary").click()
        return False

    return opened


def submit_new_job(driver: WebDriver) -> str:
    """Click Start and wait for the API's answer; return the message."""
    driver.execute_script('document.getElementById("new-job-msg").textContent = ""')
    driver.find_element(By.ID, "btn-start-job").click()
    return until(driver, lambda d: (m := text_of(d, "#new-job-msg")) and "…" not in m and m, "the form's answer")


@pytest.mark.browser
def test_a_job_started_from_the_form_is_listed_and_runs(
    dashboard_url: str, token: str, browser: WebDriver, site: TestSite
) -> None:
    leaf_site(site, PAGES)
    open_new_job_form(browser, dashboard_url, token)
    fill(browser, "nj-seeds", site.url("/"))
    fill(browser, "nj-hosts", "127.0.0.1")
    fill(browser, "nj-deny", r"/p3\d$")  # /p30../p39 are out of scope
    fill(browser, "nj-interval", "0.3")
    fill(browser, "nj-max-pages", "500")
    fill(browser, "nj-yaml", "rules:\n  - pattern: '/p'\n    page_type: static\npolitenes_note_ignored: null\n")
    # An unknown key in the YAML box is refused like a job file's, and named under the box.
    assert "not started" in submit_new_job(browser)
    assert "politenes_note_ignored" in error_at(browser, "new-job", "yaml")
    fill(browser, "nj-yaml", "rules:\n  - pattern: '/p'\n    page_type: static\n")
    job = ""
    try:
        assert "started" in submit_new_job(browser)
        job = browser.find_element(By.ID, "new-job").get_attribute("data-started") or ""
        assert error_at(browser, "new-job", "yaml") == ""
        until(browser, lambda d: text_of(d, f'#jobs-body tr[data-job="{job}"]'), "the new job listed")
        until(browser, lambda d: text_of(d, "#job-id") == job, "the new job selected")
        assert text_of(browser, f'#jobs-body tr[data-job="{job}"] td.state') == "running"
        until(browser, lambda d: tasks.job_status(job)["pages_fetched"] >= 2, "the job fetches pages")
        spec = tasks.job_spec(job)
        assert spec is not None and spec.seeds == (site.url("/"),) and spec.max_pages == 500
        assert spec.scope.hosts == ("127.0.0.1",) and spec.scope.deny == (r"/p3\d$",)
        assert spec.politeness.min_interval_s == 0.3 and [r.pattern for r in spec.rules] == ["/p"]
    finally:
        dashboard.ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(dashboard.ARTIFACTS / "dashboard-new-job.png"))
        if job:
            tasks.cancel_job(job)


@pytest.mark.browser
def test_a_bad_field_is_shown_at_its_input_and_no_job_starts(
    dashboard_url: str, token: str, browser: WebDriver
) -> None:
    before = tasks.list_jobs(1000)
    open_new_job_form(browser, dashboard_url, token)
    fill(browser, "nj-seeds", "http://127.0.0.1:9/")

    fill(browser, "nj-interval", "-1")  # a negative delay
    assert "not started" in submit_new_job(browser)
    shown = error_at(browser, "new-job", "politeness.min_interval_s")
    assert shown.startswith("politeness.min_interval_s: must be between 0 and 3600"), shown
    label = browser.find_element(By.CSS_SELECTOR, '#new-job label[data-field="politeness.min_interval_s"]')
    assert "invalid" in (label.get_attribute("class") or "")

    fill(browser, "nj-interval", "")
    fill(browser, "nj-deny", "/fine/\n/bad[regex")  # the second deny regex does not compile
    submit_new_job(browser)
    assert error_at(browser, "new-job", "politeness.min_interval_s") == ""  # errors of the last try only
    assert error_at(browser, "new-job", "scope.deny").startswith("scope.deny[1]: invalid regex '/bad[regex'")

    fill(browser, "nj-deny", "")
    fill(browser, "nj-yaml", "rules:\n  - pattern: '/ok'\n  - pattern: '(['\n")  # under the YAML box
    submit_new_job(browser)
    assert error_at(browser, "new-job", "yaml").startswith("rules[1].pattern: invalid regex")

    fill(browser, "nj-yaml", "max_pages: 5\n")
    fill(browser, "nj-max-pages", "10")  # the same key in a field and in the YAML box
    fill(browser, "nj-interval", "-1")
    submit_new_job(browser)
    assert error_at(browser, "new-job", "max_pages").startswith("max_pages: given twice")
    dashboard.ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(dashboard.ARTIFACTS / "dashboard-job-errors.png"))
    assert tasks.list_jobs(1000) == before


@pytest.mark.browser
def test_a_running_jobs_live_settings_are_changed_from_the_page(
    dashboard_url: str, token: str, browser: WebDriver, site: TestSite
) -> None:
    leaf_site(site, PAGES)
    job = tasks.start_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.5, "jitter": 0}})
    try:
        browser.get(f"{dashboard_url}/?token={token}")
        until(browser, lambda d: text_of(d, "#job-id") == job, "the running job is selected")
        until(browser, lambda d: d.find_element(By.ID, "live-interval").get_attribute("value") == "0.5",
              "the live form shows the job's interval")  # fmt: skip
        assert browser.find_element(By.ID, "live").get_attribute("data-rev") == "0"

        fill(browser, "live-per-host", "0")
        browser.find_element(By.ID, "btn-live-apply").click()
        until(browser, lambda d: error_at(d, "live", "politeness.per_host"), "the bad value's error at its input")
        assert error_at(browser, "live", "politeness.per_host").startswith("politeness.per_host: must be between 1")
        assert tasks.job_spec(job).politeness.per_host == 1  # nothing was changed

        fill(browser, "live-per-host", "2")
        fill(browser, "live-interval", "0.2")
        fill(browser, "live-user-agents", "dash-bot/1.0")
        browser.find_element(By.ID, "btn-live-apply").click()
        until(browser, lambda d: "applied: revision 1" in text_of(d, "#live-msg"), "the change applied")
        assert error_at(browser, "live", "politeness.per_host") == ""

        status, config = call(f"{dashboard_url}/api/jobs/{job}/config", "GET", Authorization=f"Bearer {token}")
        assert status == 200 and config["spec_rev"] == 1 and config["state"] == "running"
        assert config["politeness"]["min_interval_s"] == 0.2 and config["politeness"]["per_host"] == 2
        assert config["politeness"]["jitter"] == 0 and config["user_agents"] == ["dash-bot/1.0"]
        # The workers use it: the new User-Agent reaches the site within their 2 s re-read.
        until(browser, lambda d: any(s.headers.get("User-Agent") == "dash-bot/1.0" for s in list(site.seen)),
              "a request with the new User-Agent")  # fmt: skip
    finally:
        dashboard.ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(dashboard.ARTIFACTS / "dashboard-live.png"))
        tasks.cancel_job(job)


def test_pause_and_resume_clicked_on_the_page_stop_the_fetches_then_finish_the_job(
    dashboard_url: str, token: str, browser: WebDriver, site: TestSite
) -> None:
    pages = 30  # at 0.1 s a page: ~3 s of fetching, paused in the middle
    leaf_site(site, pages)
    job = tasks.start_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.1, "jitter": 0}})
    fetched = lambda: [seen.path for seen in site.seen if seen.path not in NOT_PAGES]  # noqa: E731
    try:
        browser.get(f"{dashboard_url}/?token={token}")
        until(browser, lambda d: text_of(d, "#job-id") == job, "the newest job is selected")
        until(browser, lambda _: len(fetched()) >= 4, "a few pages fetched")

        pause = browser.find_element(By.ID, "btn-pause")
        until(browser, lambda d: pause.is_enabled(), "Pause enabled while running")
        pause.click()
        until(browser, lambda d: text_of(d, "#job-state") == "paused", "the page says paused")
        assert tasks.job_status(job)["state"] == "paused"
        wait_for_batches_released(job)  # the fetches in flight at the click end and are counted
        at_pause = len(fetched())
        assert at_pause < pages + 1, "paused before the end"
        resume = browser.find_element(By.ID, "btn-resume")
        assert resume.is_enabled() and not pause.is_enabled()
        time.sleep(1.5)  # 15 pauses of the job's pace: nothing may be fetched meanwhile
        assert len(fetched()) == at_pause, "fetched while paused"

        resume.click()
        until(
            browser,
            lambda d: text_of(d, "#job-state") == "completed" and tasks.job_status(job)["state"] == "completed",
            "the page and the API say completed",
        )
        assert sorted(fetched()) == sorted(["/", *(f"/p{n}" for n in range(pages))])  # every page, once
        assert tasks.job_status(job)["pages_stored"] == pages + 1
    finally:
        tasks.cancel_job(job)


def test_a_cross_site_request_cannot_change_jobs(dashboard_url: str, token: str, open_api_url: str) -> None:
    bearer = f"Bearer {token}"
    bad = json.dumps({"seeds": ["ftp://x.test/"]}).encode()  # invalid: a 422 shows the request got through
    jobs = dashboard_url + "/api/jobs"
    own = dashboard_url  # what a browser sends as Origin from the dashboard itself
    assert call(jobs, "POST", bad, Authorization=bearer, Origin=own, Sec_Fetch_Site="same-origin")[0] == 422
    assert call(jobs, "POST", bad, Authorization=bearer)[0] == 422  # curl: neither header
    assert call(jobs, "POST", bad, Origin=own)[0] == 401  # same origin, no token
    for headers in (
        {"Origin": "http://evil.test"},
        {"Origin": "null"},  # a sandboxed frame or a file
        {"Origin": own.replace("127.0.0.1", "localhost")},  # another origin, same machine
        {"Sec_Fetch_Site": "cross-site"},
        {"Sec_Fetch_Site": "same-site"},  # another port of 127.0.0.1 is the same site
    ):
        status, body = call(jobs, "POST", bad, Authorization=bearer, **headers)
        assert status == 403 and "may not change jobs" in body["error"], (headers, body)
    status, _ = call(jobs + "/any/config", "PATCH", b"{}", Authorization=bearer, Origin="http://evil.test")
    assert status == 403
    assert call(jobs, "GET", Authorization=bearer, Origin="http://evil.test")[0] == 200  # reading changes nothing

    # Without a token: the same refusals, and only loopback names (a DNS-rebound name is refused).
    jobs = open_api_url + "/api/jobs"
    yaml_job = b"seeds: [http://127.0.0.1:9/]\nmax_pages: 0\n"
    status, body = call(jobs, "POST", yaml_job, Content_Type="application/yaml", Origin=open_api_url)
    assert status == 422 and body["field"] == "max_pages"
    for headers in ({"Origin": "http://evil.test"}, {"Sec_Fetch_Site": "same-site"}):
        assert call(jobs, "POST", yaml_job, Content_Type="application/yaml", **headers)[0] == 403
    port = open_api_url.rsplit(":", 1)[1]
    assert call(jobs, "GET")[0] == 200
    status, body = call(jobs, "GET", Host=f"rebound.evil.test:{port}")
    assert status == 403 and "loopback" in body["error"]
    assert call(jobs, "GET", Host=f"localhost:{port}")[0] == 200


@pytest.mark.browser
def test_a_form_on_another_site_cannot_start_a_job_without_a_token(
    open_api_url: str, browser: WebDriver, site: TestSite, caplog: pytest.LogCaptureFixture
) -> None:
    # The classic CSRF: a page elsewhere posts a form whose text/plain body happens to be a job's JSON.
    probe = "http://127.0.0.1:9/csrf-probe?x=y"
    name, _, value = json.dumps({"max_pages": 1, "seeds": [probe]}).partition("=")
    page = (
        f'<html><body><form id="f" method="post" enctype="text/plain" action="{open_api_url}/api/jobs">'
        f"<input type=hidden name='{name}' value='{value}'></form>"
        '<script>document.getElementById("f").submit()</script></body></html>'
    )
    site.add_page("/attack", page)
    before = set(tasks.list_jobs(1000))
    with caplog.at_level(logging.WARNING, logger="api.server"):
        browser.get(site.url("/attack"))
        until(browser, lambda d: d.current_url.startswith(open_api_url), "the form posted to the API")
        until(browser, lambda d: "may not change jobs" in d.page_source, "the API's refusal shown")
    refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused POST /api/jobs")]
    assert refused and ("same-site" in refused[0] or "Origin" in refused[0]), refused
    new = set(tasks.list_jobs(1000)) - before
    assert not any(probe in (tasks.job_status(job) or {}).get("seeds", []) for job in new)


@pytest.mark.browser
def test_the_dashboard_cannot_be_framed_by_another_page(open_api_url: str, browser: WebDriver, site: TestSite) -> None:
    # Clickjacking: a page elsewhere shows the dashboard (no token needed with --insecure-local) in a
    # transparent frame over a button of its own, so a click lands on Cancel. The browser must not
    # render the dashboard inside another page's frame at all.
    site.add_page("/own", "<html><body><p id='own'>a page of the framing site</p></body></html>")
    own = f"<iframe id='own' src='{site.url('/own')}'></iframe>"
    site.add_page("/frames", f"<html><body><iframe id='dashboard' src='{open_api_url}/'></iframe>{own}</body></html>")
    browser.get(site.url("/frames"))
    browser.switch_to.frame("own")  # the control: a frame this page may show does render
    assert until(browser, lambda d: d.find_elements(By.ID, "own"), "the framing site's own frame")
    browser.switch_to.default_content()
    browser.switch_to.frame("dashboard")
    assert browser.find_elements(By.ID, "btn-cancel") == [] and browser.find_elements(By.ID, "new-job") == []
    browser.switch_to.default_content()
    browser.get(open_api_url + "/")  # the same page on its own renders, its script running under its CSP
    until(browser, lambda d: d.find_element(By.ID, "login").is_displayed(), "the dashboard's script showed its login")
    assert browser.find_element(By.TAG_NAME, "header").value_of_css_property("display") == "flex"  # its styles
