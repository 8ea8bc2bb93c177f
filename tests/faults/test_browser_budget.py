"""Browser actions at the shipped limits, the twins of tests/integration/test_browser_actions.py's shortened
ones: the 30 s budget ends a page that never stops revealing; a wait_for gives up at the lazy timeout (10 s)."""

from __future__ import annotations

import os
import time

import pytest

from fetchers import BrowserConfig, BrowserFetcher, FetchRequest
from tests.conftest import LOOPBACK_POLICY
from tests.integration.test_browser_actions import ENDLESS
from tests.site import Response, TestSite
from vcrawl.browser_actions import parse_actions
from vcrawl.errors import FetchFailed

pytestmark = [pytest.mark.faults, pytest.mark.browser]


def _shipped() -> BrowserConfig:
    shipped = BrowserConfig()
    if not all(os.access(p, os.X_OK) for p in (shipped.chromium_path, shipped.chromedriver_path)):
        pytest.skip("no Chromium here")
    return shipped


def test_the_shipped_budget_stops_endless_clicking_and_the_page_is_read(fault_report: object) -> None:
    shipped = _shipped()
    fetcher = BrowserFetcher(shipped, policy=LOOPBACK_POLICY)
    with TestSite() as site:
        url = site.add_page("/endless", ENDLESS)
        site.add_response("/slow", Response(b"{}", delay_s=1.0))  # each click: 1 s of fetch, then the quiet
        actions = parse_actions([{"click": "#more", "until_gone": True, "max": 50}, {"scroll": "end", "times": 50}])
        try:
            started = time.monotonic()
            result = fetcher.fetch(FetchRequest(url=url, user_agent="vcrawl-test/1", actions=actions))
            took = time.monotonic() - started
        finally:
            fetcher.close()
        clicks = len(site.requests_to("/slow"))
    fault_report(took_s=round(took, 1), clicks=clicks)  # type: ignore[operator]
    assert shipped.actions_timeout_s == 30.0
    assert 10 <= clicks < 50, clicks  # 50 clicks would take over a minute: the budget ended them
    assert shipped.actions_timeout_s <= took < shipped.actions_timeout_s + shipped.page_timeout_s, took
    assert "clicked" in result.body.decode()


def test_a_wait_for_that_never_comes_fails_at_the_shipped_lazy_timeout() -> None:
    shipped = _shipped()
    fetcher = BrowserFetcher(shipped, policy=LOOPBACK_POLICY)
    with TestSite() as site:
        url = site.add_page("/list", ENDLESS)
        try:
            started = time.monotonic()
            with pytest.raises(FetchFailed) as failed:
                fetcher.fetch(FetchRequest(url=url, user_agent="vcrawl-test/1",
                                           actions=parse_actions([{"wait_for": "a.never"}])))  # fmt: skip
            took = time.monotonic() - started
        finally:
            fetcher.close()
    assert failed.value.reason == "wait_for_timeout"
    assert shipped.lazy_timeout_s <= took < shipped.lazy_timeout_s + shipped.page_timeout_s, took
