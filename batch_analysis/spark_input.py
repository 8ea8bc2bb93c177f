"""What Spark's executors do with a stored crawl: plain functions over storage, no Spark in them.

The Spark engine (``batch_analysis.spark``) strings these together; each runs on an executor, on the
data a task was given, and reads storage itself (local disk, or WebHDFS), so nothing but the reduce's
result comes back to the driver:

* a fetch-log part becomes its lines, each keyed by URL with its place in the log (``log_entries``);
  ``later`` keeps, per URL, the last line and the last stored line, as ``latest_by_url`` does;
* a ``.cdxj`` index becomes the 200 responses it lists (``index_captures``); ``capture_of`` picks the
  one a stored line's page was archived in;
* one WARC file's wanted captures are read with warcio, in byte ranges of at most ``RANGE_BYTES``
  (``read_captures``); a page not in any WARC file is read from its page file (``read_page_file``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from io import BytesIO
from typing import Any

from warcio.archiveiterator import ArchiveIterator

from analyzers.batch import CrawledUrl
from batch_analysis.steps import crawled_url
from engine.fetch_log import LoggedUrl
from storage import BACKENDS, CdxEntry, Storage
from storage.webhdfs import webhdfs_factory
from vcrawl.errors import MissingPage
from vcrawl.settings import Settings

__all__ = [
    "RANGE_BYTES",
    "SPAN_BYTES",
    "Capture",
    "LogKey",
    "StorageRoot",
    "capture_of",
    "index_captures",
    "kept",
    "later",
    "log_entries",
    "read_captures",
    "read_page_file",
    "settle",
]

RANGE_BYTES = 64 * 1024 * 1024  # one read of a WARC file: its captures in a span this long at most
SPAN_BYTES = 4 * 1024 * 1024  # a task's share of a WARC file: the captures that start in it
LogKey = tuple[float, int, int]  # a line's release time, then its part's and its own place: later wins a tie
Capture = tuple[str, str, int, int]  # a 200 response's 14-digit timestamp, WARC file, offset and length


@dataclass(frozen=True)
class StorageRoot:
    """The data root and what reading it needs, shipped to every executor (no other setting, no secret).

    An executor does not see the driver's environment (a standalone or YARN cluster starts it elsewhere).
    """

    data: str
    hdfs_user: str | None = None
    hdfs_namenodes: tuple[str, ...] = ()
    hdfs_kerberos: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> StorageRoot:
        return cls(settings.data, settings.hdfs_user, tuple(settings.hdfs_namenodes), bool(settings.hdfs_kerberos))

    def open(self) -> Storage:
        """This process's router for the root (made once per executor process)."""
        return _open(self)


@functools.lru_cache(maxsize=4)
def _open(root: StorageRoot) -> Storage:
    settings = Settings(data=root.data, hdfs_user=root.hdfs_user, hdfs_namenodes=root.hdfs_namenodes,
                        hdfs_kerberos=root.hdfs_kerberos)  # fmt: skip
    return Storage(root.data, backends={**BACKENDS, "hdfs": webhdfs_factory(settings)})


def log_entries(root: StorageRoot, part_index: int, part: str) -> Iterator[tuple[str, tuple[LogKey, dict[str, Any]]]]:
    """The lines of one fetch-log part: (url, (its key, the line)); torn or foreign lines are skipped, as
    ``read_fetch_log`` skips them."""
    for number, raw in enumerate(root.open().read_bytes(part).splitlines()):
        try:
            line = LoggedUrl.from_json(json.loads(raw))
        except (ValueError, TypeError):
            continue
        yield line.url, ((line.at, part_index, number), line.to_json())


Kept = tuple[tuple[LogKey, dict[str, Any]], tuple[LogKey, dict[str, Any]] | None]  # (last line, last stored line)


def kept(entry: tuple[LogKey, dict[str, Any]]) -> Kept:
    """One line as what ``later`` folds."""
    return entry, (entry if entry[1].get("outcome") == "stored" else None)


