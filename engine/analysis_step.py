"""The one analysis step: a stored page in, its links and its analyzer's result out.

``analyze_one`` is what both a single task's ``vcrawl.analyze`` and a crawl job's analysis batch
call for each page. It reads the page from storage, parses it once, collects the links worth
following (HTML pages, when asked) and runs the named analyzer with the page's field rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from analyzers import TRUNCATED, Page, followed_links, is_html, run_analysis
from storage import Storage
from vcrawl.payloads import MAX_LINKS_PER_PAGE, FetchedPage, FieldRule

__all__ = ["Analysis", "analyze_one"]


@dataclass(frozen=True)
class Analysis:
    """What the analysis of one page found."""

    links: tuple[str, ...] = ()  # links to follow (absolute, not yet canonical)
    skipped: Mapping[str, int] = field(default_factory=dict)  # links not followed, by kind (javascript:, ...)
    html: bool = True  # a page whose links were read
    result: Mapping[str, Any] | None = None  # the analyzer's JSON-ready result; None when none ran
    links_truncated: int = 0  # links to follow past the page's max_links: counted, not read


def analyze_one(
    store: Storage,
    page: FetchedPage,
    analyzer: str | None,
    fields: Mapping[str, FieldRule] | None = None,
    *,
    follow_links: bool = False,
    max_links: int = MAX_LINKS_PER_PAGE,
) -> Analysis:
    """Analyse the stored ``page`` with ``analyzer`` (None: links only); the links (to follow, and
    the ``links`` analyzer's) are the page's first ``max_links``.

    Raises:
        MissingPage: the stored page is gone.
        UnknownComponent: no analyzer of that name in this process.
        Exception: whatever the analyzer raised (a plugin's bug): the caller decides on retries.
    """
    body = store.read_bytes(page.save_path)
    parsed = Page(url=page.final_url, body=body, content_type=page.content_type, max_links=max_links)
    html = is_html(page.content_type)
    links: list[str] = []
    skipped: dict[str, int] = {}
    if follow_links and html:
        links, skipped = followed_links(parsed)
    result = run_analysis(parsed, analyzer, fields) if analyzer is not None else None
    return Analysis(tuple(links), skipped, html, result, links_truncated=skipped.pop(TRUNCATED, 0))
