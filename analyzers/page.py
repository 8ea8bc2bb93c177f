"""A fetched page, decoded and parsed once however many analyzers look at it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import ada_url
import lxml.html
from lxml import etree

from analyzers.sniffing import decode_html
from vcrawl.payloads import MAX_LINKS_PER_PAGE

__all__ = ["NON_NAVIGABLE_SCHEMES", "TREE_DEPTH_LIMIT", "Page", "is_html", "resolve_base"]

logger = logging.getLogger(__name__)

# Schemes that name no fetchable document: never a link, never a <base>.
NON_NAVIGABLE_SCHEMES = frozenset({"javascript", "vbscript", "data", "mailto", "tel"})
_EMPTY_DOCUMENT = b"<html><body></body></html>"
# How deep libxml2 nests elements into a tree with huge_tree (256 without): an element deeper than this
# stops the parse for good (``Page.truncated``). A parser target sees every element however deep, so
# whoever streams a page counts depth itself to know what a tree would hold.
TREE_DEPTH_LIMIT = 2048
_STREAM_CHUNK = 64 * 1024  # characters encoded and fed to the parser at a time


@dataclass(frozen=True, slots=True)
class Page:
    """A page body with its URL and Content-Type header; `text` and `tree` are computed once.

    ``max_links`` is how many links of the page its link readers (``analyzers.links``) read; they
    count the rest.
    """

    url: str
    body: bytes
    content_type: str | None = None
    max_links: int = MAX_LINKS_PER_PAGE
    _decoded: tuple[str, str] | None = field(default=None, init=False, repr=False, compare=False)
    _parsed: tuple[lxml.html.HtmlElement, bool] | None = field(default=None, init=False, repr=False, compare=False)
    _base: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.body, bytes):
            raise ValueError(f"Page.body must be bytes, got {type(self.body).__name__}")
        if self.max_links < 1:
            raise ValueError(f"Page.max_links must be at least 1, got {self.max_links}")

    @property
    def encoding(self) -> str:
        """Return the WHATWG name of the encoding the body was decoded with (``UTF-8``, ``windows-1252``, ...)."""
        return self._decode()[0]

    @property
    def text(self) -> str:
        """Return the body decoded as a browser decodes it (``analyzers.sniffing``); bad bytes become U+FFFD."""
        return self._decode()[1]

    @property
    def tree(self) -> lxml.html.HtmlElement:
        """Return the root <html> element; an empty or unparsable body gives an empty document."""
        return self._parse()[0]

    @property
    def truncated(self) -> bool:
        """Return True if the parser stopped early (a libxml2 limit such as nesting depth)."""
        return self._parse()[1]

    def stream(self, target: Any) -> Any:
        """Parse the text as ``tree`` does, into an lxml parser ``target`` (its ``start``, ``end``,
        ``data``, ``close`` methods), building no tree; return what ``target.close()`` returns.

        The text is encoded and fed in chunks, so no UTF-8 copy of the whole page is made.
        Whatever the target raises stops the parse and is raised here.
        """
        parser = lxml.html.HTMLParser(encoding="utf-8", huge_tree=True, no_network=True, target=target)
        text = self.text
        for start in range(0, len(text), _STREAM_CHUNK):
            parser.feed(text[start : start + _STREAM_CHUNK].encode("utf-8", "replace"))
        return parser.close() if text else target.close()

    @property
    def base_url(self) -> str:
        """Return the first usable <base href> resolved against `url`, else `url`."""
        if self._base is None:
            object.__setattr__(self, "_base", _base_url(self.url, self.tree))
        assert self._base is not None
        return self._base

    def _decode(self) -> tuple[str, str]:
        # Frozen: the cache is filled with object.__setattr__. Two threads racing here compute equal
        # values and the last write wins, so no lock is needed.
        if self._decoded is None:
            object.__setattr__(self, "_decoded", decode_html(self.body, self.content_type, self.url))
        assert self._decoded is not None
        return self._decoded

    def _parse(self) -> tuple[lxml.html.HtmlElement, bool]:
        if self._parsed is None:
            object.__setattr__(self, "_parsed", _parse(self.url, self.text))
        assert self._parsed is not None
        return self._parsed


def is_html(content_type: str | None) -> bool:
    """True for a page whose links are worth reading: HTML, XHTML, text or another XML type.

    >>> is_html("text/html; charset=utf-8"), is_html(None), is_html("image/png")
    (True, True, False)
    """
    if content_type is None:
        return True  # no header: sniffing would be guessing; lxml copes with anything
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind in ("text/html", "application/xhtml+xml", "text/plain", "") or kind.endswith("+xml")


def _parse(url: str, text: str) -> tuple[lxml.html.HtmlElement, bool]:
    """Return (root, truncated) for `text`; never raises on web content."""
    # lxml refuses str input that carries an XML encoding declaration, so parse UTF-8 bytes with the
    # encoding stated. huge_tree raises libxml2's depth limit from 256 to 2048: unclosed inline tags
    # (<font>, <b>) on old pages nest that deep, and parsing stops for good at the limit.
    parser = lxml.html.HTMLParser(encoding="utf-8", huge_tree=True, no_network=True)
    data = text.encode("utf-8", "replace")
    root = etree.fromstring(data, parser) if data.strip() else None
    truncated = any(entry.type_name == "ERR_RESOURCE_LIMIT" for entry in parser.error_log)
    if truncated:
        logger.debug("%s: parsing stopped early: %s", url, parser.error_log.last_error)
    if root is None:  # empty, whitespace or comment-only body
        root = etree.fromstring(_EMPTY_DOCUMENT, parser)
    return root, truncated


def _base_url(url: str, tree: lxml.html.HtmlElement) -> str:
    for element in tree.iter("base"):
        href = element.get("href")
        if href is not None:  # HTML spec: only the first <base> with an href counts, even when it is unusable
            return resolve_base(url, href)
    return url


def resolve_base(url: str, href: str) -> str:
    """The base URL that a page at ``url`` gets from its first ``<base href>``: ``url`` if unusable.

    >>> resolve_base("http://h.test/a/b", " ../c/ "), resolve_base("http://h.test/a/b", "javascript:x")
    ('http://h.test/c/', 'http://h.test/a/b')
    """
    try:
        base = ada_url.join_url(url, href)  # as a browser resolves it (WHATWG URL Standard)
    except ValueError:
        logger.debug("%s: ignoring malformed <base href=%r>", url, href)
        return url
    if base[: base.index(":")] in NON_NAVIGABLE_SCHEMES:
        logger.debug("%s: ignoring <base href=%r>", url, href)
        return url
    return base
