"""The fetch log: one JSON line per URL a job finished fetching (Heritrix's crawl.log, per job).

A fetch batch writes a line for each URL it ends (stored, redirected, failed for good,
unchanged, refused by robots.txt) before it releases its lease, through the worker's
``RecordWriter`` for ``jobs/<job>/fetch-log`` (spooled, shipped whole, recovered after a kill).
It is what batch analysis and replay read: the stored pages with their depth and content type,
and the URLs that never became pages, with their final status.

A URL may have several lines: a batch redelivered after its worker died, or one line per cycle
of a scheduled job. ``latest_by_url`` keeps the last one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from engine.outcomes import Failed, FetchOutcome, Redirected, RobotsBlocked, Stored, Unchanged
from storage import Storage, job_fetch_log_location

__all__ = ["LoggedUrl", "latest_by_url", "log_lines", "read_fetch_log"]


@dataclass(frozen=True)
class LoggedUrl:
    """One URL's end in a job: what the fetch log says of it."""

    url: str  # the canonical URL the frontier held
    outcome: str  # stored | redirect | failed | unchanged | robots_blocked
    status: int | None = None  # the final HTTP status; None when no response came (timeout, robots.txt)
    depth: int = 0
    cycle: int = 0
    at: float = 0.0  # when the batch released it (Unix seconds)
    reason: str = ""  # why it failed (``http_404``, ``timeout``, ...)
    bytes: int = 0  # the stored body's size
    content_type: str | None = None
    location: str = ""  # where the body is stored
    final_url: str = ""  # the URL the body came from (the same, unless the fetcher followed redirects)
    target: str = ""  # a redirect's target
    fetched_at: str = ""  # ISO 8601, UTC (stored pages)

    @property
    def stored(self) -> bool:
        """True for a page whose body is in storage."""
        return self.outcome == "stored"

    def to_json(self) -> dict[str, object]:
        """The line's fields, empty ones left out."""
        # getattr, not dataclasses.asdict: this runs once per URL on the fetch path, asdict deep-copies.
        values = ((name, getattr(self, name)) for name in self.__dataclass_fields__)
        return {name: value for name, value in values if value not in ("", None) or name == "status"}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> LoggedUrl:
        """Decode a line (unknown keys, from a newer writer, are ignored).

        Raises:
            ValueError: no ``url`` or ``outcome``.
        """
        known = {key: value for key, value in data.items() if key in cls.__dataclass_fields__}
        if not isinstance(known.get("url"), str) or not isinstance(known.get("outcome"), str):
            raise ValueError(f"a fetch log line needs url and outcome: {data!r}")
        return cls(**known)  # type: ignore[arg-type]


def log_lines(outcomes: Sequence[FetchOutcome], cycle: int, now: float) -> list[LoggedUrl]:
    """The fetch log lines of a batch's final outcomes (retries and robots.txt reads are not final)."""
    lines: list[LoggedUrl] = []
    for outcome in outcomes:
        entry = outcome.entry
        base = {"url": entry.url, "depth": entry.depth, "cycle": cycle, "at": round(now, 3)}
        match outcome:
            case Stored(page=page):
                lines.append(
                    LoggedUrl(
                        **base,
                        outcome="stored",
                        status=page.http_status,
                        bytes=page.bytes,
                        content_type=page.content_type,
                        location=page.save_path,
                        final_url=page.final_url if page.final_url != entry.url else "",
                        fetched_at=page.fetched_at,
                    )
                )
            case Redirected():
                lines.append(LoggedUrl(**base, outcome="redirect", status=outcome.http_status, target=outcome.target))
            case Failed():
                lines.append(LoggedUrl(**base, outcome="failed", status=outcome.http_status, reason=outcome.reason))
            case Unchanged():
                lines.append(LoggedUrl(**base, outcome="unchanged", reason="unchanged"))  # 304, or the same hash
            case RobotsBlocked():
                lines.append(LoggedUrl(**base, outcome="robots_blocked", reason="robots_blocked"))
    return lines


def read_fetch_log(store: Storage, job_id: str) -> Iterator[LoggedUrl]:
    """Every line of a job's fetch log, part by part (in name order); torn or foreign lines are skipped."""
    for part in store.list_files(job_fetch_log_location(job_id)):
        if not part.endswith(".jsonl"):
            continue
        for raw in store.read_bytes(part).splitlines():
            try:
                yield LoggedUrl.from_json(json.loads(raw))
            except (ValueError, TypeError):
                continue


def latest_by_url(lines: Iterable[LoggedUrl], cycle: int | None = None) -> list[LoggedUrl]:
    """One line per URL, sorted by URL: the latest (by release time) of ``cycle``, when given.

    Across cycles, a URL whose last visit found it unchanged is its last stored version: the
    page as it is now, stored in the cycle that last changed it.
    """
    latest: dict[str, LoggedUrl] = {}
    stored: dict[str, LoggedUrl] = {}
    for line in lines:
        if cycle is not None and line.cycle != cycle:
            continue
        known = latest.get(line.url)
        if known is None or line.at >= known.at:
            latest[line.url] = line
        if line.stored and (line.url not in stored or line.at >= stored[line.url].at):
            stored[line.url] = line
    if cycle is None:
        for url, line in latest.items():
            if line.outcome == "unchanged" and url in stored:
                latest[url] = stored[url]
    return [latest[url] for url in sorted(latest)]
