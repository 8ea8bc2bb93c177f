"""The ``links`` analyzer: every link a page makes, absolute, in document order."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any
from urllib.parse import urljoin, urlsplit

import lxml.html

from analyzers.page import NON_NAVIGABLE_SCHEMES, Page
from vcrawl.payloads import FieldRule

__all__ = ["LINK_ATTRIBUTES", "analyze"]

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
    for element in page.tree.iter(*LINK_ATTRIBUTES):
        attr = LINK_ATTRIBUTES[element.tag]
        value = element.get(attr)
        if value is None:
            continue
        url, reason = _absolute(base, value)
        if url is None:
            logger.debug("%s: skip <%s %s=%.200r>: %s", page.url, element.tag, attr, value, reason)
            skipped += 1
            by_reason = skipped_by.setdefault(element.tag, {})
            kind = reason.split(":", 1)[0] if reason in ("empty",) or reason.startswith("malformed") else "scheme"
            by_reason[kind] = by_reason.get(kind, 0) + 1
            continue
        text = _link_text(element)
        if (url, text, element.tag) in seen:
            continue
        seen.add((url, text, element.tag))
        links.append({"url": url, "text": text, "tag": element.tag, "attr": attr, "rel": _rel(element)})
    return {"url": page.url, "links": links, "count": len(links), "skipped": skipped, "skipped_by": skipped_by}


def _absolute(base: str, value: str) -> tuple[str | None, str]:
    """Return (absolute URL, "") or (None, why it is skipped)."""
    value = value.strip()
    if not value:
        return None, "empty"
    try:
        url = urljoin(base, value)
        scheme = urlsplit(url).scheme.lower()
    except ValueError as exc:  # e.g. an unbalanced "[" in the host
        return None, f"malformed: {exc}"
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
