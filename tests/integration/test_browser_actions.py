"""Browser actions in real headless Chromium: clicks, scrolls, typing and submitting, waits, page scripts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from fetchers import BrowserConfig, BrowserFetcher, FetchRequest
from tests.conftest import LOOPBACK_POLICY
from tests.integration.conftest import run_job
from tests.site import Response, TestSite
from vcrawl.browser_actions import parse_actions
from vcrawl.errors import DownloadFailed, FetchFailed

pytestmark = pytest.mark.browser

CONFIG = BrowserConfig(page_timeout_s=5.0, lazy_timeout_s=3.0, idle_s=0.2)

# Each click on #more adds 5 links (the button goes after 4 clicks); each scroll to the end adds 5 (3 times).
LIST = """<!doctype html><html><head><title>list</title></head><body>
<div id="items"></div><button id="more" type="button">More</button>
<div id="scrolled"></div><div style="height:4000px">tall</div>
<script>
var n = 0, clicks = 0, s = 0, sc = 0;
document.getElementById('more').addEventListener('click', function () {
  for (var i = 0; i < 5; i++) { n++; var a = document.createElement('a'); a.href = '/item/' + n;
    a.textContent = 'item ' + n; document.getElementById('items').appendChild(a); }
  if (++clicks >= 4) { var b = document.getElementById('more'); b.parentNode.removeChild(b); }
});
window.addEventListener('scroll', function () {
  if (sc >= 3 || window.innerHeight + window.scrollY < document.body.scrollHeight - 50) return;
  sc++; for (var i = 0; i < 5; i++) { s++; var a = document.createElement('a'); a.href = '/scroll/' + s;
    document.getElementById('scrolled').appendChild(a); }
  document.body.appendChild(Object.assign(document.createElement('div'), {style: 'height:2000px'}));
});
</script></body></html>"""
SEARCH = """<!doctype html><html><head><title>search</title></head><body>
<form action="/results" method="get"><input name="q" type="text"><button type="submit">Go</button></form>
</body></html>"""
RESULTS = '<html><body><a class="found" href="/found/1">1</a><a class="found" href="/found/2">2</a></body></html>'
# A button that is never gone, each click fetching something slow: only the budget ends the clicking.
ENDLESS = """<!doctype html><html><body><button id="more">More</button><div id="out"></div><script>
var c = 0;
document.getElementById('more').addEventListener('click', function () {
  fetch('/slow').then(function () { c++; document.getElementById('out').textContent = 'clicked ' + c; });
});
</script></body></html>"""


@pytest.fixture(scope="module")
def browser(browser_installed: None) -> Iterator[BrowserFetcher]:
    fetcher = BrowserFetcher(CONFIG, policy=LOOPBACK_POLICY)
    yield fetcher
    fetcher.close()


def acting(url: str, actions: list[dict[str, object]]) -> FetchRequest:
    return FetchRequest(url=url, user_agent="vcrawl-test/1", actions=parse_actions(actions))


def links(body: bytes, prefix: str) -> set[str]:
    text = body.decode()
    return {part.split('"')[0] for part in text.split('href="')[1:] if part.startswith(prefix)}


def test_clicks_until_the_button_is_gone_and_scrolls_to_the_end(site: TestSite, browser: BrowserFetcher) -> None:
    url = site.add_page("/list", LIST)
    plain = browser.fetch(FetchRequest(url=url, user_agent="vcrawl-test/1"))
    assert links(plain.body, "/item/") == set()

    result = browser.fetch(acting(url, [{"click": "#more", "until_gone": True, "max": 10},
                                        {"scroll": "end", "times": 3}]))  # fmt: skip

    assert links(result.body, "/item/") == {f"/item/{n}" for n in range(1, 21)}
    assert links(result.body, "/scroll/") == {f"/scroll/{n}" for n in range(1, 16)}
    assert 'id="more"' not in result.body.decode()


def test_a_click_stops_at_its_max(site: TestSite, browser: BrowserFetcher) -> None:
    url = site.add_page("/list", LIST)
    result = browser.fetch(acting(url, [{"click": "#more", "max": 2}]))
    assert links(result.body, "/item/") == {f"/item/{n}" for n in range(1, 11)}


def test_typing_and_submitting_reads_the_page_the_form_led_to(site: TestSite, browser: BrowserFetcher) -> None:
    url = site.add_page("/search", SEARCH)
    site.add_page("/results?q=red+shoes", RESULTS)

    result = browser.fetch(acting(url, [{"type": "input[name=q]", "text": "red shoes", "submit": True},
                                        {"wait_for": "a.found"}]))  # fmt: skip

    assert result.final_url == site.url("/results?q=red+shoes")
    assert links(result.body, "/found/") == {"/found/1", "/found/2"}
    assert len(site.requests_to("/results?q=red+shoes")) == 1


def test_a_submit_that_leads_to_an_error_page_fails_the_fetch(site: TestSite, browser: BrowserFetcher) -> None:
    url = site.add_page("/search", SEARCH)  # no /results page: 404
    with pytest.raises(DownloadFailed) as failed:
        browser.fetch(acting(url, [{"type": "input[name=q]", "text": "x", "submit": True}]))
    assert failed.value.reason == "action_http_404"


def test_an_action_that_leads_off_the_pages_host_fails_for_good(site: TestSite, browser: BrowserFetcher) -> None:
    with TestSite(host="127.0.0.2") as elsewhere:
        target = elsewhere.add_page("/there", "<html><body>another host</body></html>")
        url = site.add_page("/away", f'<html><body><a id="go" href="{target}">go</a></body></html>')
        with pytest.raises(DownloadFailed) as failed:
            browser.fetch(acting(url, [{"click": "#go"}]))
    assert failed.value.reason == "action_left_host"


def test_nothing_to_type_into_fails_for_good(site: TestSite, browser: BrowserFetcher) -> None:
    url = site.add_page("/list", LIST)
    with pytest.raises(DownloadFailed) as failed:
        browser.fetch(acting(url, [{"type": "input[name=q]", "text": "x"}]))
    assert failed.value.reason == "action_target_missing"


def test_a_wait_for_that_never_comes_is_a_timeout(site: TestSite, browser: BrowserFetcher) -> None:
    url = site.add_page("/list", LIST)
    started = time.monotonic()
    with pytest.raises(FetchFailed) as failed:
        browser.fetch(acting(url, [{"wait_for": "a.never"}]))
    assert failed.value.reason == "wait_for_timeout"
    assert time.monotonic() - started < CONFIG.lazy_timeout_s + CONFIG.page_timeout_s


def test_registered_page_scripts_run_built_in_and_plug_in(site: TestSite, browser: BrowserFetcher) -> None:
    page = """<html><body><details><summary>more</summary><a href="/inside">x</a></details>
    <template class="hidden-links"><a href="/revealed">r</a></template></body></html>"""
    url = site.add_page("/scripts", page)

    result = browser.fetch(acting(url, [{"script": "open-details"}, {"script": "reveal-hidden"}]))

    body = result.body.decode()
    assert "<details open" in body
    assert links(result.body, "/revealed") == {"/revealed"}  # the plug-in's Promise was waited for


def test_actions_stop_at_their_budget_and_the_page_is_read_as_it_stands(site: TestSite) -> None:
    url = site.add_page("/endless", ENDLESS)
    site.add_response("/slow", Response(b"{}", delay_s=0.4))
    fetcher = BrowserFetcher(replace(CONFIG, actions_timeout_s=2.0), policy=LOOPBACK_POLICY)
    try:
        started = time.monotonic()
        result = fetcher.fetch(acting(url, [{"click": "#more", "until_gone": True, "max": 50},
                                            {"scroll": "end", "times": 50}]))  # fmt: skip
        took = time.monotonic() - started
    finally:
        fetcher.close()
    clicks = len(site.requests_to("/slow"))
    assert 2 <= clicks < 10, clicks  # ~0.6 s a click (its fetch, then the quiet): stopped by the budget
    assert took < 2.0 + CONFIG.page_timeout_s
    assert "clicked" in result.body.decode()


def test_a_job_follows_the_links_its_actions_revealed(site: TestSite, worker: object) -> None:
    site.add_page("/", '<html><body><a href="/list">l</a> <a href="/search">s</a></body></html>')
    site.add_page("/list", LIST)
    site.add_page("/search", SEARCH)
    site.add_page("/results?q=shoes", RESULTS)
    leaves = [*(f"/item/{n}" for n in range(1, 21)), *(f"/scroll/{n}" for n in range(1, 16)), "/found/1", "/found/2"]
    for path in leaves:
        site.add_page(path, "<html><head><title>leaf</title></head><body>leaf</body></html>")
    job = {
        "seeds": [site.url("/")], "max_depth": 3, "politeness": {"min_interval_s": 0, "jitter": 0},
        "rules": [
            {"pattern": "/list$", "page_type": "dynamic",
             "actions": [{"click": "#more", "until_gone": True}, {"scroll": "end", "times": 3}]},
            {"pattern": "/search$", "page_type": "dynamic",
             "actions": [{"type": "input[name=q]", "text": "shoes", "submit": True}, {"wait_for": "a.found"}]},
        ],
    }  # fmt: skip
    status = run_job(job, timeout_s=90)

    assert status["state"] == "completed", status
    fetched = {seen.path for seen in site.seen}
    assert {f"/item/{n}" for n in range(1, 21)} <= fetched
    assert {f"/scroll/{n}" for n in range(1, 16)} <= fetched
    assert {"/found/1", "/found/2"} <= fetched
