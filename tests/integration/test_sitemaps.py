"""Sitemaps in real crawls of loopback sites on the session's worker: discovered through
robots.txt (gzip index and url sets) or /sitemap.xml, listed by the job, hostile ones ended with
a reason, and ``lastmod`` sparing unchanged pages in a scheduled job's next cycle."""

from __future__ import annotations

import gzip
from collections.abc import Iterator, Sequence

import pytest

from tests.integration.conftest import run_job
from tests.integration.test_cycles import run_cycle
from tests.site import Response, TestSite

pytestmark = pytest.mark.usefixtures("worker")

FAST = {"min_interval_s": 0.0}


@pytest.fixture
def other_site() -> Iterator[TestSite]:
    """Another host (127.0.0.2): a scope by host tells it from the session's site."""
    with TestSite("127.0.0.2") as running:
        yield running


NS = "http://www.sitemaps.org/schemas/sitemap/0.9"


def urlset(urls: Sequence[str], lastmod: str | None = None) -> bytes:
    when = f"<lastmod>{lastmod}</lastmod>" if lastmod else ""
    items = "".join(f"<url><loc>{url}</loc>{when}<changefreq>daily</changefreq></url>" for url in urls)
    return f'<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="{NS}">{items}</urlset>'.encode()


def index(urls: Sequence[str]) -> bytes:
    items = "".join(f"<sitemap><loc>{url}</loc></sitemap>" for url in urls)
    return f'<?xml version="1.0" encoding="UTF-8"?><sitemapindex xmlns="{NS}">{items}</sitemapindex>'.encode()


def orphan_pages(site: TestSite, count: int) -> list[str]:
    """Pages no link leads to: only a sitemap can tell of them."""
    site.add_page("/", "<html><body>no links here</body></html>")
    paths = [f"/p/{n}.html" for n in range(count)]
    for path in paths:
        site.add_page(path, f"<html><body>page {path}</body></html>")
    return paths


def fetched(site: TestSite) -> set[str]:
    return {seen.path for seen in site.seen}


def test_a_site_known_only_by_its_gzip_sitemap_index_in_robots_txt_is_crawled_fully(site: TestSite) -> None:
    paths = orphan_pages(site, 12)
    site.add_page("/robots.txt", f"User-agent: *\nAllow: /\nSitemap: {site.url('/sm/index.xml.gz')}\n",
                  Content_Type="text/plain")  # fmt: skip
    # Served as files are (application/gzip, no Content-Encoding): the crawler inflates them itself.
    site.add_response("/sm/index.xml.gz", Response(gzip.compress(index([site.url("/sm/a.xml.gz"),
                                                                        site.url("/sm/b.txt")])),
                                                   headers={"Content-Type": "application/gzip"}))  # fmt: skip
    site.add_response("/sm/a.xml.gz", Response(gzip.compress(urlset([site.url(p) for p in paths[:8]])),
                                               headers={"Content-Type": "application/gzip"}))  # fmt: skip
    site.add_page("/sm/b.txt", "\n".join(site.url(p) for p in paths[8:]) + "\n", Content_Type="text/plain")

    status = run_job({"seeds": [site.url("/")], "politeness": FAST})

    assert status["state"] == "completed", status
    assert set(paths) <= fetched(site)
    assert "/sitemap.xml" not in fetched(site)  # robots.txt named the sitemaps
    assert (status["pages_stored"], status["sitemaps_read"], status["sitemap_urls"]) == (13, 3, 12)
    assert status["sitemap_problems"] == {}
    assert status["failed"] == {}


def test_by_default_a_site_is_asked_nothing_beyond_robots_txt(site: TestSite) -> None:
    paths = orphan_pages(site, 3)
    site.add_page("/sitemap.xml", urlset([site.url(p) for p in paths]).decode(), Content_Type="application/xml")

    status = run_job({"seeds": [site.url("/")], "politeness": FAST})

    assert status["state"] == "completed" and fetched(site) == {"/robots.txt", "/"}
    assert (status["sitemaps_read"], status["pages_stored"]) == (0, 1)


def test_with_true_the_origins_sitemap_xml_is_read_and_a_missing_one_is_no_failure(
    site: TestSite, other_site: TestSite
) -> None:
    paths = orphan_pages(site, 3)
    site.add_page("/sitemap.xml", urlset([site.url(p) for p in paths]).decode(), Content_Type="application/xml")
    other_site.add_page("/", "<html><body>alone</body></html>")

    status = run_job({"seeds": [site.url("/"), other_site.url("/")], "politeness": FAST, "sitemaps": True})

    assert status["state"] == "completed", status
    assert set(paths) <= fetched(site)
    assert other_site.requests_to("/sitemap.xml")  # asked, answered 404
    assert status["failed"] == {} and status["sitemap_problems"] == {"http_404": 1}
    assert status["pages_stored"] == 5


