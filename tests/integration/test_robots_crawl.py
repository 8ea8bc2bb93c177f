"""robots.txt read as the reference parser (google/robotstxt) reads it, in real crawls of a loopback site."""

from __future__ import annotations

import html

import pytest

from tests.integration.conftest import run_job
from tests.site import NOT_PAGES, TestSite

pytestmark = pytest.mark.usefixtures("worker")

FAST = {"min_interval_s": 0.0}


def _page(*hrefs: str) -> str:
    anchors = "".join(f'<a href="{html.escape(href)}">link</a> ' for href in hrefs)
    return f"<html><body>{anchors}</body></html>"


def _requested(site: TestSite) -> set[str]:
    """The request targets the site saw, robots.txt aside, exactly as sent."""
    return {seen.path for seen in site.seen if seen.path not in NOT_PAGES}


def _crawl(site: TestSite, robots: str, links: dict[str, tuple[str, ...]]) -> dict[str, object]:
    site.add_page("/robots.txt", robots, Content_Type="text/plain")
    for path, hrefs in links.items():
        site.add_page(path, _page(*hrefs))
    status = run_job({"seeds": [site.url("/")], "politeness": FAST})
    assert status["state"] == "completed", status
    return status


def test_robots_group_named_with_words_after_the_token_applies_to_vcrawl(site: TestSite) -> None:
    # "VCRAWL bar" names the agent "vcrawl": the product token up to the space, in any case.
    robots = "User-agent: *\nDisallow: /\n\nUser-agent: VCRAWL bar\nDisallow: /secret.html\n"
    links = {"/": ("/open.html", "/secret.html"), "/open.html": (), "/secret.html": ()}

    status = _crawl(site, robots, links)

    assert _requested(site) == {"/", "/open.html"}
    assert status["robots_blocked"] == 1


def test_robots_line_that_is_no_rule_does_not_split_a_group(site: TestSite) -> None:
    # The unknown line between the two user-agent lines leaves them one group: vcrawl's rules
    # are the Disallow below "otherbot".
    robots = "User-agent: vcrawl\nNoindex: /nothing\nUser-agent: otherbot\nDisallow: /private/\n"
    links = {"/": ("/private/a.html", "/public.html"), "/private/a.html": (), "/public.html": ()}

    status = _crawl(site, robots, links)

    assert _requested(site) == {"/", "/public.html"}
    assert status["robots_blocked"] == 1


def test_robots_allowed_url_with_another_url_in_its_query_is_requested_as_linked(site: TestSite) -> None:
    # google/robotstxt ID_Encoding: this URL is allowed, and it must be asked for as the page wrote
    # it (a reordered query is another URL, which "Disallow: /" refuses).
    target = "/foo/bar?qux=taz&baz=http://foo.bar?tar&par"
    robots = f"User-agent: vcrawl\nDisallow: /\nAllow: /$\nAllow: {target}\n"
    links = {"/": (target, "/foo/bar?other=1"), target: ()}

    status = _crawl(site, robots, links)

    assert len(site.requests_to(target)) == 1
    assert _requested(site) == {"/", target}
    assert status["pages_stored"] == 2 and status["robots_blocked"] == 1
