"""The dynamic fetcher in real headless Chromium, against real local pages."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import tasks
from fetchers import BrowserConfig, BrowserFetcher, FetchRequest, StaticFetcher, chromium_processes, make_session
from fetchers.base import FetchLimits
from tests.conftest import LOOPBACK_POLICY
from tests.integration.conftest import TEST_REFERERS, TEST_USER_AGENTS, wait_for_end
from tests.site import Response, TestSite
from tests.waiting import wait_until
from vcrawl.errors import DownloadFailed, FetchFailed
from vcrawl.settings import Settings

pytestmark = pytest.mark.browser

CONFIG = BrowserConfig(page_timeout_s=3.0, lazy_timeout_s=3.0, idle_s=0.2)

LAZY_PAGE = """<!doctype html><html><head><title>Shop</title></head><body>
<div id="content"></div><button onclick="loadMore()">Load more</button>
<script>
window.shop = {{ loadMore: function () {{ return loadMore(); }} }};
function loadMore() {{
  return fetch('{api}').then(function (r) {{
    if (!r.ok) {{ throw new Error('HTTP ' + r.status); }}
    return r.json();
  }}).then(function (d) {{
    document.getElementById('content').innerHTML = d.html;
    return d.marker;
  }});
}}
</script></body></html>"""
API = json.dumps({"html": '<p class="item">dyn-7f3a</p><a href="/more/m1.html">more</a>', "marker": "dyn-7f3a"})


@pytest.fixture(scope="module")
def browser(browser_installed: None) -> Iterator[BrowserFetcher]:
    fetcher = BrowserFetcher(CONFIG, policy=LOOPBACK_POLICY)
    yield fetcher
    fetcher.close()


def lazy_site(site: TestSite, api_response: Response | None = None) -> str:
    site.add_page("/app/d1.html", LAZY_PAGE.format(api="/api/page/1.json"))
    site.add_response(
        "/api/page/1.json", api_response or Response(API.encode(), headers={"Content-Type": "application/json"})
    )
    return site.url("/app/d1.html")


def request(url: str, **kwargs: str) -> FetchRequest:
    return FetchRequest(url=url, user_agent=kwargs.pop("user_agent", "vcrawl-test/1"), **kwargs)


def test_the_browser_gets_what_the_static_fetcher_cannot(site: TestSite, browser: BrowserFetcher) -> None:
    url = lazy_site(site)

    static = StaticFetcher(make_session(), FetchLimits(), policy=LOOPBACK_POLICY).fetch(request(url))
    dynamic = browser.fetch(request(url, js_function="loadMore"))

    assert b'<div id="content"></div>' in static.body and b"dyn-7f3a" not in static.body
    assert dynamic.status == 200 and b"dyn-7f3a" in dynamic.body and b"/more/m1.html" in dynamic.body
    assert dynamic.content_type == "text/html; charset=utf-8"


def test_a_dotted_function_path_works(site: TestSite, browser: BrowserFetcher) -> None:
    result = browser.fetch(request(lazy_site(site), js_function="window.shop.loadMore"))
    assert b"dyn-7f3a" in result.body


def test_the_lazy_request_answering_500_fails_the_download(site: TestSite, browser: BrowserFetcher) -> None:
    url = lazy_site(site, Response(b"oops", 500))
    with pytest.raises(DownloadFailed) as failed:
        browser.fetch(request(url, js_function="loadMore"))
    assert failed.value.reason == "lazy_http_500" and failed.value.http_status == 500


def test_a_missing_function_fails_clearly_and_quickly(site: TestSite, browser: BrowserFetcher) -> None:
    url = site.add_page("/plain.html", "<p>no scripts here</p>")
    browser.start()  # not timed: an earlier test may have replaced the browser, or none ran yet
    started = time.monotonic()
    with pytest.raises(DownloadFailed) as failed:
        browser.fetch(request(url, js_function="loadMore"))
    assert failed.value.reason == "js_function_missing"
    assert time.monotonic() - started < CONFIG.page_timeout_s


def test_a_page_that_never_finishes_loading_times_out_and_the_browser_goes_on(
    site: TestSite, browser: BrowserFetcher
) -> None:
    url = site.add_page("/endless.html", "<p>start</p><script src='/never.js'></script>")
    site.add_response("/never.js", Response(b"var x = 1;", delay_s=20))
    starts = browser.starts
    with pytest.raises(FetchFailed) as failed:
        browser.fetch(request(url))
    assert failed.value.reason == "timeout"

    after = browser.fetch(request(lazy_site(site), js_function="loadMore"))
    assert b"dyn-7f3a" in after.body
    assert browser.starts == starts  # the same browser served the next page


def test_a_server_that_never_answers_times_out_and_the_browser_is_replaced(
    site: TestSite, browser: BrowserFetcher
) -> None:
    url = site.add_response("/silent.html", Response(b"late", delay_s=20))
    started = time.monotonic()
    with pytest.raises(FetchFailed) as failed:
        browser.fetch(request(url))
    assert failed.value.reason == "timeout"
    assert time.monotonic() - started < CONFIG.page_timeout_s + 2
    assert b"dyn-7f3a" in browser.fetch(request(lazy_site(site), js_function="loadMore")).body


def test_non_200_page_is_returned_with_its_status(site: TestSite, browser: BrowserFetcher) -> None:
    result = browser.fetch(request(site.url("/nowhere.html")))
    assert result.status == 404 and result.body == b""


def test_a_redirect_is_followed_unless_the_request_says_not_to(site: TestSite, browser: BrowserFetcher) -> None:
    site.add_redirect("/moved.html", "/target.html", status=301)
    site.add_page("/target.html", "<html><body>here</body></html>")

    followed = browser.fetch(request(site.url("/moved.html")))
    handed_back = browser.fetch(replace(request(site.url("/moved.html")), follow_redirects=False))

    assert followed.status == 200 and followed.final_url == site.url("/target.html")
    assert handed_back.status == 301 and handed_back.body == b""
    assert handed_back.headers == {"location": site.url("/target.html")}


def test_wait_for_a_selector_without_a_function(site: TestSite, browser: BrowserFetcher) -> None:
    script = "setTimeout(function () { document.getElementById('c').innerHTML = '<b class=\"late\">here</b>'; }, 300);"
    url = site.add_page("/later.html", f"<div id='c'></div><script>{script}</script>")
    result = browser.fetch(request(url, wait_for="b.late"))
    assert b'<b class="late">here</b>' in result.body


def test_user_agent_and_referer_hold_for_the_page_and_its_xhr(site: TestSite, browser: BrowserFetcher) -> None:
    url = lazy_site(site)
    browser.fetch(request(url, js_function="loadMore", user_agent=TEST_USER_AGENTS[2], referer=TEST_REFERERS[1]))

    [page] = site.requests_to("/app/d1.html")
    [xhr] = site.requests_to("/api/page/1.json")
    for seen in (page, xhr):
        assert seen.headers["User-Agent"] == TEST_USER_AGENTS[2]
        assert seen.headers["Referer"] == TEST_REFERERS[1]


def process_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def processes_in(groups: set[int]) -> dict[int, str]:
    """The live Chromium and chromedriver processes of these process groups: pid -> name."""
    found = {}
    for pid in chromium_processes():
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue  # gone meanwhile
        if process_group(pid) in groups:
            found[pid] = name
    return found


def test_after_many_pages_one_browser_remains_and_none_leak(site: TestSite, browser_installed: None) -> None:
    # Only this fetcher's browsers count: each runs in its own process group (the chromedriver's),
    # and other tests (the dashboard's, in the other pytest process) run Chromium at the same time.
    url = lazy_site(site)
    config = BrowserConfig(page_timeout_s=3.0, lazy_timeout_s=3.0, idle_s=0.1, max_pages=3)
    fetcher = BrowserFetcher(config, policy=LOOPBACK_POLICY)
    groups: set[int] = set()
    try:
        for _ in range(7):
            assert b"dyn-7f3a" in fetcher.fetch(request(url, js_function="loadMore")).body
            assert fetcher.starts <= 3
            if fetcher._driver is not None:  # None right after the page that recycles it
                group = process_group(fetcher._driver.service.process.pid)
                assert group is not None
                groups.add(group)
        assert len(groups) == 3
        # One browser (recycled twice), not three; the killed ones may take a moment to go.
        wait_until(lambda: list(processes_in(groups).values()).count("chromedriver") == 1, 5, "one chromedriver")
    finally:
        fetcher.close()
    assert fetcher.starts == 3
    wait_until(lambda: not processes_in(groups), 5, "every process of the fetcher's browsers gone")


def test_dynamic_task_through_the_graph(worker: object, site: TestSite, vcrawl_settings: Settings) -> None:
    url = lazy_site(site)
    task_id = tasks.crawl.delay({"url": url, "page_type": "dynamic", "js_function": "loadMore"}).id
    record = wait_for_end(task_id, timeout_s=60)

    assert record["state"] == "analyzed", record
    assert b"dyn-7f3a" in Path(record["save_path"]).read_bytes()
    links = json.loads(Path(record["result_path"]).read_text())["links"]
    assert site.url("/more/m1.html") in [link["url"] for link in links]


def test_a_browser_killed_mid_task_is_replaced_and_the_task_retried(worker: object, site: TestSite) -> None:
    url = site.add_page("/app/slow.html", LAZY_PAGE.format(api="/api/slow.json"))
    site.add_sequence(
        "/api/slow.json",
        [Response(API.encode(), delay_s=2.0), Response(API.encode(), headers={"Content-Type": "application/json"})],
    )
    browser = tasks.deps.fetchers().get("dynamic")
    task_id = tasks.crawl.delay({"url": url, "page_type": "dynamic", "js_function": "loadMore"}).id
    deadline = time.monotonic() + 30
    while not site.requests_to("/api/slow.json") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert site.requests_to("/api/slow.json"), "the browser never called loadMore"
    chromium = [
        pid for pid in chromium_processes()
        if Path(f"/proc/{pid}/comm").read_text().strip() != "chromedriver"
        and os.getpgid(pid) == os.getpgid(browser._driver.service.process.pid)
    ]  # fmt: skip
    for pid in chromium:
        os.kill(pid, signal.SIGKILL)

    record = wait_for_end(task_id, timeout_s=60)

    assert record["state"] == "analyzed", record
    assert record["attempts"] == 2 and "browser_crashed" in record["last_error"]


def test_a_job_with_a_dynamic_rule(worker: object, site: TestSite) -> None:
    lazy_site(site)
    site.add_page("/", "<a href='/app/d1.html'>app</a>")
    site.add_page("/more/m1.html", "<p>only reachable after loadMore()</p>")
    job_id = tasks.start_job(
        {
            "seeds": [site.url("/")],
            "politeness": {"min_interval_s": 0},
            "rules": [{"pattern": r"/app/", "page_type": "dynamic", "js_function": "loadMore"}],
        }
    )
    deadline = time.monotonic() + 60
    while (status := tasks.job_status(job_id))["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status["state"] == "completed" and status["pages_stored"] == 3
    assert site.requests_to("/more/m1.html")  # a JS-only page, found through the rendered DOM


def test_threads_share_one_browser_one_page_at_a_time(site: TestSite, browser: BrowserFetcher) -> None:
    url = lazy_site(site)
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(browser.fetch(request(url, js_function="loadMore")).body))
               for _ in range(3)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 3 and all(b"dyn-7f3a" in body for body in results)


def test_the_browser_goes_through_the_proxy(site: TestSite, browser_installed: None) -> None:
    # A forward proxy on loopback answers for a host name that resolves nowhere.
    site.add_page("http://shop.test/app.html", LAZY_PAGE.format(api="/api/page/1.json"))
    site.add_response(
        "http://shop.test/api/page/1.json", Response(API.encode(), headers={"Content-Type": "application/json"})
    )
    fetcher = BrowserFetcher(CONFIG, policy=LOOPBACK_POLICY)
    try:
        result = fetcher.fetch(request("http://shop.test/app.html", js_function="loadMore", proxy=site.base))
    finally:
        fetcher.close()
    assert b"dyn-7f3a" in result.body
    paths = [seen.path for seen in site.seen]
    assert {"http://shop.test/app.html", "http://shop.test/api/page/1.json"} <= set(paths)
    assert all(path.startswith("http://shop.test/") for path in paths)  # no traffic of Chromium's own


def test_a_page_that_cannot_be_reached_fails_instead_of_storing_an_error_page(browser: BrowserFetcher) -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(FetchFailed) as failed:
        browser.fetch(request(f"http://127.0.0.1:{port}/"))
    assert failed.value.reason == "navigation_failed"
