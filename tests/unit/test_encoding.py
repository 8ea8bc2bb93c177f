"""Unit tests for decoding pages as the HTML standard does: analyzers/sniffing.py and analyzers/encoding.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzers import Page
from analyzers.encoding import _CODECS, _is_ascii_compatible, decode, get_encoding, percent_encode_query
from analyzers.sniffing import LATE_META_BYTES, PRESCAN_BYTES, sniff

URL = "http://example.com/page.html"
HTML5LIB = Path(__file__).parent.parent / "data" / "html5lib-tests" / "encoding"


def read_dat(name: str) -> list[tuple[bytes, str]]:
    """The (#data, #encoding) cases of an html5lib-tests encoding file, data as raw bytes."""
    cases = []
    for block in (HTML5LIB / name).read_bytes().split(b"#data\n")[1:]:
        data, _, rest = block.partition(b"\n#encoding\n")
        cases.append((data, rest.split(b"\n", 1)[0].decode("ascii").strip()))
    return cases


def html5lib_cases() -> list:
    return [
        pytest.param(data, expected, id=f"{name}:{index}")
        for name in ("tests1.dat", "tests2.dat", "test-yahoo-jp.dat")
        for index, (data, expected) in enumerate(read_dat(name))
    ]


def test_the_html5lib_encoding_files_are_all_read():
    assert [len(read_dat(name)) for name in ("tests1.dat", "tests2.dat", "test-yahoo-jp.dat")] == [59, 22, 1]


@pytest.mark.parametrize(("data", "expected"), html5lib_cases())
def test_html5lib_encoding_case(data: bytes, expected: str):
    # No transport-layer charset; the expected names are WHATWG names in any case.
    sniffed = sniff(data, None)
    if sniffed.source == "fallback":
        # Outside the algorithm: with no usable declaration the answer is the browser's default
        # encoding, which depends on its locale (tests1.dat's first case says so: "you may have to
        # set your defaults appropriately"). The files expect windows-1252, the default of
        # English-language locales; vcrawl's documented fallback gives it for these ASCII bodies.
        assert data.isascii() and expected.lower() == "windows-1252"
    assert sniffed.encoding.lower() == expected.lower()
    assert Page(URL, data, "text/html").encoding.lower() == expected.lower()


# --- precedence: BOM, header, prescan, late meta, fallback -----------------------------------------

META_1251 = '<meta charset="windows-1251"><p>Привет</p>'


@pytest.mark.parametrize(
    ("body", "content_type", "encoding", "source"),
    [
        pytest.param(b"\xef\xbb\xbf" + META_1251.encode(), "text/html; charset=koi8-r", "UTF-8", "bom", id="bom-wins"),
        pytest.param(b"\xfe\xff\x00<", "text/html; charset=utf-8", "UTF-16BE", "bom", id="utf16be-bom"),
        pytest.param(META_1251.encode("cp1251"), "text/html; charset=utf-8", "UTF-8", "header", id="header-over-meta"),
        pytest.param(META_1251.encode("cp1251"), "text/html; charset=bogus", "windows-1251", "meta", id="bad-header"),
        pytest.param(META_1251.encode("cp1251"), "text/html", "windows-1251", "meta", id="meta"),
        pytest.param(META_1251.encode("cp1251"), None, "windows-1251", "meta", id="no-content-type"),
        pytest.param(b"<p>x</p>", 'text/html; Charset="ISO-8859-2"', "ISO-8859-2", "header", id="quoted-header"),
        pytest.param(b"<p>x</p>", "text/html; charset=", "windows-1252", "fallback", id="empty-header-charset"),
        pytest.param(b'<?xml version="1.0" encoding="koi8-r"?><p>', None, "KOI8-R", "xml", id="xml-declaration"),
        pytest.param("<p>Größe</p>".encode(), "text/html", "UTF-8", "fallback", id="undeclared-utf-8"),
        pytest.param("<p>Größe</p>".encode("cp1252"), "text/html", "windows-1252", "fallback", id="undeclared-1252"),
        pytest.param(b"<p>plain</p>", "text/html", "windows-1252", "fallback", id="undeclared-ascii"),
    ],
)
def test_encoding_precedence(body: bytes, content_type: str | None, encoding: str, source: str):
    sniffed = sniff(body, content_type)
    assert (sniffed.encoding, sniffed.source) == (encoding, source)


def test_the_issue_pages_read_as_browsers_read_them():
    assert Page(URL, "<p>Größe</p>".encode("cp1252"), "text/html").text == "<p>Größe</p>"
    assert Page(URL, META_1251.encode("cp1251")).text == META_1251
    page = Page(URL, '<meta charset="x-cp1251"><p>Привет</p>'.encode("cp1251"))
    assert (page.encoding, page.tree.findtext(".//p")) == ("windows-1251", "Привет")
    page = Page(URL, '<meta charset="koi"><p>Привет</p>'.encode("koi8-r"))
    assert (page.encoding, page.tree.findtext(".//p")) == ("KOI8-R", "Привет")
    page = Page(URL, '<meta charset="x-euc-jp"><p>日本語のページ</p>'.encode("euc-jp"))
    assert (page.encoding, page.tree.findtext(".//p")) == ("EUC-JP", "日本語のページ")


def test_a_utf8_body_cut_mid_character_is_still_utf8():
    page = Page(URL, "<p>Größe €".encode()[:-1], "text/html")
    assert page.encoding == "UTF-8" and page.text.startswith("<p>Größe ")


# --- the prescan: malformed and unusable declarations ----------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b'<meta charset="windows-1251', id="unclosed-quote"),
        pytest.param(b"<meta charset=windows-1251", id="bytes-run-out"),
        pytest.param(b'<meta content="text/html; charset=windows-1251">', id="content-without-http-equiv"),
        pytest.param(b'<meta http-equiv="Content-Type " content="text/html; charset=windows-1251">', id="pragma-space"),
        pytest.param(b'<meta name="Content-Type" content="text/html; charset=windows-1251">', id="name-not-pragma"),
        pytest.param(b"<metacharset=windows-1251>", id="no-space-after-meta"),
        pytest.param(b'<!-- <meta charset="windows-1251"> -->', id="in-a-comment"),
        pytest.param(b'<p title="x><meta charset=windows-1251>">', id="in-an-attribute"),
        pytest.param(b'<meta http-equiv=content-type content="charset=\'windows-1251">', id="unmatched-quote"),
        pytest.param(b'<meta charset="utf-7"><meta charset="unicode_escape"><meta charset="base64">', id="not-whatwg"),
    ],
)
def test_malformed_declarations_are_ignored(head: bytes):
    assert sniff(head + b"<p>\xcf\xf0</p>").source == "fallback"


