"""The ``links`` analyzer: every link a page makes, absolute, in document order.

Links are read from the parser's events as it goes (``Page.stream``), not from a tree: a tree of a
page of 300,000 anchors takes hundreds of MB. What is read is what the tree would hold (up to
libxml2's depth limit, and no further than the end of the root element), with the same texts.
Only the first ``page.max_links`` links are read; the others are counted (``truncated``), so what a
page costs grows with the links kept, not with the links it has.
"""

from __future__ import annotations

import html.parser
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from analyzers.encoding import percent_encode_query
from analyzers.page import NON_NAVIGABLE_SCHEMES, TREE_DEPTH_LIMIT, Page, resolve_base
from vcrawl import whatwg_urls
from vcrawl.payloads import FieldRule

__all__ = ["FOLLOWED_TAGS", "LINK_ATTRIBUTES", "TEXT_LIMIT", "TRUNCATED", "analyze", "followed_links"]

logger = logging.getLogger(__name__)

# Which attribute of which element is a link. srcset, ping, object[data], meta refresh and CSS url()
# are deliberately left out: they are lists, tracking or not HTML attributes holding one URL.
LINK_ATTRIBUTES: Mapping[str, str] = MappingProxyType(
    {
        "a": "href",
        "area": "href",
        "link": "href",
        "img": "src",
        "script": "src",
        "iframe": "src",
        "frame": "src",
        "source": "src",
        "embed": "src",
        "video": "src",
        "audio": "src",
        "track": "src",
        "form": "action",
    }
)


TRUNCATED = "truncated"
"""Links past a page's ``max_links``, counted and not read: a key of ``analyze``'s result, a reason
of ``followed_links``' skipped links."""


def analyze(page: Page, rules: Mapping[str, FieldRule] | None = None) -> dict[str, Any]:
    """Return ``{"url", "links": [{"url", "text", "tag", "attr", "rel"}], "count", "skipped", "skipped_by"}``,
    and ``"truncated": n`` when the page has ``n`` links past its first ``page.max_links``.

    Links are made absolute against the page's first ``<base href>`` (else its URL) as a browser
    makes them (the WHATWG URL Standard; an empty value is the base itself); fragments are kept.
    ``javascript:``/``vbscript:``/``data:``/``mailto:``/``tel:`` values and values the Standard
    refuses are counted in ``skipped``, and per tag and reason (``scheme``, ``malformed``) in
    ``skipped_by`` as ``{"a": {"scheme": 2}}``. A repeat of an already listed (url, text, tag) is
    dropped, not counted. A link's text is cut at ``TEXT_LIMIT`` characters. The links past the first
    ``page.max_links`` (repeats and skipped ones count) are not read, only counted. ``rules`` is ignored.
    """
    base, candidates, truncated = _candidates(page, LINK_ATTRIBUTES, texts=True)
    links: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str]] = set()
    skipped = 0
    skipped_by: dict[str, dict[str, int]] = {}
    resolver = whatwg_urls.Resolver(base)
    for tag, attr, value, text, rel in candidates:
        url, reason = _absolute(resolver, value, page.encoding)
        if url is None:
            logger.debug("%s: skip <%s %s=%.200r>: %s", page.url, tag, attr, value, reason)
            skipped += 1
            by_reason = skipped_by.setdefault(tag, {})
            kind = _skip_kind(reason)
            by_reason[kind] = by_reason.get(kind, 0) + 1
            continue
        if (url, text, tag) in seen:
            continue
        seen.add((url, text, tag))
        links.append({"url": url, "text": text, "tag": tag, "attr": attr, "rel": rel})
    result = {"url": page.url, "links": links, "count": len(links), "skipped": skipped, "skipped_by": skipped_by}
    if truncated:
        result[TRUNCATED] = truncated
    return result


# The elements whose targets a crawl follows: navigation, not embedded resources.
FOLLOWED_TAGS = ("a", "area", "frame", "iframe")
_FOLLOWED_ATTRIBUTES: Mapping[str, str] = MappingProxyType({tag: LINK_ATTRIBUTES[tag] for tag in FOLLOWED_TAGS})


