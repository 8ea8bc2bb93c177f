"""A crawl of pages holding the WHATWG URL Standard's test links requests a browser's URLs, and no other.

The cases of WPT's urltestdata.json whose link resolves within its base's origin and names no
origin of its own (so that the loopback site can stand in for it): each base becomes a page of
the site with that base's path as its ``<base href>``, holding its cases' links. The crawl must
request exactly what a browser requests for each (the Standard's href, fragment dropped), as sent
on the request line, and nothing else.
"""

from __future__ import annotations

import html
import re
from collections import defaultdict
from typing import Any

import pytest

from tests.integration.conftest import run_job
from tests.site import NOT_PAGES, TestSite
from tests.unit.test_wpt_urls import RESOLVED, _carried_by_html

pytestmark = pytest.mark.usefixtures("worker")

_NAMES_AN_ORIGIN = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*:|[/\\]{2}")
_C0_OR_SPACE = "".join(map(chr, range(0x21)))


def _origin_of(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{re.split(r'[/?#]', rest, maxsplit=1)[0].rpartition('@')[2]}"


def _on_the_site(case: dict[str, Any]) -> bool:
    href = case["input"].strip(_C0_OR_SPACE).replace("\t", "").replace("\n", "")
    return (
        _carried_by_html(case["input"])
        and not _NAMES_AN_ORIGIN.match(href)
        and _origin_of(case["href"]) == _origin_of(case["base"])
        and case["base"].startswith("http://")
    )


def _target(url: str) -> str:
    """The request target a browser sends for ``url``: its path and query, as serialised."""
    rest = url.partition("#")[0].partition("://")[2]
    return rest[rest.index("/") :]


def test_a_crawl_requests_the_browsers_url_for_every_link(site: TestSite) -> None:
    by_base: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for case in filter(_on_the_site, RESOLVED):
        by_base[case["base"]].append(case)
    assert sum(map(len, by_base.values())) >= 40
    pages = []
    for index, (base, cases) in enumerate(sorted(by_base.items())):
        anchors = "".join(f'<a href="{html.escape(case["input"])}">{n}</a>\n' for n, case in enumerate(cases))
        site.add_page(f"/base{index}", f'<html><head><base href="{html.escape(_target(base))}"></head><body>{anchors}')
        pages.append(f"/base{index}")
    site.add_page("/", "".join(f'<a href="{page}">{page}</a>' for page in pages))
    expected = {"/", *pages} | {_target(case["href"]) for cases in by_base.values() for case in cases}

    status = run_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0}})

    assert status["state"] == "completed", status
    requested = {seen.path for seen in site.seen if seen.path not in NOT_PAGES}
    assert requested == expected
