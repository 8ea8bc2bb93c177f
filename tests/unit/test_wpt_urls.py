"""Links resolved as browsers resolve them: the WHATWG URL Standard's own test data (WPT).

Every case with an http(s) base and an http(s) result: the link resolver gives the Standard's
``href``, a page's ``<a href>`` the same, and the URL a crawl requests is that ``href`` less its
fragment and userinfo (neither is ever sent). Every case with an http(s) base that the Standard
refuses is a skipped link.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pytest

from analyzers import Page
from analyzers import links as link_analyzer
from frontier import canonical_url
from vcrawl.whatwg_urls import Resolver

_DATA = Path(__file__).parent.parent / "data" / "wpt-url" / "urltestdata.json"
_WEB = ("http", "https")


def _cases() -> list[dict[str, Any]]:
    return [case for case in json.loads(_DATA.read_text("utf-8")) if isinstance(case, dict)]


def _scheme(url: str | None) -> str:
    return (url or "").partition(":")[0]


RESOLVED = [
    c for c in _cases() if _scheme(c.get("base")) in _WEB and not c.get("failure") and _scheme(c["href"]) in _WEB
]
REFUSED = [c for c in _cases() if _scheme(c.get("base")) in _WEB and c.get("failure")]


def _id(case: dict[str, Any]) -> str:
    return ascii(case["input"])[1:-1][:60]


def _requested(case: dict[str, Any]) -> str:
    """What a browser sends for the case's href: no fragment, no userinfo (and a crawl, no dot
    ending the host: one host, one politeness key)."""
    host = case["hostname"].removesuffix(".")
    port = f":{case['port']}" if case["port"] else ""
    query = case["search"] or ("?" if "?" in case["href"].partition("#")[0] else "")
    return f"{case['protocol']}//{host}{port}{case['pathname']}{query}"


def test_the_data_holds_what_the_issue_names() -> None:
    assert len(RESOLVED) >= 100 and len(REFUSED) >= 40


@pytest.mark.parametrize("case", RESOLVED, ids=_id)
def test_a_link_resolves_to_the_standards_href(case: dict[str, Any]) -> None:
    assert link_analyzer._absolute(Resolver(case["base"]), case["input"]) == (case["href"], "")


@pytest.mark.parametrize("case", RESOLVED, ids=_id)
def test_the_crawl_requests_the_browsers_url(case: dict[str, Any]) -> None:
    if case["port"] == "0":
        # The Fetch Standard's first "bad port": a browser sends no request there, nor does a crawl.
        with pytest.raises(ValueError, match="port 0"):
            canonical_url(case["input"], base=case["base"], drop_params=frozenset())
        return
    assert canonical_url(case["input"], base=case["base"], drop_params=frozenset()) == _requested(case)


@pytest.mark.parametrize("case", REFUSED, ids=_id)
def test_a_link_the_standard_refuses_is_skipped(case: dict[str, Any]) -> None:
    url, reason = link_analyzer._absolute(Resolver(case["base"]), case["input"])
    assert url is None and reason.startswith("malformed")


def _carried_by_html(value: str) -> bool:
    # What an HTML attribute holds as written: the parser turns NUL into U+FFFD and CR LF into LF
    # (which the URL parser strips anyway), and libxml2 drops other C0 controls.
    return not any(ord(char) < 0x20 and char not in "\t\n" for char in value) and "\x7f" not in value


@pytest.mark.parametrize("case", [c for c in RESOLVED if _carried_by_html(c["input"])], ids=_id)
def test_a_pages_link_is_the_standards_href(case: dict[str, Any]) -> None:
    base, href = html.escape(case["base"]), html.escape(case["input"])
    body = f'<html><head><base href="{base}"></head><body><a href="{href}">x</a>'
    page = Page(url="http://vcrawl.test/page", body=body.encode("utf-8"), content_type="text/html; charset=utf-8")
    result = link_analyzer.analyze(page)
    assert [link["url"] for link in result["links"]] == [case["href"]]
    assert link_analyzer.followed_links(page)[0] == [case["href"]]