def followed_links(page: Page) -> tuple[list[str], dict[str, int]]:
    """The crawl's view of ``page``: the absolute targets of its ``FOLLOWED_TAGS`` in document
    order, each once; and the skipped ones counted by reason (``scheme``, ``malformed``,
    and ``TRUNCATED``: past the first ``page.max_links`` of these tags, not read).

    Same rules as ``analyze``, but without link texts, which a crawl does not need and which
    cost a text walk per link.
    """
    base, candidates, truncated = _candidates(page, _FOLLOWED_ATTRIBUTES, texts=False)
    times: dict[str, int] = {}  # a page links its home and menus many times over: resolve each value once
    for _, _, value, _, _ in candidates:
        times[value] = times.get(value, 0) + 1
    urls: dict[str, None] = {}
    skipped: dict[str, int] = {}
    resolver = whatwg_urls.Resolver(base)
    for value, count in times.items():
        url, reason = _absolute(resolver, value, page.encoding)
        if url is None:
            kind = _skip_kind(reason)
            skipped[kind] = skipped.get(kind, 0) + count
        else:
            urls[url] = None
    if truncated:
        skipped[TRUNCATED] = truncated
    return list(urls), skipped


TEXT_LIMIT = 1000
"""The characters of a link's text kept (after whitespace is collapsed): an <a> left open wraps the
rest of its page, and nested ones would each hold all of it."""

_Candidate = tuple[str, str, str, str, "str | None"]  # tag, attribute, value, text, rel


def _candidates(page: Page, attributes: Mapping[str, str], texts: bool) -> tuple[str, list[_Candidate], int]:
    """The base URL of ``page``, its first ``page.max_links`` links of ``attributes``' tags in
    document order and how many more it has, read from the parser's events without a tree; with
    ``texts``, each link's text, else ``""``."""
    if not texts and len(page.text) <= TREE_MOST and not page.truncated:
        return _from_tree(page, attributes)
    target = _TextTarget(attributes, page.max_links) if texts else _LinkTarget(attributes, page.max_links)
    try:
        page.stream(target)
    except _RootEnded:
        pass
    except _TooDeep:
        # A tree would end here, where libxml2 stops for good; a tokenizer still sees every tag.
        logger.debug("%s: nested deeper than %d elements, reading its links tag by tag", page.url, TREE_DEPTH_LIMIT)
        found, truncated = _streamed(page.text, attributes, page.max_links)
        return _base(page, target), found, _logged(page, truncated)
    return _base(page, target), target.found, _logged(page, target.truncated)


TREE_MOST = 256 * 1024
"""Characters of a page whose links without texts are read from its tree: lxml finds them in C, in
half the time the parser's events take through Python. A bigger page is streamed (its tree would
take hundreds of MB for 300,000 anchors), as is one deeper than a tree holds."""


def _from_tree(page: Page, attributes: Mapping[str, str]) -> tuple[str, list[_Candidate], int]:
    """``_candidates`` without texts, read from ``page.tree``: what the stream reads, by its own definition."""
    found: list[_Candidate] = []
    truncated = 0
    for element in page.tree.iter(*attributes):
        attr = attributes[element.tag]
        if (value := element.get(attr)) is None:
            continue
        if len(found) < page.max_links:
            found.append((element.tag, attr, value, "", None))
        else:
            truncated += 1
    base_href = next((href for base in page.tree.iter("base") if (href := base.get("href")) is not None), None)
    base = page.url if base_href is None else resolve_base(page.url, _in_query(base_href, page.encoding))
    return base, found, _logged(page, truncated)


def _logged(page: Page, truncated: int) -> int:
    if truncated:
        logger.debug("%s: %d links past the first %d counted, not read", page.url, truncated, page.max_links)
    return truncated


def _base(page: Page, target: _LinkTarget) -> str:
    return page.url if target.base_href is None else resolve_base(page.url, _in_query(target.base_href, page.encoding))


class _TooDeep(Exception):
    """The page nests elements deeper than a tree holds (``TREE_DEPTH_LIMIT``)."""


class _RootEnded(Exception):
    """The root element ended: what follows (markup after ``</html>``) becomes a second root in
    libxml2's tree, outside the element ``Page.tree`` returns, so the tree's readers never saw it."""