def later(a: Kept, b: Kept) -> Kept:
    """Of two folds of a URL's lines: the later last line and the later last stored line."""
    stored = max((x for x in (a[1], b[1]) if x is not None), key=lambda x: x[0], default=None)
    return max(a[0], b[0], key=lambda x: x[0]), stored


def settle(fold: Kept, across_cycles: bool) -> dict[str, Any]:
    """A URL's line: its last; across cycles, a last visit that found it unchanged is its last stored
    version (``latest_by_url``'s rule)."""
    (_, last), stored = fold
    if across_cycles and last.get("outcome") == "unchanged" and stored is not None:
        return stored[1]
    return last


def index_captures(root: StorageRoot, index: str) -> Iterator[tuple[str, Capture]]:
    """The 200 responses a ``.cdxj`` index lists: (url, (timestamp, WARC file, offset, length))."""
    for raw in root.open().read_bytes(index).decode("utf-8").splitlines():
        entry = CdxEntry.from_line(raw)
        if entry.status == 200 and not entry.is_revisit:
            yield entry.url, (entry.timestamp, entry.warc, entry.offset, entry.length)


def capture_of(line: dict[str, Any], captures: Iterable[Capture]) -> Capture | None:
    """The capture a stored line's page was archived in: of the URL's captures, the one nearest its
    fetch time (its page file and its WARC record are written moments apart; a re-crawl's cycles are
    minutes apart at least); a tie goes to the later. None when the URL has none."""
    wanted = _seconds(str(line.get("fetched_at") or ""))
    return max(captures, key=lambda capture: (-abs(_seconds(capture[0]) - wanted), capture), default=None)


def _seconds(moment: str) -> float:
    """Seconds since 1970 of a 14-digit CDX timestamp or an ISO 8601 time (inf when there is none: the
    latest capture is then the nearest)."""
    digits = "".join(ch for ch in moment if ch.isdigit())[:14]
    if len(digits) < 14:
        return float("inf")
    return datetime.strptime(digits, "%Y%m%d%H%M%S").replace(tzinfo=UTC).timestamp()


def read_captures(
    root: StorageRoot, warc: str, wanted: Iterable[tuple[int, int, dict[str, Any]]]
) -> Iterator[CrawledUrl]:
    """The pages of one WARC file: ``wanted`` is (offset, length, fetch-log line) per capture. The file is
    read in spans of at most ``RANGE_BYTES``, each one ranged read, its records parsed by warcio.

    Raises:
        ValueError: a record is not where the index says (a stale index).
    """
    store = root.open()
    captures = sorted(wanted, key=lambda capture: capture[0])
    start = 0
    while start < len(captures):
        end = start + 1
        span_start = captures[start][0]
        while end < len(captures) and captures[end][0] + captures[end][1] - span_start <= RANGE_BYTES:
            end += 1
        span_end = max(offset + length for offset, length, _ in captures[start:end])
        data = store.read_bytes(warc, span_start, span_end - span_start)
        for offset, length, line in captures[start:end]:
            yield crawled_url(LoggedUrl.from_json(line), _payload(data, offset - span_start, length, warc, offset))
        start = end


def _payload(data: bytes, at: int, length: int, warc: str, offset: int) -> bytes:
    record = next(iter(ArchiveIterator(BytesIO(data[at : at + length]))), None)
    if record is None or record.rec_type != "response":
        raise ValueError(f"{warc} at {offset}+{length}: no response record")
    return bytes(record.content_stream().read())


def read_page_file(root: StorageRoot, line: dict[str, Any]) -> CrawledUrl:
    """A stored page that no WARC file holds, from its page file (None as its page if the file is gone)."""
    logged = LoggedUrl.from_json(line)
    try:
        body: bytes | None = root.open().read_bytes(logged.location)
    except MissingPage:
        body = None
    return crawled_url(logged, body)
