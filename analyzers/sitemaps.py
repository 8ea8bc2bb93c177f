"""Sitemaps read safely: sitemaps.org 0.9 url sets and indexes, RSS and Atom feeds, gzip, plain text.

``parse_sitemap`` never trusts the file: gzip is inflated in bounded steps (a bomb stops at
``MAX_SITEMAP_BYTES``), XML is read incrementally by lxml with entity resolution, DTD loading and
network access off (no XXE, no entity expansion), at most ``MAX_SITEMAP_URLS`` entries are kept,
and whatever goes wrong is a ``problem`` named by a short reason, with the entries read before it.

Feeds and sloppy files are read as crawler-commons' SiteMapParser reads them: an RSS ``<item>``'s
``<link>`` (else a URL ``<guid>``), an Atom ``<entry>``'s ``<link href>`` (one without ``rel`` or
``rel="alternate"`` first); byte-order marks and blank lines before ``<?xml`` are skipped; a file
that ends mid-document keeps every entry closed before the end (``truncated``).
"""

from __future__ import annotations

import email.utils
import math
import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from urllib.parse import urljoin, urlsplit

from lxml import etree

__all__ = ["CHANGEFREQS", "KINDS", "MAX_SITEMAP_BYTES", "MAX_SITEMAP_URLS", "Sitemap", "SitemapUrl", "parse_sitemap"]

MAX_SITEMAP_BYTES = 50 * 1024 * 1024
"""The protocol's cap on one sitemap file, uncompressed (50 MB)."""
MAX_SITEMAP_URLS = 50_000
"""The protocol's cap on the entries of one sitemap file."""
CHANGEFREQS = ("always", "hourly", "daily", "weekly", "monthly", "yearly", "never")
KINDS = ("urlset", "index", "rss", "atom", "text")
"""Values of ``Sitemap.kind`` for a file that was read."""

_GZIP_MAGIC = b"\x1f\x8b"
_INFLATE_STEP = 1024 * 1024
_FEED_STEP = 64 * 1024  # bytes handed to the XML parser at a time
# Byte-order marks and whitespace before the document: an XML declaration must be its first bytes, and
# sites (crawler-commons' SkipLeadingWhiteSpaceInputStream exists for them) emit blank lines before it.
_LEADING_NOISE = re.compile(rb"(?:\xef\xbb\xbf|[ \t\r\n])*")
_MAX_URL_CHARS = 2048  # the protocol's limit on a <loc>


@dataclass(frozen=True)
class SitemapUrl:
    """One entry: a page (url set, feed) or a sitemap (index). Hints are kept as the file gives them."""

    url: str
    lastmod_s: float | None = None  # epoch seconds; None: absent or not a W3C (RFC 822 in RSS) datetime
    priority: float | None = None  # 0.0 .. 1.0; None: absent or out of range
    changefreq: str | None = None  # one of CHANGEFREQS; None: absent or unknown


@dataclass(frozen=True)
class Sitemap:
    """What a sitemap file held: ``kind`` is one of ``KINDS`` ("" when unreadable)."""

    kind: str = ""
    urls: tuple[SitemapUrl, ...] = ()
    # too_large, too_many_urls, truncated, malformed, not_a_sitemap, bad_gzip, empty
    problem: str | None = None
    skipped: int = 0  # entries without a usable http(s) URL


def parse_sitemap(
    body: bytes,
    max_bytes: int = MAX_SITEMAP_BYTES,
    max_urls: int = MAX_SITEMAP_URLS,
    *,
    base_url: str | None = None,
) -> Sitemap:
    """Read a sitemap file (gzip or not; XML or plain text); ``base_url``, the file's own URL, resolves
    a feed's relative links."""
    data, cut = _inflate(body, max_bytes) if body[:2] == _GZIP_MAGIC else (body, None)
    if len(data) > max_bytes:
        data, cut = data[:max_bytes], "too_large"
    noise = _LEADING_NOISE.match(data)
    start = noise.end() if noise is not None else 0
    if not data[start:].strip():
        return Sitemap(problem=cut or "empty")
    if data.startswith(b"<", start):
        sitemap = _parse_xml(memoryview(data)[start:], max_urls, base_url)
    else:
        sitemap = _parse_text(data, max_urls)
    # A file cut short (too large, a broken gzip stream) keeps what was read; the cut is the reason.
    return replace(sitemap, problem=cut) if cut is not None else sitemap


