"""The fetch step's WARC capture (a job with ``warc: true``): the exchange archived as it came, or a
``revisit`` record for a page a re-crawl cycle found unchanged."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime

from engine.fetch_step.context import FetchContext, FetchItem
from engine.outcomes import FetchOutcome, Stored
from fetchers import FetchResult
from frontier import UrlHistory, content_hash
from vcrawl import names
from vcrawl.errors import VcrawlError

__all__ = ["archive", "with_capture"]

logger = logging.getLogger(__name__)


def archive(ctx: FetchContext, item: FetchItem, result: FetchResult, counts: Counter[str]) -> str | None:
    """Write the exchange to the job's WARC sink, if it archives (a store failure is counted, not fatal).

    In a re-crawl cycle, a 304 or a 200 with the body of the URL's last archived capture is written
    as a ``revisit`` record referring to that capture. Returns the new capture of a 200 written as a
    ``response`` ("<timestamp> <digest>", for the URL's history), else None.
    """
    if ctx.job is None or ctx.job.warc is None:
        return None
    sink, url = ctx.job.warc, item.entry.url
    refers_to = _revisit_of(ctx, item.known, result)
    try:
        if refers_to is not None:
            timestamp, digest = refers_to.split(" ", 1)
            sink().write_revisit(
                url,
                fetched_at=datetime.now(UTC),
                status=result.status,
                response_headers=result.headers,
                refers_to_uri=url,
                refers_to_date=timestamp,
                digest=digest,
                not_modified=result.status == 304,
            )
            counts[names.COUNTER_WARC_RECORDS] += 1
            return None
        written = sink().write_exchange(
            url,
            request_headers=result.request_headers,
            status=result.status,
            reason=result.reason,
            response_headers=result.headers,
            body=result.body,
            fetched_at=datetime.now(UTC),
            ip=result.ip or None,  # no WARC-IP-Address when unknown (through a proxy, the browser)
        )
        counts[names.COUNTER_WARC_RECORDS] += 1
    except (VcrawlError, OSError, ValueError) as exc:
        logger.warning("WARC write of %s failed: %r", url, exc)
        counts[names.COUNTER_WARC_FAILED] += 1
        return None
    return f"{written.timestamp} {written.digest}" if result.status == 200 and ctx.cycle is not None else None


def _revisit_of(ctx: FetchContext, known: UrlHistory | None, result: FetchResult) -> str | None:
    """The capture an unchanged page's revisit record refers to (None: archive the response in full)."""
    if ctx.cycle is None or known is None or not known.fetched or not known.capture:
        return None
    if result.status == 304:
        return known.capture
    if result.status == 200 and known.content_hash == content_hash(result.body):
        return known.capture
    return None


def with_capture(outcome: FetchOutcome, capture: str | None) -> FetchOutcome:
    """The outcome with ``capture`` (a WARC response just written) in the URL's history it carries."""
    if capture is None:
        return outcome
    if isinstance(outcome, Stored) and outcome.page.history:
        history = replace(UrlHistory.decode(outcome.page.history), capture=capture)
        return replace(outcome, page=replace(outcome.page, history=history.encode()))
    if outcome.visit.revisit is not None:  # an unchanged page archived in full: later revisits refer to it
        return replace(outcome, visit=replace(outcome.visit, revisit=replace(outcome.visit.revisit, capture=capture)))
    return outcome
