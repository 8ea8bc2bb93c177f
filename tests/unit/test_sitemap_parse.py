"""``analyzers.sitemaps.parse_sitemap``: the protocol's forms, its limits, and hostile files."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime

import pytest

from analyzers.sitemaps import Sitemap, SitemapUrl, parse_sitemap
from engine.jobs import Link
from engine.sitemaps import MAX_NESTING, SitemapHint, discovery_links, listed_links, unchanged_by_hint

NS = "http://www.sitemaps.org/schemas/sitemap/0.9"


def urlset(*items: str) -> bytes:
    return f'<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="{NS}">{"".join(items)}</urlset>'.encode()


def test_a_url_set_keeps_each_entrys_hints_and_skips_unusable_locs() -> None:
    body = urlset(
        "<url><loc> http://a.test/1 </loc><lastmod>2026-01-02T03:04:05+01:00</lastmod><priority>0.8</priority>"
        "<changefreq>Daily</changefreq></url>",
        "<url><loc>http://a.test/2</loc><lastmod>yesterday</lastmod><priority>7</priority>"
        "<changefreq>sometimes</changefreq></url>",
        "<url><loc>ftp://a.test/3</loc></url><url><loc>/relative</loc></url><url></url>",
    )
    sitemap = parse_sitemap(body)
    when = datetime(2026, 1, 2, 2, 4, 5, tzinfo=UTC).timestamp()
    assert sitemap == Sitemap("urlset", (SitemapUrl("http://a.test/1", when, 0.8, "daily"),
                                         SitemapUrl("http://a.test/2")), None, 3)  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2026", "2026-01-01"), ("2026-05", "2026-05-01"), ("2026-05-07", "2026-05-07"),
     ("2026-05-07T10:00Z", "2026-05-07T10:00+00:00"), ("2026-05-07T10:00:00", "2026-05-07T10:00+00:00")],
)  # fmt: skip
def test_lastmod_takes_every_w3c_datetime_form(text: str, expected: str) -> None:
    sitemap = parse_sitemap(urlset(f"<url><loc>http://a.test/</loc><lastmod>{text}</lastmod></url>"))
    moment = datetime.fromisoformat(expected)
    assert sitemap.urls[0].lastmod_s == (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def test_an_index_gzip_and_plain_text_are_read_alike() -> None:
    index = f'<sitemapindex xmlns="{NS}"><sitemap><loc>http://a.test/s1.xml</loc></sitemap></sitemapindex>'
    assert parse_sitemap(gzip.compress(index.encode())) == Sitemap("index", (SitemapUrl("http://a.test/s1.xml"),))
    text = b"\xef\xbb\xbfhttp://a.test/1\r\n\n  http://a.test/2  \nnot a url\n"
    assert parse_sitemap(text) == Sitemap("text", (SitemapUrl("http://a.test/1"), SitemapUrl("http://a.test/2")),
                                          None, 1)  # fmt: skip


def test_the_protocols_limits_cut_with_a_reason() -> None:
    many = urlset(*(f"<url><loc>http://a.test/{n}</loc></url>" for n in range(12)))
    cut = parse_sitemap(many, max_urls=10)
    assert (len(cut.urls), cut.problem) == (10, "too_many_urls")
    big = parse_sitemap(many, max_bytes=len(many) // 2)
    assert big.problem == "too_large" and 0 < len(big.urls) < 12
    bomb = gzip.compress(b"<urlset>" + b" " * (60 * 1024 * 1024))
    assert len(bomb) < 100_000 and parse_sitemap(bomb).problem == "too_large"


@pytest.mark.parametrize(
    ("body", "problem", "urls"),
    [
        (b'<?xml version="1.0"?><!DOCTYPE u [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
         b"<urlset><url><loc>&x;</loc></url><url><loc>http://a.test/ok</loc></url></urlset>", None, ["http://a.test/ok"]),
        (b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'
         b"<urlset><url><loc>http://a.test/&b;</loc></url></urlset>", None, ["http://a.test/"]),
        (b"<urlset><url><loc>http://a.test/1</loc></url><url><loc>http://a.", "truncated", ["http://a.test/1"]),
        (b"<urlset><url><loc>http://a.test/1</loc></url><url><loc>http://a.</lo></url></urlset>", "malformed",
         ["http://a.test/1"]),
        (b"<html><body><a href='http://a.test/'>x</a></body></html>", "not_a_sitemap", []),
        (b"\x1f\x8b\x08\x00garbage", "bad_gzip", []),
        (gzip.compress(urlset("<url><loc>http://a.test/1</loc></url>"))[:-12], "bad_gzip", []),
        (b"  \n", "empty", []),
        (b"just words\nno urls\n", "not_a_sitemap", []),
    ],
)  # fmt: skip
def test_hostile_files_end_with_a_reason_and_nothing_outside_is_read(body: bytes, problem: str | None,
                                                                      urls: list[str]) -> None:  # fmt: skip
    sitemap = parse_sitemap(body)
    assert sitemap.problem == problem
    assert [item.url for item in sitemap.urls][: len(urls)] == urls
    assert "root:" not in repr(sitemap)  # /etc/passwd was never read


def test_links_of_a_sitemap_nest_at_most_three_levels() -> None:
    pages = Sitemap("urlset", (SitemapUrl("http://a.test/1"),))
    assert listed_links(pages, 2, 0, 5) == ([Link("http://a.test/1", 1, 5)], 0)
    index = Sitemap("index", (SitemapUrl("http://a.test/s.xml"),))
    assert listed_links(index, 1, 0, 5) == ([Link("http://a.test/s.xml", 0, 5, sitemap=2)], 0)
    assert listed_links(index, MAX_NESTING, 0, 5) == ([], 1)
    assert discovery_links("http://a.test/robots.txt", (), 0, 5) == [Link("http://a.test/sitemap.xml", 0, 5, sitemap=1)]
    assert discovery_links("http://a.test/robots.txt", (), 0, 5, probe=False) == []  # the default: robots.txt only
    assert discovery_links("http://a.test/robots.txt", ("https://cdn.test/s.xml", "/x"), 0, 5) == [
        Link("https://cdn.test/s.xml", 0, 5, sitemap=1)
    ]


def test_a_hint_spares_a_fetch_only_when_read_this_cycle_and_older_than_the_last_fetch() -> None:
    hint = SitemapHint(cycle=2, lastmod_s=100.0)
    assert SitemapHint.decode(hint.encode()) == hint
    assert unchanged_by_hint(hint, 2, 150.0)
    assert not unchanged_by_hint(hint, 3, 150.0)  # read in an earlier cycle: stale
    assert not unchanged_by_hint(hint, 2, 50.0)  # changed after the last fetch
    assert not unchanged_by_hint(SitemapHint(cycle=2), 2, 150.0)  # no lastmod
    assert not unchanged_by_hint(None, 2, 150.0)