def test_sitemaps_false_reads_none_and_a_listed_sitemap_is_read_instead_of_discovery(site: TestSite) -> None:
    paths = orphan_pages(site, 2)
    site.add_page("/robots.txt", f"User-agent: *\nSitemap: {site.url('/named.xml')}\n", Content_Type="text/plain")
    site.add_page("/named.xml", urlset([site.url(paths[0])]).decode(), Content_Type="application/xml")
    site.add_page("/listed.xml", urlset([site.url(paths[1])]).decode(), Content_Type="application/xml")

    off = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": False})
    assert off["state"] == "completed" and off["sitemaps_read"] == 0 and fetched(site) == {"/robots.txt", "/"}

    listed = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": [site.url("/listed.xml")]})
    assert listed["state"] == "completed" and listed["sitemaps_read"] == 1
    assert site.requests_to(paths[1]) and not site.requests_to(paths[0]) and not site.requests_to("/named.xml")


def test_sitemap_urls_go_through_scope_robots_and_dedup(site: TestSite, other_site: TestSite) -> None:
    paths = orphan_pages(site, 3)
    site.add_page("/robots.txt", "User-agent: *\nDisallow: /p/2.html\n", Content_Type="text/plain")
    listed = [site.url(p) for p in paths] + [site.url(paths[0]), other_site.url("/elsewhere.html")]
    site.add_page("/sitemap.xml", urlset(listed).decode(), Content_Type="application/xml")

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": True})  # scope: the seed's host

    assert status["state"] == "completed", status
    assert site.requests_to(paths[0]) and site.requests_to(paths[1]) and not site.requests_to(paths[2])
    assert len(site.requests_to(paths[0])) == 1
    assert not other_site.seen
    assert status["robots_blocked"] == 1 and status["filtered"].get("host") == 1


HOSTILE = {
    "/truncated.xml": (b"<urlset><url><loc>%(page)s</loc></url><url><loc>", "truncated"),
    "/malformed.xml": (b"<urlset><url><loc>%(page)s</loc></url><url><loc>http://h/</lo></url></urlset>", "malformed"),
    "/xxe.xml": (b'<?xml version="1.0"?><!DOCTYPE u [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
                 b"<urlset><url><loc>&x;</loc></url><url><loc>%(page)s</loc></url></urlset>", None),
    "/laughs.xml": (b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;'
                    b'&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]><urlset><url><loc>%(page)s</loc>'
                    b"</url><url><loc>http://h/&c;</loc></url></urlset>", None),
    "/bomb.xml.gz": (None, "too_large"),
    "/html.xml": (b"<html><body>%(page)s</body></html>", "not_a_sitemap"),
    "/broken.xml.gz": (b"\x1f\x8b\x08\x00garbage", "bad_gzip"),
}  # fmt: skip


def test_hostile_sitemaps_end_with_a_reason_and_the_worker_stays_healthy(site: TestSite) -> None:
    page = site.url("/p/0.html")
    orphan_pages(site, 1)
    for path, (body, _) in HOSTILE.items():
        if body is None:  # 60 MiB of XML inflated from ~60 KiB: stopped at the 50 MB cap
            body = gzip.compress(b"<urlset>" + b" " * (60 * 1024 * 1024))
        site.add_response(path, Response(body.replace(b"%(page)s", page.encode()),
                                         headers={"Content-Type": "application/xml"}))  # fmt: skip
    site.add_redirect("/loop-a.xml", "/loop-b.xml")
    site.add_redirect("/loop-b.xml", "/loop-a.xml")
    sitemaps = [site.url(path) for path in (*HOSTILE, "/loop-a.xml")]

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": sitemaps}, timeout_s=60)

    assert status["state"] == "completed", status
    problems = status["sitemap_problems"]
    expected = {reason: 1 for _, reason in HOSTILE.values() if reason is not None}
    assert {reason: problems.get(reason) for reason in expected} == expected, problems
    assert len(site.requests_to("/p/0.html")) == 1  # found by several, fetched once
    assert "/etc/passwd" not in str(status)
    assert len(site.requests_to("/loop-a.xml")) == 1 and len(site.requests_to("/loop-b.xml")) == 1  # dedup ends it
    healthy = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": False})
    assert healthy["state"] == "completed"


def test_lastmod_spares_unchanged_pages_in_the_next_cycle(site: TestSite) -> None:
    paths = orphan_pages(site, 6)
    old, changed = "2020-01-01", paths[:2]

    def sitemap(fresh: Sequence[str]) -> bytes:
        items = "".join(
            f"<url><loc>{site.url(p)}</loc><lastmod>{'2099-01-01' if p in fresh else old}</lastmod></url>"
            for p in paths
        )
        return f'<?xml version="1.0"?><urlset xmlns="{NS}">{items}</urlset>'.encode()

    site.add_response("/sitemap.xml", Response(sitemap(()), headers={"Content-Type": "application/xml"}))
    spec = {"seeds": [site.url("/")], "politeness": FAST, "id": "sitemap-lastmod", "sitemaps": True,
            "revisit": {"initial_s": 0, "min_s": 0, "max_s": 0}}  # fmt: skip
    first = run_cycle(spec)
    assert first["state"] == "completed" and all(len(site.requests_to(p)) == 1 for p in paths), first

    # Cycle 2: the sitemap dates two pages after their fetch (a future lastmod), the others before.
    site.add_response("/sitemap.xml", Response(sitemap(changed), headers={"Content-Type": "application/xml"}))
    second = run_cycle(spec)

    assert second["state"] == "completed", second
    assert [len(site.requests_to(p)) for p in paths] == [2, 2, 1, 1, 1, 1]
    assert second["unchanged_by_sitemap"] == 4