def _inflate(body: bytes, max_bytes: int) -> tuple[bytes, str | None]:
    """Gunzip in steps of at most 1 MiB of output, stopping past ``max_bytes`` (a gzip bomb)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = bytearray()
    pending = body
    try:
        while pending and not inflater.eof:
            out += inflater.decompress(pending, _INFLATE_STEP)
            pending = inflater.unconsumed_tail
            if len(out) > max_bytes:
                return bytes(out[:max_bytes]), "too_large"
        if not inflater.eof:  # the stream ends before its end: cut short
            out += inflater.flush()
            return bytes(out), "bad_gzip"
    except zlib.error:
        return bytes(out), "bad_gzip"
    return bytes(out), None


def _parse_xml(data: memoryview, max_urls: int, base_url: str | None) -> Sitemap:
    """Read an XML file as it is fed to a pull parser, keeping each entry once its element closes.

    The parser is fed the file in steps and drained after each, so an error keeps what came before
    it: an error while feeding is ``malformed``; one at the end, with the root still open, means the
    file stops before its document does (``truncated``, as a cut download or a dead generator leaves it).
    """
    # No entity is resolved, no DTD loaded, nothing fetched: an XXE or a billion laughs stays text.
    # huge_tree=False keeps libxml2's bounds on depth and text size.
    parser = etree.XMLPullParser(events=("start", "end"), resolve_entities=False, no_network=True,
                                 load_dtd=False, huge_tree=False, remove_comments=True, remove_pis=True)  # fmt: skip
    reader = _EntryReader(max_urls, base_url)
    try:
        for offset in range(0, len(data), _FEED_STEP):
            parser.feed(bytes(data[offset : offset + _FEED_STEP]))
            if reader.take(parser.read_events()):
                return reader.sitemap()
    except etree.XMLSyntaxError:
        reader.take(parser.read_events())  # what was parsed before the error
        return replace(reader.sitemap(), problem=reader.problem or "malformed")
    try:
        parser.close()
    except etree.XMLSyntaxError:
        reader.take(parser.read_events())
        # The file ended before its root element did: cut short, not broken.
        return replace(reader.sitemap(), problem=reader.problem or ("malformed" if reader.root_closed else "truncated"))
    reader.take(parser.read_events())
    return reader.sitemap()


_ROOTS = {"urlset": ("urlset", "url"), "sitemapindex": ("index", "sitemap"), "rss": ("rss", "item"),
          "RDF": ("rss", "item"), "feed": ("atom", "entry")}  # fmt: skip
"""Root element -> (kind, entry element). RDF: RSS 1.0, whose items follow its channel."""


class _EntryReader:
    """Folds a pull parser's events into entries, freeing each element once read."""

    def __init__(self, max_urls: int, base_url: str | None) -> None:
        self.kind, self.problem, self.root_closed = "", None, False
        self.urls: list[SitemapUrl] = []
        self.skipped = 0
        self._entry_tag = ""
        self._inside = 0  # open entry elements: their children are read when the entry closes
        self._max_urls = max_urls
        self._base_url = base_url

    def take(self, events: Iterable[tuple[str, etree._Element]]) -> bool:
        """Read ``events``; True when the file is done with (not a sitemap, too many entries)."""
        for event, element in events:
            name = etree.QName(element).localname if isinstance(element.tag, str) else ""
            if not self.kind:  # the root: what kind of file this is
                self.kind, self._entry_tag = _ROOTS.get(name, ("?", ""))
                if self.kind == "?":
                    self.kind, self.problem = "", "not_a_sitemap"
                    return True
                continue
            if name == self._entry_tag:
                if event == "start":
                    self._inside += 1
                    continue
                self._inside -= 1
                if self._add(element):
                    return True
            elif event == "end" and element.getparent() is None:
                self.root_closed = True
                continue
            elif event == "start" or self._inside:
                continue
            _free(element)
        return False

    def _add(self, element: etree._Element) -> bool:
        entry = _READERS[self.kind](element, self._base_url)
        _free(element)
        if entry is None:
            self.skipped += 1
            return False
        if len(self.urls) >= self._max_urls:
            self.problem = "too_many_urls"
            return True
        self.urls.append(entry)
        return False

    def sitemap(self) -> Sitemap:
        """What was read so far."""
        return Sitemap(self.kind, tuple(self.urls), self.problem, self.skipped)


def _free(element: etree._Element) -> None:
    """Drop a read element and the siblings before it: memory stays bounded by one entry, not the file."""
    element.clear(keep_tail=False)
    while element.getprevious() is not None:
        del element.getparent()[0]


def _children(element: etree._Element) -> list[tuple[str, etree._Element]]:
    return [(etree.QName(child).localname, child) for child in element if isinstance(child.tag, str)]


def _text(element: etree._Element) -> str:
    return (element.text or "").strip()


