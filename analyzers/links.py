"""The ``links`` analyzer: every link a page makes, absolute, in document order."""

from __future__ import annotations

import html.parser
import logging
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any
from urllib.parse import urljoin

import lxml.html

from analyzers.page import NON_NAVIGABLE_SCHEMES, Page
from vcrawl.payloads import FieldRule

__all__ = ["FOLLOWED_TAGS", "LINK_ATTRIBUTES", "analyze", "followed_links"]

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


def analyze(page: Page, rules: Mapping[str, FieldRule] | None = None) -> dict[str, Any]:
    """Return ``{"url", "links": [{"url", "text", "tag", "attr", "rel"}], "count", "skipped", "skipped_by"}``.

    Links are made absolute against ``page.base_url``; fragments are kept. Empty values and
    ``javascript:``/``vbscript:``/``data:``/``mailto:``/``tel:`` values are counted in ``skipped``,
    and per tag and reason (``scheme``, ``empty``, ``malformed``) in ``skipped_by`` as
    ``{"a": {"scheme": 2}}``. A repeat of an already listed (url, text, tag) is dropped, not
    counted. ``rules`` is ignored.
    """
    base = page.base_url
    links: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str]] = set()
    skipped = 0
    skipped_by: dict[str, dict[str, int]] = {}
    # Past libxml2's depth limit the tree ends where parsing stopped; a tokenizer still sees every tag.
    candidates = _streamed(page.text) if page.truncated else _from_tree(page.tree)
    for tag, attr, value, text, rel in candidates:
        url, reason = _absolute(base, value)
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
    return {"url": page.url, "links": links, "count": len(links), "skipped": skipped, "skipped_by": skipped_by}


# The elements whose targets a crawl follows: navigation, not embedded resources.
FOLLOWED_TAGS = ("a", "area", "frame", "iframe")


def followed_links(page: Page) -> tuple[list[str], dict[str, int]]:
    """The crawl's view of ``page``: the absolute targets of its ``FOLLOWED_TAGS`` in document
    order, each once; and the skipped ones counted by reason (``scheme``, ``empty``, ``malformed``).

    Same rules as ``analyze``, but without link texts, which a crawl does not need and which
    cost a text walk per link.
    """
    base = page.base_url
    if page.truncated:
        values = [value for tag, _, value, _, _ in _streamed(page.text) if tag in FOLLOWED_TAGS]
    else:
        values = [v for element in page.tree.iter(*FOLLOWED_TAGS) if (v := element.get(LINK_ATTRIBUTES[element.tag]))
                  is not None]  # fmt: skip
    urls: dict[str, None] = {}
    skipped: dict[str, int] = {}
    for value, times in Counter(values).items():  # a page links its home and menus many times over
        url, reason = _absolute(base, value)
        if url is None:
            kind = _skip_kind(reason)
            skipped[kind] = skipped.get(kind, 0) + times
        else:
            urls[url] = None
    return list(urls), skipped


_Candidate = tuple[str, str, str, str, "str | None"]  # tag, attribute, value, text, rel


def _from_tree(tree: lxml.html.HtmlElement) -> Iterator[_Candidate]:
    for element in tree.iter(*LINK_ATTRIBUTES):
        attr = LINK_ATTRIBUTES[element.tag]
        value = element.get(attr)
        if value is not None:
            yield element.tag, attr, value, _link_text(element), _rel(element)


def _streamed(text: str) -> list[_Candidate]:
    """The links of ``text`` read tag by tag, without building a tree (so without a depth limit)."""
    collector = _LinkCollector()
    collector.feed(text)
    collector.close()
    collector.finish_anchor()
    return collector.found


class _LinkCollector(html.parser.HTMLParser):
    """Collects link attributes in document order; an <a>'s text runs to its end tag or the next <a>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[_Candidate] = []
        self._anchor: tuple[int, list[str], str] | None = None  # index in found, text parts, first img alt

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.finish_anchor()
        attr = LINK_ATTRIBUTES.get(tag)
        values = dict(attrs)
        if tag == "img" and self._anchor is not None and not self._anchor[2]:
            self._anchor = (self._anchor[0], self._anchor[1], _normalize(values.get("alt")))
        if attr is None or values.get(attr) is None:
            return
        fallback = _normalize(values.get("alt")) or _normalize(values.get("title"))
        self.found.append((tag, attr, values[attr] or "", fallback, _normalize(values.get("rel")).lower() or None))
        if tag == "a":
            self._anchor = (len(self.found) - 1, [], "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self.finish_anchor()

    def handle_data(self, data: str) -> None:
        if self._anchor is not None:
            self._anchor[1].append(data)

    def finish_anchor(self) -> None:
        if self._anchor is None:
            return
        index, parts, alt = self._anchor
        self._anchor = None
        tag, attr, value, fallback, rel = self.found[index]
        self.found[index] = (tag, attr, value, _normalize("".join(parts)) or alt or fallback, rel)


def _skip_kind(reason: str) -> str:
    """The counted kind of a skip reason from ``_absolute``: ``empty``, ``malformed`` or ``scheme``."""
    return "empty" if reason == "empty" else "malformed" if reason.startswith("malformed") else "scheme"


_SCHEME = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*):")
_TABS_AND_NEWLINES = str.maketrans("", "", "\t\r\n")


def _absolute(base: str, value: str) -> tuple[str | None, str]:
    """Return (absolute URL, "") or (None, why it is skipped)."""
    value = value.strip()
    if not value:
        return None, "empty"
    try:
        url = urljoin(base, value)  # parses both: raises on a malformed host
    except ValueError as exc:  # e.g. an unbalanced "[" in the host
        return None, f"malformed: {exc}"
    # What urlsplit would say (it drops tabs and newlines first), without splitting the URL again.
    head = url[:64].translate(_TABS_AND_NEWLINES)
    scheme = match.group(1).lower() if (match := _SCHEME.match(head)) else ""
    if scheme in NON_NAVIGABLE_SCHEMES:
        return None, f"{scheme}: URL"
    return url, ""


def _link_text(element: lxml.html.HtmlElement) -> str:
    """Return the anchor text, else an image's alt, else the title; "" if none."""
    if element.tag == "a":
        if text := _normalize(element.text_content()):
            return text
        for image in element.iter("img"):
            if alt := _normalize(image.get("alt")):
                return alt
    for attr in ("alt", "title"):
        if text := _normalize(element.get(attr)):
            return text
    return ""


def _rel(element: lxml.html.HtmlElement) -> str | None:
    # rel is a set of case-insensitive tokens (HTML spec), so "NoFollow  Ugc" becomes "nofollow ugc".
    return _normalize(element.get("rel")).lower() or None


def _normalize(text: str | None) -> str:
    return " ".join(text.split()) if text else ""
