"""Sitemaps shaped like the reference parsers' test cases (crawler-commons' SiteMapParser, Scrapy's
``scrapy.utils.sitemap``, ultimate-sitemap-parser), read in real crawls of loopback sites: RSS 2.0
and Atom feeds, a byte-order mark or blank lines before ``<?xml``, a robots.txt with a BOM, relative
or upper-case ``Sitemap:`` URLs, and a sitemap cut mid-document."""

from __future__ import annotations

import gzip

import pytest

from tests.integration.conftest import run_job
from tests.integration.test_sitemaps import FAST, fetched, orphan_pages, urlset
from tests.site import Response, TestSite

pytestmark = pytest.mark.usefixtures("worker")

BOM = b"\xef\xbb\xbf"


def serve_xml(site: TestSite, path: str, body: bytes) -> str:
    return site.add_response(path, Response(body, headers={"Content-Type": "application/xml"}))


def rss(urls: list[str]) -> bytes:
    items = "".join(f"<item><title>n{n}</title><link>{url}</link><pubDate>Tue, 03 Jun 2003 09:39:21 GMT</pubDate>"
                    f"<guid>urn:item:{n}</guid></item>" for n, url in enumerate(urls))  # fmt: skip
    return (f'<?xml version="1.0"?><rss version="2.0"><channel><title>News</title><link>http://example.invalid/</link>'
            f"<description>d</description>{items}</channel></rss>").encode()  # fmt: skip


def atom(urls: list[str]) -> bytes:
    entries = "".join(f'<entry><title>n{n}</title><link rel="edit" href="{url}?edit"/><link href="{url}"/>'
                      f"<id>urn:uuid:{n}</id><updated>2003-12-13T18:30:02Z</updated></entry>"
                      for n, url in enumerate(urls))  # fmt: skip
    return ('<?xml version="1.0" encoding="utf-8"?><feed xmlns="http://www.w3.org/2005/Atom"><title>Feed</title>'
            f'<link href="http://example.invalid/feed/" rel="self"/>{entries}</feed>').encode()  # fmt: skip


@pytest.mark.parametrize("kind", ["rss", "atom"])
def test_an_rss_or_atom_feed_given_as_a_sitemap_leads_to_its_items(site: TestSite, kind: str) -> None:
    paths = orphan_pages(site, 3)
    feed = serve_xml(site, f"/feed.{kind}", (rss if kind == "rss" else atom)([site.url(p) for p in paths]))

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": [feed]})

    assert status["state"] == "completed", status
    assert set(paths) <= fetched(site)
    assert (status["sitemaps_read"], status["sitemap_urls"], status["sitemap_problems"]) == (1, 3, {})
    assert not any("edit" in seen.path or "invalid" in seen.path for seen in site.seen)


@pytest.mark.parametrize(
    "lead", [BOM, b"\r\n\n  \t", BOM + b"\n\n", b"\n" + BOM], ids=["bom", "blank", "bom-blank", "blank-bom"]
)
def test_a_byte_order_mark_or_blank_lines_before_the_xml_declaration_are_skipped(site: TestSite, lead: bytes) -> None:
    paths = orphan_pages(site, 2)
    site.add_page("/robots.txt", f"User-agent: *\nSitemap: {site.url('/sm.xml.gz')}\n", Content_Type="text/plain")
    serve_xml(site, "/sm.xml", lead + urlset([site.url(paths[0])]))
    site.add_response("/sm.xml.gz", Response(gzip.compress(lead + urlset([site.url(paths[1])])),
                                             headers={"Content-Type": "application/gzip"}))  # fmt: skip

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": [site.url("/sm.xml"),
                                                                                 site.url("/sm.xml.gz")]})  # fmt: skip

    assert status["state"] == "completed", status
    assert set(paths) <= fetched(site)
    assert (status["sitemaps_read"], status["sitemap_problems"]) == (2, {})


def test_a_robots_txt_starting_with_a_bom_gives_its_sitemaps_and_its_rules(site: TestSite) -> None:
    paths = orphan_pages(site, 3)
    robots = BOM + f"Sitemap: {site.url('/sm.xml')}\nUser-agent: *\nDisallow: /p/2.html\n".encode()
    site.add_page("/robots.txt", robots, Content_Type="text/plain")
    serve_xml(site, "/sm.xml", urlset([site.url(p) for p in paths]))

    status = run_job({"seeds": [site.url("/")], "politeness": FAST})

    assert status["state"] == "completed", status
    assert site.requests_to("/sm.xml") and {paths[0], paths[1]} <= fetched(site)
    assert not site.requests_to(paths[2]) and status["robots_blocked"] == 1


def test_relative_and_upper_case_sitemap_lines_in_robots_txt_are_resolved(site: TestSite) -> None:
    paths = orphan_pages(site, 3)
    upper = site.url("/upper.xml").replace("http://", "HTTP://")
    site.add_page("/robots.txt", f"User-agent: *\nSitemap: /rel.xml\nSitemap: sub/dir.xml\nSitemap: {upper}\n",
                  Content_Type="text/plain")  # fmt: skip
    serve_xml(site, "/rel.xml", urlset([site.url(paths[0])]))
    serve_xml(site, "/sub/dir.xml", urlset([site.url(paths[1])]))
    serve_xml(site, "/upper.xml", urlset([site.url(paths[2])]))

    status = run_job({"seeds": [site.url("/")], "politeness": FAST})

    assert status["state"] == "completed", status
    assert set(paths) <= fetched(site)
    assert (status["sitemaps_read"], status["sitemap_problems"]) == (3, {})


def test_a_sitemap_cut_mid_document_keeps_its_complete_entries_and_counts_as_truncated(site: TestSite) -> None:
    paths = orphan_pages(site, 40)
    whole = urlset([site.url(p) for p in paths])
    cut = whole[: whole.index(site.url(paths[-1]).encode()) + 10]  # inside the last <loc>
    serve_xml(site, "/cut.xml", cut)

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": [site.url("/cut.xml")]})

    assert status["state"] == "completed", status
    assert set(paths[:-1]) <= fetched(site) and paths[-1] not in fetched(site)
    assert (status["sitemap_urls"], status["sitemap_problems"]) == (39, {"truncated": 1})


def test_a_sitemap_whose_connection_closes_early_is_retried_then_read_as_far_as_it_came(site: TestSite) -> None:
    paths = orphan_pages(site, 40)
    whole = urlset([site.url(p) for p in paths])
    cut = whole[: whole.index(site.url(paths[-1]).encode()) + 10]
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {len(whole)}\r\n\r\n".encode()
    site.add_response("/cut.xml", Response(raw_pieces=[head, cut]))  # then the server closes the connection

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": [site.url("/cut.xml")]})

    assert status["state"] == "completed", status
    assert len(site.requests_to("/cut.xml")) > 1  # retried like a page; the last attempt keeps what came
    assert set(paths[:-1]) <= fetched(site) and paths[-1] not in fetched(site)
    assert (status["sitemap_urls"], status["sitemap_problems"], status["failed"]) == (39, {"truncated": 1}, {})
