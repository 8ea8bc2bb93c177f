"""Batch (map/reduce) analyzers: a whole job's stored crawl in, one result out.

A batch analyzer's ``map`` turns one chunk of a job's crawled URLs into a partial result, and its
``reduce`` folds the partials of every chunk into the result. Both return JSON-ready dicts: the
engine runs the maps as a Celery chord on the analysis queue, stores each partial, and writes
what ``reduce`` returns to ``jobs/<job>/results/<analyzer>.json``. A partial must not depend on how
the URLs were cut into chunks or in which order the chunks ran, so that ``reduce`` gives the same
result for any ``--chunk``.

Registered like per-page analyzers: the built-ins below plus the ``vcrawl.batch_analyzers``
entry-point group; a message only ever names one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from analyzers.page import Page

__all__ = ["BATCH_ENTRY_POINT_GROUP", "BatchAnalyzer", "CrawledUrl", "MapContext"]

BATCH_ENTRY_POINT_GROUP = "vcrawl.batch_analyzers"


@dataclass(frozen=True)
class CrawledUrl:
    """One URL of the job as the fetch log ended it, with its stored page when there is one."""

    url: str  # canonical, as the crawl held it
    host: str  # host[:port] as in the URL
    outcome: str  # stored | redirect | failed | unchanged | robots_blocked
    status: int | None = None  # final HTTP status; None when no response came
    depth: int = 0
    bytes: int = 0
    content_type: str | None = None
    reason: str = ""  # a failure's reason (``http_404``, ``timeout``, ...)
    target: str = ""  # a redirect's target
    page: Page | None = None  # the stored body; None when nothing is stored (or it is gone)

    @property
    def mime(self) -> str:
        """The content type without parameters, lower case ("" when unknown)."""
        return (self.content_type or "").split(";", 1)[0].strip().lower()


class MapContext(Protocol):
    """What a map may ask about the job beyond its chunk."""

    def canonical(self, url: str) -> str:
        """The crawl's canonical form of the absolute ``url``; "" if it is not a valid http(s) URL."""
        ...

    def final_status(self, canonical_url: str) -> int | None:
        """The final HTTP status of a URL the job crawled but did not store (None: stored, or not crawled)."""
        ...


class BatchAnalyzer(Protocol):
    """A map function over chunks of crawled URLs and a reduce function over their partials."""

    def map(self, urls: Sequence[CrawledUrl], context: MapContext) -> dict[str, Any]:
        """The partial result of one chunk."""
        ...

    def reduce(self, partials: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """The result from every chunk's partial (in any order)."""
        ...


BatchAnalyzerFactory = Callable[[], BatchAnalyzer]
