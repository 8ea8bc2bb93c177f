"""A third-party analyzer plugin used by the tests, found through its entry point."""

from __future__ import annotations

import threading
from typing import Any

CALLS: list[str] = []
_lock = threading.Lock()


def always_fails(page: Any, rules: Any) -> dict:
    """An analyzer with a bug: it raises on every page."""
    with _lock:
        CALLS.append(page.url)
    raise RuntimeError(f"analyzer bug on {page.url}")


FLAKY_CALLS: dict[str, int] = {}


def fails_twice(page: Any, rules: Any) -> dict:
    """An analyzer that fails on the first two calls for a page, then works (a passing outage)."""
    with _lock:
        FLAKY_CALLS[page.url] = calls = FLAKY_CALLS.get(page.url, 0) + 1
    if calls <= 2:
        raise RuntimeError(f"passing trouble #{calls} on {page.url}")
    return {"url": page.url, "calls": calls}


def word_count(page: Any, rules: Any) -> dict:
    """A working plugin analyzer: counts the words of the page text."""
    return {"url": page.url, "words": len(page.tree.text_content().split())}


def slow_words(page: Any, rules: Any) -> dict:
    """A slow analyzer for fault tests: notes each start in $VCRAWL_TEST_ANALYSIS_LOG, then sleeps.

    The log shows which analyses began, so a test can kill the worker while one runs.
    """
    import os
    import time

    log = os.environ.get("VCRAWL_TEST_ANALYSIS_LOG")
    if log:
        with _lock, open(log, "a", encoding="utf-8") as out:
            out.write(page.url + "\n")
    time.sleep(float(os.environ.get("VCRAWL_TEST_ANALYSIS_SLEEP_S", "0.5")))
    return {"url": page.url, "words": len(page.tree.text_content().split())}


class SlowSiteReport:
    """A batch analyzer for fault tests: the site report, but each map notes its chunk in
    $VCRAWL_TEST_ANALYSIS_LOG and sleeps $VCRAWL_TEST_ANALYSIS_SLEEP_S first."""

    def __init__(self) -> None:
        from analyzers.site_report import SiteReport

        self._report = SiteReport()

    def map(self, urls: Any, context: Any) -> dict:
        import os
        import time

        log = os.environ.get("VCRAWL_TEST_ANALYSIS_LOG")
        if log:
            with _lock, open(log, "a", encoding="utf-8") as out:
                out.write(urls[0].url + "\n")
        time.sleep(float(os.environ.get("VCRAWL_TEST_ANALYSIS_SLEEP_S", "0.5")))
        return self._report.map(urls, context)

    def reduce(self, partials: Any) -> dict:
        return self._report.reduce(partials)


# Admission filters (entry-point group vcrawl.filters).

FILTER_CONTEXTS: list[tuple[str, Any]] = []  # (url, AdmissionContext) the max-query-params filter saw


def max_query_params(params: Any) -> Any:
    """A filter plug-in: drop URLs with more than ``params["max"]`` query parameters (``too_many_params``)."""
    from urllib.parse import parse_qsl, urlsplit

    from vcrawl.errors import InvalidTask

    if set(params) - {"max"}:
        raise InvalidTask(sorted(set(params) - {"max"})[0], "unknown param; known: max")
    limit = params.get("max")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise InvalidTask("max", f"must be an integer >= 0, got {limit!r}")

    def check(url: str, context: Any) -> str | None:
        with _lock:
            FILTER_CONTEXTS.append((url, context))
        return "too_many_params" if len(parse_qsl(urlsplit(url).query)) > limit else None

    return check


# Fetchers (entry-point group vcrawl.fetchers).


def tagged(context: Any) -> Any:
    """A fetcher plug-in for ``page_type: tagged``: the static fetcher (network guard and limits kept)
    sending ``X-Fetched-By: tagged``, so the site sees which fetcher asked."""
    from dataclasses import replace

    from fetchers.builtin import static

    inner = static(context)

    class Tagged:
        def fetch(self, request: Any) -> Any:
            return inner.fetch(replace(request, headers={**request.headers, "X-Fetched-By": "tagged"}))

    return Tagged()


def broken(context: Any) -> Any:
    """A fetcher plug-in for ``page_type: broken`` with a bug: every fetch raises an unexpected error."""

    class Broken:
        def fetch(self, request: Any) -> Any:
            raise RuntimeError(f"fetcher bug on {request.url}")

    return Broken()


def follows(context: Any) -> Any:
    """A fetcher plug-in for ``page_type: follows`` that ignores ``request.follow_redirects`` and
    always follows redirects itself (a careless plug-in)."""
    from dataclasses import replace

    from fetchers.builtin import static

    inner = static(context)

    class Follows:
        def fetch(self, request: Any) -> Any:
            return inner.fetch(replace(request, follow_redirects=True))

    return Follows()


def unbuildable(context: Any) -> Any:
    """A fetcher plug-in for ``page_type: unbuildable`` whose factory has a bug: it raises."""
    raise RuntimeError("fetcher factory bug")


def reveal_hidden() -> str:
    """A page script plug-in (``reveal-hidden``): shows the links a page keeps in hidden templates,
    after a delay, as a Promise (the browser waits for it)."""
    return """return new Promise(function (done) { setTimeout(function () {
      document.querySelectorAll('template.hidden-links').forEach(function (t) {
        document.body.appendChild(t.content.cloneNode(true)); });
      done(true); }, 100); });"""
