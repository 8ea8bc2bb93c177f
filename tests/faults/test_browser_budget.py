"""The shipped browser-actions budget (30 s) ends a page that never stops revealing: the twin of
tests/integration/test_browser_actions.py's shortened budget, at the default every user runs."""

from __future__ import annotations

import os
import time

import pytest

from fetchers import BrowserConfig, BrowserFetcher, FetchRequest
from tests.conftest import LOOPBACK_POLICY
from tests.integration.test_browser_actions import ENDLESS
from tests.site import Response, TestSite
from vcrawl.browser_actions import parse_actions

pytestmark = [pytest.mark.faults, pytest.mark.browser]


def test_the_shipped_budget_stops_endless_clicking_and_the_page_is_read(fault_report: object) -> None:
    shipped = BrowserConfig()
    if not all(os.access(p, os.X_OK) for p in (shipped.chromium_path, shipped.chromedriver_path)):
        pytest.skip("no Chromium here")
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
