"""``parse_sitemap`` on files shaped like the reference parsers' test cases: crawler-commons'
SiteMapParserTest (RSS, Atom, leading whitespace and BOM), Scrapy's ``test_utils_sitemap`` (blank
lines before ``<?xml``), ultimate-sitemap-parser (a truncated sitemap keeps what came before the cut)."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime

import pytest

from analyzers.sitemaps import Sitemap, SitemapUrl, parse_sitemap

NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
BOM = b"\xef\xbb\xbf"


def stamp(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


RSS_2 = b"""<?xml version="1.0"?>
<rss version="2.0">
  <channel>
    <title>Lift Off News</title>
    <link>http://liftoff.msfc.nasa.gov/</link>
    <pubDate>Tue, 10 Jun 2003 04:00:00 GMT</pubDate>
    <item>
      <title>Star City</title>
      <link>http://liftoff.msfc.nasa.gov/news/2003/news-starcity.asp</link>
      <pubDate>Tue, 03 Jun 2003 09:39:21 GMT</pubDate>
      <guid>http://liftoff.msfc.nasa.gov/2003/06/03.html#item573</guid>
    </item>
    <item>
      <title>Only a guid</title>
      <guid isPermaLink="true">http://liftoff.msfc.nasa.gov/2003/05/30.html</guid>
    </item>
    <item><title>A guid that is no link</title><guid isPermaLink="false">item-571</guid></item>
    <item><title>Relative</title><link>/news/relative.html</link><pubDate>not a date</pubDate></item>
  </channel>
</rss>"""


def test_an_rss_2_feed_lists_each_items_link_or_url_guid_dated_by_pub_date() -> None:
    feed = parse_sitemap(RSS_2, base_url="http://liftoff.msfc.nasa.gov/rss.xml")
    assert feed == Sitemap("rss", (
        SitemapUrl("http://liftoff.msfc.nasa.gov/news/2003/news-starcity.asp", stamp("2003-06-03T09:39:21")),
        SitemapUrl("http://liftoff.msfc.nasa.gov/2003/05/30.html"),
        SitemapUrl("http://liftoff.msfc.nasa.gov/news/relative.html"),
    ), None, 1)  # fmt: skip
    # Without the feed's own URL a relative link cannot be resolved: it is skipped, not guessed.
    assert [item.url for item in parse_sitemap(RSS_2).urls][-1] == "http://liftoff.msfc.nasa.gov/2003/05/30.html"


def test_an_rss_1_feed_reads_the_items_after_its_channel() -> None:
    rdf = b"""<?xml version="1.0"?><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"
      xmlns="http://purl.org/rss/1.0/" xmlns:dc="http://purl.org/dc/elements/1.1/">
      <channel rdf:about="http://a.test/"><title>t</title><link>http://a.test/</link></channel>
      <item rdf:about="http://a.test/1"><title>1</title><link>http://a.test/1</link><dc:date>2024-05-06</dc:date></item>
    </rdf:RDF>"""
    assert parse_sitemap(rdf) == Sitemap("rss", (SitemapUrl("http://a.test/1", stamp("2024-05-06T00:00")),))


ATOM = b"""<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom">
  <title>Example Feed</title>
  <link href="http://example.org/feed/" rel="self"/>
  <link href="http://example.org/"/>
  <updated>2003-12-13T18:30:02Z</updated>
  <id>urn:uuid:60a76c80-d399-11d9-b91C-0003939e0af6</id>
  <entry>
    <title>Atom-Powered Robots Run Amok</title>
    <link href="http://example.org/2003/12/13/atom03"/>
    <id>urn:uuid:1225c695-cfb8-4ebb-aaaa-80da344efa6a</id>
    <updated>2003-12-13T18:30:02Z</updated>
  </entry>
  <entry>
    <link rel="edit" href="http://example.org/edit/2"/>
    <link rel="alternate" type="text/html" href="HTTP://example.org/2"/>
    <modified>2004-01-02T03:04:05Z</modified>
  </entry>
  <entry><link rel="enclosure" href="http://example.org/3.mp3"/></entry>
  <entry><title>no link</title></entry>