class _LinkTarget:
    """An lxml parser target: the first ``cap`` links of ``attributes``' tags in document order (and
    a count of the rest), and the page's first ``<base href>``, up to where a tree of the page would end."""

    def __init__(self, attributes: Mapping[str, str], cap: int) -> None:
        self.found: list[_Candidate] = []
        self.truncated = 0  # links past the cap
        self.base_href: str | None = None
        self._attributes, self._cap = attributes, cap
        self._depth = 0  # open elements
        self._rooted = False  # the root element has started

    def start(self, tag: str, attrib: Mapping[str, str]) -> None:
        if self._depth == 0 and self._rooted:
            raise _RootEnded
        self._rooted = True
        self._depth += 1
        if self._depth > TREE_DEPTH_LIMIT:
            raise _TooDeep
        if tag == "base" and self.base_href is None:
            self.base_href = attrib.get("href")
        attr = self._attributes.get(tag)
        if attr is not None and (value := attrib.get(attr)) is not None:
            if len(self.found) < self._cap:
                self._keep(tag, attr, value, attrib)
            else:
                self.truncated += 1

    def end(self, tag: str) -> None:
        self._depth -= 1

    def close(self) -> None:
        """Nothing to return: the links are in ``found``."""

    def _keep(self, tag: str, attr: str, value: str, attrib: Mapping[str, str]) -> None:
        self.found.append((tag, attr, value, "", None))


class _TextTarget(_LinkTarget):
    """A ``_LinkTarget`` that also reads each link's text: an <a>'s text up to its end or the next <a>
    (as ``_LinkCollector`` reads it), else the alt of the first image there with one; else its alt or title."""

    def __init__(self, attributes: Mapping[str, str], cap: int) -> None:
        super().__init__(attributes, cap)
        self._anchors: list[_Anchor | None] = []  # the open <a> elements, innermost last; None: not a link
        self._reading: list[_Anchor] = []  # the open links whose text is still short of TEXT_LIMIT
        self._wanting_alt: list[_Anchor] = []  # the open links that have seen no image with an alt yet

    def start(self, tag: str, attrib: Mapping[str, str]) -> None:
        listed = len(self.found)
        super().start(tag, attrib)
        if tag == "img" and self._wanting_alt and (alt := _normalize(attrib.get("alt"))):
            for anchor in self._wanting_alt:
                anchor.alt = _cut(alt)
            self._wanting_alt.clear()
        if tag == "a":
            # A new <a> ends the text of the open ones, as a browser's parser closes them (HTML's adoption
            # agency); libxml2 nests them instead, and each text event would be read by all of them.
            self._reading.clear()
            self._wanting_alt.clear()
            anchor = _Anchor(listed) if len(self.found) > listed else None
            self._anchors.append(anchor)
            if anchor is not None:
                self._reading.append(anchor)
                self._wanting_alt.append(anchor)

    def end(self, tag: str) -> None:
        super().end(tag)
        if tag == "a" and self._anchors and (anchor := self._anchors.pop()) is not None:
            # Elements end innermost first: an open link still in these lists is the last one.
            if self._reading and self._reading[-1] is anchor:
                self._reading.pop()
            if self._wanting_alt and self._wanting_alt[-1] is anchor:
                self._wanting_alt.pop()
            tag, attr, value, fallback, rel = self.found[anchor.index]
            self.found[anchor.index] = (tag, attr, value, anchor.text() or anchor.alt or fallback, rel)

    def close(self) -> None:
        """Finish the links still open where the parse stopped."""
        while self._anchors:
            self.end("a")

    def data(self, data: str) -> None:
        full = False
        for anchor in self._reading:
            full |= anchor.add(data)
        if full:
            self._reading = [anchor for anchor in self._reading if not anchor.full]

    def _keep(self, tag: str, attr: str, value: str, attrib: Mapping[str, str]) -> None:
        fallback = _normalize(attrib.get("alt")) or _normalize(attrib.get("title"))
        self.found.append((tag, attr, value, _cut(fallback), _normalize(attrib.get("rel")).lower() or None))


class _Anchor:
    """An <a>'s text as read so far, kept short: past twice ``TEXT_LIMIT`` characters it is
    normalized, and reading stops once that reaches ``TEXT_LIMIT``."""

    __slots__ = ("alt", "full", "index", "parts", "size")

    def __init__(self, index: int) -> None:
        self.index = index  # where its link is in the found list
        self.parts: list[str] = []
        self.size = 0
        self.alt = ""  # the alt of the first image in it that has one
        self.full = False

    def add(self, data: str) -> bool:
        """Read ``data``; return True once the text is full."""
        self.parts.append(data)
        self.size += len(data)
        if self.size >= 2 * TEXT_LIMIT:
            joined = "".join(self.parts)
            text = _normalize(joined)
            self.full = len(text) >= TEXT_LIMIT
            # Normalizing a prefix gives a prefix of the normalized whole; a trailing space still parts words.
            text = text[:TEXT_LIMIT] if self.full else text + " " if joined[-1].isspace() else text
            self.parts, self.size = [text], len(text)
        return self.full

    def text(self) -> str:
        """The normalized text, at most ``TEXT_LIMIT`` characters."""
        return _cut(_normalize("".join(self.parts)))


