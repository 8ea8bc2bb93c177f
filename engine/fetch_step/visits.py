"""What a visit leaves behind: its ``Visit`` (counters, the Crawl-delay, a scheduled job's URL history),
a final failure, and the entry of a URL's next attempt."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from engine.fetch_step.context import Cycle, FetchContext, FetchItem
from engine.outcomes import Failed, Visit
from fetchers import FetchResult
from frontier import Entry, UrlHistory
from vcrawl import names

__all__ = ["failed", "history_of", "next_attempt", "visit_of"]


def failed(
    ctx: FetchContext,
    item: FetchItem,
    reason: str,
    http_status: int | None,
    error: str,
    counts: Counter[str],
    *,
    requested: bool = True,
    crawl_delay_s: float | None = None,
    result: FetchResult | None = None,
) -> Failed:
    """A final failure of ``item`` for ``reason``, counted as ``failed:<reason>``."""
    counts[f"{names.PREFIX_FAILED}{reason}"] += 1
    visit = visit_of(ctx, item, counts, requested, crawl_delay_s, result)
    return Failed(item.entry, reason, http_status, error or reason, visit=visit)


def visit_of(
    ctx: FetchContext,
    item: FetchItem,
    counts: Mapping[str, int],
    requested: bool,
    crawl_delay_s: float | None,
    result: FetchResult | None = None,
) -> Visit:
    """The Visit of a fetch that found nothing new; a scheduled job remembers it in the URL's history."""
    revisit = None if ctx.cycle is None else history_of(ctx.cycle, item, result, changed=False)
    return Visit(requested=requested, crawl_delay_s=crawl_delay_s, counts=counts, revisit=revisit)


def history_of(
    cycle: Cycle, item: FetchItem, result: FetchResult | None, *, changed: bool, digest: str | None = None
) -> UrlHistory:
    """The URL's history after this visit of ``cycle`` (``result``: its response, if one came)."""
    known = replace(item.known, depth=item.entry.depth) if item.known is not None else UrlHistory(item.entry.depth)
    return known.after_visit(
        cycle_started_s=cycle.started_s,
        revisit=cycle.revisit,
        status=result.status if result is not None else None,
        headers=result.headers if result is not None else None,
        changed=changed,
        digest=digest,
    )


def next_attempt(entry: Entry) -> Entry:
    """The entry of the URL's next attempt, due when its host is next leased."""
    return replace(entry, attempt=entry.attempt + 1, not_before_s=0.0)
