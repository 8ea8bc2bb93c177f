"""The built-in page types' fetcher factories, registered in the ``vcrawl.fetchers`` entry-point group."""

from __future__ import annotations

import os

from fetchers.base import Fetcher
from fetchers.browser import BrowserFetcher
from fetchers.registry import FetcherContext
from fetchers.static import StaticFetcher, make_session

__all__ = ["api", "dynamic", "static"]


def static(context: FetcherContext) -> Fetcher:
    """``page_type: static``: plain HTTP through the network guard, with the cluster's limits."""
    session = context.session() if context.session is not None else make_session(resolver=context.resolver)
    return StaticFetcher(session, context.limits, policy=context.policy)


def api(context: FetcherContext) -> Fetcher:
    """``page_type: api``: plain HTTP like ``static`` (its headers, secret and records: ``engine.api_pages``)."""
    # Registered so validation knows the page type; its fetches use the fetch context's static
    # fetcher (in a job, with the job's limits), so this factory is never called to fetch.
    return static(context)


class _Browser:
    """``page_type: dynamic``: pages rendered in headless Chromium (only where Chromium and its driver are)."""

    def __call__(self, context: FetcherContext) -> Fetcher:
        return BrowserFetcher(context.browser, policy=context.policy, resolver=context.resolver)

    def unavailable(self, context: FetcherContext) -> str | None:
        """Why this worker cannot render pages, or None."""
        browser = context.browser
        if os.access(browser.chromium_path, os.X_OK) and os.access(browser.chromedriver_path, os.X_OK):
            return None
        return f"{browser.chromium_path} or {browser.chromedriver_path} is missing"


dynamic = _Browser()
