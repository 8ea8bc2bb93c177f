"""A 200 body stored: the page's record for the analysis, and in a scheduled job its new URL history
(or ``Unchanged`` when the body hashes as the last one did)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from engine.fetch_step.context import FetchContext, FetchItem
from engine.fetch_step.visits import history_of, visit_of
from engine.outcomes import FetchOutcome, Stored, Unchanged, Visit
from fetchers import FetchResult
from frontier import content_hash
from vcrawl import names
from vcrawl.payloads import FetchedPage

__all__ = ["store_page"]

# Response headers worth carrying to the analysis stage and later re-crawls.
_KEPT_HEADERS = ("content-type", "content-length", "etag", "last-modified", "content-language")


def store_page(
    ctx: FetchContext, item: FetchItem, result: FetchResult, counts: Counter[str], crawl_delay_s: float | None
) -> FetchOutcome:
    """Store a 200 body; in a scheduled job, a body with the known content hash is Unchanged.

    Raises:
        StorageFailed: the body could not be stored.
    """
    entry, known, cycle = item.entry, item.known, ctx.cycle
    history: str | None = None
    if cycle is not None:
        digest = content_hash(result.body)
        if known is not None and known.content_hash == digest:
            counts[names.COUNTER_UNCHANGED] += 1
            return Unchanged(entry, visit_of(ctx, item, counts, True, crawl_delay_s, result))
        changed = known is not None and bool(known.content_hash)  # else: its first page
        counts[names.COUNTER_CHANGED if changed else names.COUNTER_NEW] += 1
        history = history_of(cycle, item, result, changed=True, digest=digest).encode()
    ctx.services.store.write_bytes(item.save_path, result.body)
    counts[names.COUNTER_STORED] += 1
    counts[names.COUNTER_BYTES] += len(result.body)
    page = FetchedPage(
        url=entry.url,
        final_url=result.final_url,
        save_path=item.save_path,
        http_status=result.status,
        bytes=len(result.body),
        content_type=result.content_type,
        elapsed_s=result.elapsed_s,
        headers={name: result.headers[name] for name in _KEPT_HEADERS if name in result.headers},
        depth=entry.depth,
        fetched_at=datetime.now(UTC).isoformat(timespec="seconds"),
        history=history,
        ip=result.ip,
    )
    return Stored(entry, page, Visit(requested=True, crawl_delay_s=crawl_delay_s, counts=counts))