@pytest.mark.parametrize(
    ("head", "encoding"),
    [
        pytest.param(b'<meta charset="bogus"><meta charset="windows-1251">', "windows-1251", id="bogus-first"),
        pytest.param(b"<meta charset=utf-7><meta charset=koi8-r>", "KOI8-R", id="utf-7-first"),
        pytest.param(b'<meta name=x><meta charset="x-cp1251">', "windows-1251", id="no-charset-first"),
        pytest.param(
            b'<meta http-equiv="content-type" content="text/html; charset=koi"><meta charset=utf-8>',
            "KOI8-R",
            id="first-usable-wins",
        ),
        pytest.param(b"<meta charset=utf-16le>", "UTF-8", id="utf-16-means-utf-8"),
        pytest.param(b"<meta charset=x-user-defined>", "windows-1252", id="x-user-defined-means-1252"),
        pytest.param(b"<meta charset=iso-2022-kr>", "replacement", id="replacement"),
        pytest.param(b"<META CHARSET = 'Shift_JIS' >", "Shift_JIS", id="upper-case-and-spaces"),
    ],
)
def test_the_first_usable_declaration_counts(head: bytes, encoding: str):
    assert sniff(head).encoding == encoding


# --- a <meta> past the prescan ("change the encoding") --------------------------------------------


def test_a_meta_after_4_kib_of_comments_is_seen():
    body = b"<!--" + b"x" * 4096 + b'-->\n<meta charset="windows-1251"><p>\xcf\xf0\xe8\xe2\xe5\xf2</p>'
    assert sniff(body) == ("windows-1251", "late-meta", 0)
    assert Page(URL, body, "text/html").tree.findtext(".//p") == "Привет"