def _streamed(text: str, attributes: Mapping[str, str], cap: int) -> tuple[list[_Candidate], int]:
    """The first ``cap`` links of ``text`` and how many more it has, read tag by tag, without
    building a tree (so without a depth limit)."""
    collector = _LinkCollector(attributes, cap)
    collector.feed(text)
    collector.close()
    collector.finish_anchor()
    return collector.found, collector.truncated


class _LinkCollector(html.parser.HTMLParser):
    """Collects link attributes in document order; an <a>'s text runs to its end tag or the next <a>."""

    def __init__(self, attributes: Mapping[str, str], cap: int) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[_Candidate] = []
        self.truncated = 0  # links past the cap
        self._attributes, self._cap = attributes, cap
        self._anchor: _Anchor | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.finish_anchor()
        attr = self._attributes.get(tag)
        values = dict(attrs)
        if tag == "img" and self._anchor is not None and not self._anchor.alt:
            self._anchor.alt = _cut(_normalize(values.get("alt")))
        if attr is None or values.get(attr) is None:
            return
        if len(self.found) >= self._cap:
            self.truncated += 1
            return
        fallback = _normalize(values.get("alt")) or _normalize(values.get("title"))
        rel = _normalize(values.get("rel")).lower() or None
        self.found.append((tag, attr, values[attr] or "", _cut(fallback), rel))
        if tag == "a":
            self._anchor = _Anchor(len(self.found) - 1)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self.finish_anchor()

    def handle_data(self, data: str) -> None:
        if self._anchor is not None and not self._anchor.full:
            self._anchor.add(data)

    def finish_anchor(self) -> None:
        if self._anchor is None:
            return
        anchor, self._anchor = self._anchor, None
        tag, attr, value, fallback, rel = self.found[anchor.index]
        self.found[anchor.index] = (tag, attr, value, anchor.text() or anchor.alt or fallback, rel)


def _skip_kind(reason: str) -> str:
    """The counted kind of a skip reason from ``_absolute``: ``malformed`` or ``scheme``."""
    return "malformed" if reason.startswith("malformed") else "scheme"


def _absolute(resolver: whatwg_urls.Resolver, value: str, encoding: str = "UTF-8") -> tuple[str | None, str]:
    """Return (absolute URL, "") or (None, why it is skipped): ``value`` resolved by the page's ``resolver``
    as the WHATWG URL Standard resolves it (as a browser does), its query written in the page's
    ``encoding``. An empty ``value`` is the base itself, as a browser's link to its own page is."""
    value = _in_query(value, encoding)
    try:
        url = resolver(value)
    except ValueError:
        return None, f"malformed: {value[:100]!r}"
    scheme = url[: url.index(":")]  # the serialiser lowercased it
    if scheme in NON_NAVIGABLE_SCHEMES:
        return None, f"{scheme}: URL"
    return url, ""


_C0_OR_SPACE = "".join(map(chr, range(0x21)))
_TAB_OR_NEWLINE = str.maketrans("", "", "\t\n\r")


def _in_query(value: str, encoding: str) -> str:
    """``value`` with its query's non-ASCII characters percent-encoded in the page's ``encoding``,
    as a browser's URL parser writes a link of a page in that encoding (the path is UTF-8 in both).

    >>> _in_query("/s?q=Привет#Привет", "windows-1251")
    '/s?q=%CF%F0%E8%E2%E5%F2#Привет'
    """
    if encoding == "UTF-8" or value.isascii():
        return value  # ada-url writes UTF-8 itself
    head, hash_mark, fragment = value.strip(_C0_OR_SPACE).translate(_TAB_OR_NEWLINE).partition("#")
    path, question_mark, query = head.partition("?")
    if not question_mark or query.isascii():
        return value
    return f"{path}?{percent_encode_query(query, encoding)}{hash_mark}{fragment}"


def _normalize(text: str | None) -> str:
    return " ".join(text.split()) if text else ""


def _cut(text: str) -> str:
    """A normalized text cut at ``TEXT_LIMIT`` characters, with no space left at the cut."""
    return text[:TEXT_LIMIT].rstrip(" ")