def _sitemap_entry(element: etree._Element, base_url: str | None) -> SitemapUrl | None:
    """A sitemaps.org ``<url>`` or ``<sitemap>``: its ``<loc>`` must be absolute (the protocol says so)."""
    values = {name: _text(child) for name, child in _children(element)}
    url = _absolute(values.get("loc", ""))
    if url is None:
        return None
    return SitemapUrl(url, _w3c_datetime(values.get("lastmod")), _priority(values.get("priority")),
                      _changefreq(values.get("changefreq")))  # fmt: skip


def _rss_entry(element: etree._Element, base_url: str | None) -> SitemapUrl | None:
    """An RSS ``<item>``: its ``<link>`` (relative to the feed), else a ``<guid>`` that is a URL; dated by
    ``<pubDate>`` (RFC 822) or RSS 1.0's ``<dc:date>``."""
    children = _children(element)
    links = [_text(child) for name, child in children if name == "link" and _text(child)]
    url = _absolute(_resolved(links[0], base_url)) if links else None
    if url is None:
        guids = [_text(child) for name, child in children
                 if name == "guid" and child.get("isPermaLink", "true").strip().lower() != "false"]  # fmt: skip
        url = _absolute(guids[0]) if guids else None
    if url is None:
        return None
    dates = {name: _text(child) for name, child in children if name in ("pubDate", "date")}
    return SitemapUrl(url, _rfc822_datetime(dates.get("pubDate")) or _w3c_datetime(dates.get("date")))


def _atom_entry(element: etree._Element, base_url: str | None) -> SitemapUrl | None:
    """An Atom ``<entry>``: the ``href`` of its ``<link>`` without ``rel`` or ``rel="alternate"`` (the
    page itself), else its first ``<link>``; dated by ``<updated>`` (Atom 0.3: ``<modified>``)."""
    children = _children(element)
    links = [child for name, child in children if name == "link" and (child.get("href") or "").strip()]
    pages = [link for link in links if (link.get("rel") or "alternate").strip().lower() == "alternate"]
    chosen = (pages or links)[:1]
    url = _absolute(_resolved(chosen[0].get("href", "").strip(), base_url)) if chosen else None
    if url is None:
        return None
    dates = {name: _text(child) for name, child in children if name in ("updated", "modified", "published")}
    return SitemapUrl(url, next((_w3c_datetime(dates[name]) for name in ("updated", "modified", "published")
                                 if name in dates), None))  # fmt: skip


_READERS: dict[str, Callable[[etree._Element, str | None], SitemapUrl | None]] = {
    "urlset": _sitemap_entry, "index": _sitemap_entry, "rss": _rss_entry, "atom": _atom_entry}  # fmt: skip


def _parse_text(data: bytes, max_urls: int) -> Sitemap:
    """A plain-text sitemap: one URL per line (UTF-8)."""
    urls: list[SitemapUrl] = []
    skipped, problem = 0, None
    for raw in data.decode("utf-8", errors="replace").splitlines():
        line = raw.strip().lstrip("\ufeff")
        if not line:
            continue
        url = _absolute(line)
        if url is None:
            skipped += 1
            continue
        if len(urls) >= max_urls:
            problem = "too_many_urls"
            break
        urls.append(SitemapUrl(url))
    if not urls and skipped:
        problem = "not_a_sitemap"
    return Sitemap("text", tuple(urls), problem, skipped)


def _resolved(url: str, base_url: str | None) -> str:
    """A feed's link made absolute against the feed's URL, as crawler-commons' RSS reader does."""
    if base_url is None or not url:
        return url
    try:
        return urljoin(base_url, url)
    except ValueError:
        return url


def _absolute(url: str) -> str | None:
    """``url`` if it is an absolute http(s) URL, its scheme lower-cased (``HTTP://`` is ``http://``)."""
    if not url or len(url) > _MAX_URL_CHARS or any(ch.isspace() for ch in url):
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return parts.scheme + url[len(parts.scheme) :]


def _rfc822_datetime(value: str | None) -> float | None:
    """RSS dates: ``Tue, 03 Jun 2003 09:39:21 GMT`` (RFC 822, UTC when no zone is given)."""
    if not value:
        return None
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _w3c_datetime(value: str | None) -> float | None:
    """``YYYY``, ``YYYY-MM``, ``YYYY-MM-DD`` or a full ISO 8601 time (UTC when no zone is given)."""
    if not value:
        return None
    text = value.strip().replace("Z", "+00:00").replace("z", "+00:00")
    for pattern, size in (("%Y", 4), ("%Y-%m", 7)):
        if len(text) == size:
            try:
                return datetime.strptime(text, pattern).replace(tzinfo=UTC).timestamp()
            except ValueError:
                return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _priority(value: str | None) -> float | None:
    try:
        number = float(value) if value else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) and 0.0 <= number <= 1.0 else None


def _changefreq(value: str | None) -> str | None:
    text = (value or "").strip().lower()
    return text if text in CHANGEFREQS else None