@pytest.mark.parametrize(
    ("body", "encoding"),
    [
        pytest.param(
            b"<head><script>" + b"x<y;" * 1000 + b"</script><meta charset=koi8-r>", "KOI8-R", id="after-script"
        ),
        pytest.param(b"<title>" + b"t" * 2000 + b"</title><meta charset=utf-16>", "UTF-8", id="utf-16-means-utf-8"),
        pytest.param(b"<body>" + b"y" * 2000 + b"<meta charset=koi8-r>", "windows-1252", id="not-after-body"),
        pytest.param(
            b"<script>" + b"y" * 2000 + b"'<meta charset=koi8-r>'</script>", "windows-1252", id="not-in-script"
        ),
        pytest.param(b"<!--" + b"x" * LATE_META_BYTES + b"--><meta charset=koi8-r>", "windows-1252", id="past-window"),
        pytest.param(b"<p>" + b"y" * 500 + b"<meta charset=koi8-r>", "KOI8-R", id="anywhere-in-first-kib"),
    ],
)
def test_a_late_meta_counts_only_while_in_the_head(body: bytes, encoding: str):
    assert len(body) > PRESCAN_BYTES or encoding == "KOI8-R"
    assert sniff(body).encoding == encoding


# --- labels and decoders ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "name"),
    [
        ("utf8", "UTF-8"), ("unicode-1-1-utf-8", "UTF-8"), ("latin1", "windows-1252"), ("ascii", "windows-1252"),
        ("iso-8859-1", "windows-1252"), ("x-cp1251", "windows-1251"), ("koi", "KOI8-R"), ("koi8-ru", "KOI8-U"),
        ("x-euc-jp", "EUC-JP"), ("ms_kanji", "Shift_JIS"), ("x-sjis", "Shift_JIS"), ("csiso2022jp", "ISO-2022-JP"),
        ("logical", "ISO-8859-8-I"), ("iso-8859-8", "ISO-8859-8"), ("tis-620", "windows-874"),
        ("iso-8859-11", "windows-874"), ("gb2312", "GBK"), ("x-gbk", "GBK"), ("gb18030", "gb18030"),
        ("big5-hkscs", "Big5"), ("ks_c_5601-1987", "EUC-KR"), ("x-mac-ukrainian", "x-mac-cyrillic"),
        ("mac", "macintosh"), ("866", "IBM866"), ("unicode", "UTF-16LE"), ("unicodefffe", "UTF-16BE"),
        ("x-user-defined", "x-user-defined"), ("iso-2022-kr", "replacement"), ("hz-gb-2312", "replacement"),
        ("iso-2022-cn-ext", "replacement"), ("\t Windows-1250 \n", "windows-1250"),
        ("utf-7", None), ("unicode_escape", None), ("base64", None), ("rot13", None), ("utf-32", None), ("", None),
    ],
)  # fmt: skip
def test_labels_resolve_as_the_encoding_standard_says(label: str, name: str | None):
    assert get_encoding(label) == name


