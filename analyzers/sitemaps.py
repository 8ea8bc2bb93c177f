"""Sitemaps (sitemaps.org 0.9) read safely: XML url sets and indexes, gzip, plain text.

``parse_sitemap`` never trusts the file: gzip is inflated in bounded steps (a bomb stops at
``MAX_SITEMAP_BYTES``), XML is read as a stream by lxml with entity resolution, DTD loading and
network access off (no XXE, no entity expansion), at most ``MAX_SITEMAP_URLS`` entries are kept,
and whatever goes wrong is a ``problem`` named by a short reason, with the entries read before it.
"""

from __future__ import annotations

import io
import math
import zlib
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from urllib.parse import urlsplit

from lxml import etree

__all__ = ["CHANGEFREQS", "MAX_SITEMAP_BYTES", "MAX_SITEMAP_URLS", "Sitemap", "SitemapUrl", "parse_sitemap"]

MAX_SITEMAP_BYTES = 50 * 1024 * 1024
"""The protocol's cap on one sitemap file, uncompressed (50 MB)."""
MAX_SITEMAP_URLS = 50_000
"""The protocol's cap on the entries of one sitemap file."""
CHANGEFREQS = ("always", "hourly", "daily", "weekly", "monthly", "yearly", "never")

_GZIP_MAGIC = b"\x1f\x8b"
_INFLATE_STEP = 1024 * 1024
_BYTE_ORDER_MARK = b"\xef\xbb\xbf"
_MAX_URL_CHARS = 2048  # the protocol's limit on a <loc>


@dataclass(frozen=True)
class SitemapUrl:
    """One entry: a page (url set) or a sitemap (index). Hints are kept as the file gives them."""

    url: str
    lastmod_s: float | None = None  # epoch seconds; None: absent or not a W3C datetime
    priority: float | None = None  # 0.0 .. 1.0; None: absent or out of range
    changefreq: str | None = None  # one of CHANGEFREQS; None: absent or unknown


@dataclass(frozen=True)
class Sitemap:
    """What a sitemap file held: ``kind`` is ``urlset``, ``index`` or ``text`` ("" when unreadable)."""

    kind: str = ""
    urls: tuple[SitemapUrl, ...] = ()
    problem: str | None = None  # too_large, too_many_urls, malformed, not_a_sitemap, bad_gzip, empty
    skipped: int = 0  # entries without a usable http(s) <loc>


def parse_sitemap(body: bytes, max_bytes: int = MAX_SITEMAP_BYTES, max_urls: int = MAX_SITEMAP_URLS) -> Sitemap:
    """Read a sitemap file (gzip or not; XML or plain text)."""
    data, cut = _inflate(body, max_bytes) if body[:2] == _GZIP_MAGIC else (body, None)
    if len(data) > max_bytes:
        data, cut = data[:max_bytes], "too_large"
    if not data.strip():
        return Sitemap(problem=cut or "empty")
    head = data.lstrip(_BYTE_ORDER_MARK).lstrip()
    sitemap = _parse_xml(data, max_urls) if head.startswith(b"<") else _parse_text(data, max_urls)
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


def _parse_xml(data: bytes, max_urls: int) -> Sitemap:
    urls: list[SitemapUrl] = []
    skipped, kind, problem = 0, "", None
    # No entity is resolved, no DTD loaded, nothing fetched: an XXE or a billion laughs stays text.
    events = etree.iterparse(
        io.BytesIO(data),
        events=("start", "end"),
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
    )
    try:
        for event, element in events:
            name = etree.QName(element).localname if isinstance(element.tag, str) else ""
            if event == "start":
                if not kind:
                    kind = {"urlset": "urlset", "sitemapindex": "index"}.get(name, "?")
                    if kind == "?":
                        return Sitemap(problem="not_a_sitemap")
                continue
            if name not in ("url", "sitemap"):
                continue
            entry = _entry(element)
            element.clear(keep_tail=False)
            if entry is None:
                skipped += 1
                continue
            if len(urls) >= max_urls:
                problem = "too_many_urls"
                break
            urls.append(entry)
    except etree.XMLSyntaxError:
        problem = "malformed"
    return Sitemap(kind if kind != "?" else "", tuple(urls), problem, skipped)


def _entry(element: etree._Element) -> SitemapUrl | None:
    values: dict[str, str] = {}
    for child in element:
        if isinstance(child.tag, str):
            values[etree.QName(child).localname] = (child.text or "").strip()
    url = values.get("loc", "")
    if not _usable(url):
        return None
    return SitemapUrl(url, _w3c_datetime(values.get("lastmod")), _priority(values.get("priority")),
                      _changefreq(values.get("changefreq")))  # fmt: skip


def _parse_text(data: bytes, max_urls: int) -> Sitemap:
    """A plain-text sitemap: one URL per line (UTF-8)."""
    urls: list[SitemapUrl] = []
    skipped, problem = 0, None
    for raw in data.decode("utf-8", errors="replace").splitlines():
        line = raw.strip().lstrip("\ufeff")
        if not line:
            continue
        if not _usable(line):
            skipped += 1
            continue
        if len(urls) >= max_urls:
            problem = "too_many_urls"
            break
        urls.append(SitemapUrl(line))
    if not urls and skipped:
        problem = "not_a_sitemap"
    return Sitemap("text", tuple(urls), problem, skipped)


def _usable(url: str) -> bool:
    if not url or len(url) > _MAX_URL_CHARS or any(ch.isspace() for ch in url):
        return False
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc)


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