</feed>"""


def test_an_atom_feed_lists_each_entrys_page_link_dated_by_updated() -> None:
    assert parse_sitemap(ATOM) == Sitemap("atom", (
        SitemapUrl("http://example.org/2003/12/13/atom03", stamp("2003-12-13T18:30:02")),
        SitemapUrl("http://example.org/2", stamp("2004-01-02T03:04:05")),  # not the edit link; scheme lower-cased
        SitemapUrl("http://example.org/3.mp3"),  # its only link: crawler-commons takes it too
    ), None, 1)  # fmt: skip


URLSET = f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="{NS}"><url><loc>http://a.test/1</loc></url></urlset>'


@pytest.mark.parametrize("lead", [BOM, b"\n\n\n", b"  \t\r\n", BOM + b"\n  ", b"\n" + BOM, BOM + BOM])
@pytest.mark.parametrize("gzipped", [False, True])
def test_byte_order_marks_and_blank_lines_before_the_xml_declaration_are_skipped(lead: bytes, gzipped: bool) -> None:
    body = lead + URLSET.encode()
    assert parse_sitemap(gzip.compress(body) if gzipped else body) == Sitemap(
        "urlset", (SitemapUrl("http://a.test/1"),)
    )


def test_a_feed_with_a_byte_order_mark_and_an_encoding_declaration_is_read() -> None:
    body = BOM + b"\r\n" + ATOM.replace(b"Example Feed", "Exempel fl\u00f6de".encode())
    assert len(parse_sitemap(body).urls) == 3


def urlset(count: int) -> bytes:
    items = "".join(f"<url><loc>http://a.test/{n}</loc><lastmod>2024-01-0{1 + n % 9}</lastmod></url>\n"
                    for n in range(count))  # fmt: skip
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="{NS}">\n{items}</urlset>\n'.encode()


def test_a_file_cut_anywhere_keeps_every_entry_closed_before_the_cut_and_is_truncated() -> None:
    whole = urlset(6)
    root_open, root_closed = whole.index(b">", whole.index(b"<urlset")) + 1, whole.index(b"</urlset>") + 9
    for cut in range(1, root_open):  # before the root is read: nothing to keep, whatever the reason
        assert parse_sitemap(whole[:cut]).urls == ()
    for cut in range(root_open, root_closed):
        sitemap = parse_sitemap(whole[:cut])
        closed = whole[:cut].count(b"</url>")
        assert [item.url for item in sitemap.urls] == [f"http://a.test/{n}" for n in range(closed)]
        assert sitemap.problem == "truncated", cut


def test_a_large_truncated_file_keeps_its_entries_across_parser_steps() -> None:
    whole = urlset(5000)  # ~350 KiB: several of the parser's 64 KiB steps
    sitemap = parse_sitemap(whole[: len(whole) * 3 // 4])
    assert sitemap.problem == "truncated" and sitemap.kind == "urlset"
    assert len(sitemap.urls) == whole[: len(whole) * 3 // 4].count(b"</url>") > 3000


@pytest.mark.parametrize(
    ("body", "kept"),
    [
        (urlset(3).replace(b"http://a.test/1</loc>", b"http://a.test/1</lo>"), 1),
        (urlset(3) + b"<urlset/>", 3),  # a second root after the first
        (urlset(3).replace(b"</urlset>", b"</urlsex>"), 3),
    ],
)  # fmt: skip
def test_a_file_broken_before_its_end_is_malformed_and_keeps_what_came_before(body: bytes, kept: int) -> None:
    sitemap = parse_sitemap(body)
    assert (sitemap.problem, len(sitemap.urls)) == ("malformed", kept)


def test_feeds_keep_the_bounds_of_sitemaps() -> None:
    items = "".join(f"<item><link>http://a.test/{n}</link></item>" for n in range(12))
    many = parse_sitemap(f"<rss><channel>{items}</channel></rss>".encode(), max_urls=10)
    assert (len(many.urls), many.problem) == (10, "too_many_urls")
    xxe = (
        b'<?xml version="1.0"?><!DOCTYPE f [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
        b"<rss><channel><item><link>&x;</link></item><item><link>http://a.test/ok</link></item></channel></rss>"
    )
    assert parse_sitemap(xxe) == Sitemap("rss", (SitemapUrl("http://a.test/ok"),), None, 1)  # &x; never read
    in_attribute = parse_sitemap(b'<?xml version="1.0"?><!DOCTYPE f [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
                                 b'<feed><entry><link href="http://a.test/&x;"/></entry></feed>')  # fmt: skip
    assert in_attribute == Sitemap("atom", (), "malformed")  # not well-formed XML: refused, not read
    cut = parse_sitemap(f"<rss><channel>{items}".encode()[:-20])
    assert (len(cut.urls), cut.problem) == (11, "truncated")
    assert parse_sitemap(b"<rss><channel><item><link>javascript:alert(1)</link></item></channel></rss>").skipped == 1