@pytest.mark.parametrize(
    ("body", "encoding", "text"),
    [
        pytest.param(b"\x80\x81\x8d\x8f\x90\x9d\xff", "windows-1252", "€\x81\x8d\x8f\x90\x9dÿ", id="1252-c1"),
        pytest.param(b"\xca\x81", "windows-1255", "\u05ba\x81", id="1255"),
        pytest.param(b"\x98", "windows-1251", "\x98", id="1251-c1"),
        pytest.param(b"\xae\xbe", "KOI8-U", "ўЎ", id="koi8-u-is-koi8-ru"),
        pytest.param(b"a\x80\xff", "x-user-defined", "a\uf780\uf7ff", id="x-user-defined"),
        pytest.param(b"<p>x</p>", "replacement", "\ufffd", id="replacement"),
        pytest.param(b"", "replacement", "", id="replacement-empty"),
        pytest.param(b"\x87\x40\x81\x60", "Shift_JIS", "①\uff5e", id="shift-jis-nec"),
        pytest.param(b"\xad\xa1\xa1\xc1\x8f\xa2\xb7", "EUC-JP", "①\uff5e\uff5e", id="euc-jp-as-the-index"),
        pytest.param(b"\x1b$B!A\x1b(B", "ISO-2022-JP", "\uff5e", id="iso-2022-jp"),
        pytest.param(b"\x80\xb0\xa1", "GBK", "€啊", id="gbk-euro"),
        pytest.param(b"\x81\x30\x81\x30", "gb18030", "\x80", id="gb18030-four-bytes"),
        pytest.param(b"\xa4@\xff", "Big5", "一\ufffd", id="big5"),
        pytest.param(b"\xb0\xa1", "EUC-KR", "가", id="euc-kr"),
        pytest.param(b"\xe6\x97\xa5", "EUC-JP", "\ufffd\ufffd", id="euc-jp-resync"),
        pytest.param(b"\x81\xffx\x81 x\xa0", "Shift_JIS", "\ufffdx\ufffd x\ufffd", id="shift-jis-resync"),
        pytest.param(b"\x81\x30\x81\x20\x81\x30", "gb18030", "\ufffd0\ufffd \ufffd", id="gb18030-resync"),
        pytest.param(b"\xb0\xffa\xb0 a", "EUC-KR", "\ufffda\ufffd a", id="euc-kr-resync"),
        pytest.param(b"ok \xff\xc3 end", "UTF-8", "ok \ufffd\ufffd end", id="utf-8-bad-bytes"),
        pytest.param(b"<\x00\x00\xd8", "UTF-16LE", "<\ufffd", id="utf-16-lone-surrogate"),
    ],
)
def test_decoders_follow_the_encoding_standard(body: bytes, encoding: str, text: str):
    assert decode(body, encoding) == text


def test_x_user_defined_from_the_header_has_its_own_decoder():
    page = Page(URL, b"<p>\x80\xe9</p>", "text/html; charset=x-user-defined")
    assert (page.encoding, page.tree.findtext(".//p")) == ("x-user-defined", "\uf780\uf7e9")


@pytest.mark.parametrize("encoding", sorted(set(_CODECS) - {"UTF-16LE", "UTF-16BE"} | {"x-user-defined"}))
def test_every_ascii_compatible_encoding_keeps_markup_as_it_is(encoding: str):
    probe = '<a href="x">\\x3c\\u003c&+-</a>'
    assert decode(probe.encode("ascii"), encoding) == probe
    assert encoding == "x-user-defined" or _is_ascii_compatible(_CODECS[encoding])


# --- URL Standard: a query in the document's encoding ----------------------------------------------


@pytest.mark.parametrize(
    ("query", "encoding", "expected"),
    [
        ("?q=Привет", "windows-1251", "?q=%CF%F0%E8%E2%E5%F2"),
        ("?q=Привет", "UTF-8", "?q=%D0%9F%D1%80%D0%B8%D0%B2%D0%B5%D1%82"),
        ("?q=é", "UTF-16LE", "?q=%C3%A9"),  # UTF-16 and replacement documents write queries in UTF-8
        ("?q=é", "replacement", "?q=%C3%A9"),
        ("?q=é&r=Ж", "windows-1252", "?q=%E9&r=%26%231046%3B"),
        ("?q=日本", "Shift_JIS", "?q=%93%FA%96{"),
        ("?q=日本", "EUC-JP", "?q=%C6%FC%CB%DC"),
        ("?q=€", "GBK", "?q=%80"),
        ("?q=\uf780", "x-user-defined", "?q=%80"),
        ("?a=1&b=%2F+x", "windows-1251", "?a=1&b=%2F+x"),
        ("?a=b c\"d'e<f>g#h`{|}", "UTF-8", "?a=b%20c%22d%27e%3Cf%3Eg%23h`{|}"),
        ("?a=\x01\x7f", "UTF-8", "?a=%01%7F"),
        ("?q=é", "no-such-label", "?q=%C3%A9"),
        ("?q=😀", "windows-1251", "?q=%26%23128512%3B"),
        ("?q=\ud800", "UTF-8", "?q=%EF%BF%BD"),
    ],
)
def test_percent_encode_query(query: str, encoding: str, expected: str):
    assert percent_encode_query(query, encoding) == expected
