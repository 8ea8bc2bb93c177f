"""Unit tests for analyzers/: page decoding and parsing, links, fields and the registry."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from analyzers import Page, Registry, analyzer_names, check_rules, compile_rules, get_analyzer, run_analysis
from analyzers import fields as fields_analyzer
from analyzers import links as links_analyzer
from analyzers import page as page_module
from analyzers.page import TREE_DEPTH_LIMIT
from vcrawl.errors import ConfigError, InvalidTask, UnknownComponent
from vcrawl.payloads import FieldRule

URL = "http://example.com/dir/page.html"
GROUP = "vcrawl.analyzers"


def links_of(html: str | bytes, url: str = URL) -> dict:
    body = html.encode("utf-8") if isinstance(html, str) else html
    return links_analyzer.analyze(Page(url, body), None)


def triples(result: dict) -> list[tuple[str, str, str]]:
    return [(link["url"], link["text"], link["tag"]) for link in result["links"]]


# --- Page: decoding -------------------------------------------------------------------------------

ENCODING_CASES = [
    pytest.param(b"\xef\xbb\xbf<p>caf\xc3\xa9</p>", None, "café", id="utf8-bom-no-declaration"),
    pytest.param(b"<p>caf\xe9</p>", "text/html; charset=iso-8859-1", "café", id="content-type-latin1"),
    pytest.param(
        '<meta charset="windows-1251"><p>Привет, мир</p>'.encode("cp1251"), None, "Привет, мир", id="meta-cp1251"
    ),
    pytest.param(
        '<meta http-equiv="Content-Type" content="text/html; charset=shift_jis"><p>日本語のページ</p>'.encode(
            "shift_jis"
        ),
        None,
        "日本語のページ",
        id="http-equiv-shift-jis",
    ),
    pytest.param(
        b'<?xml version="1.0" encoding="utf-8"?><html><body><p>caf\xc3\xa9</p></body></html>',
        None,
        "café",
        id="xml-declaration",
    ),
    pytest.param(
        '<meta charset="windows-1251"><p>café</p>'.encode(),
        "text/html; charset=utf-8",
        "café",
        id="header-beats-meta",
    ),
    pytest.param("<p>caf\u00e9</p>".encode("utf-16"), None, "café", id="utf16-bom"),
    pytest.param(b"<p>caf\xc3\xa9</p>", None, "café", id="no-declaration-defaults-to-utf8"),
    pytest.param(b"<p>caf\xc3\xa9</p>", "text/html; charset=base64", "café", id="non-text-codec-header"),
    pytest.param(b"<p>caf\xc3\xa9</p>", "text/html; charset=no-such-charset", "café", id="unknown-charset"),
    pytest.param(b'<meta charset="utf-16"><p>caf\xc3\xa9</p>', None, "café", id="ascii-readable-utf16-meta"),
    pytest.param(b'<meta charset="rot13"><p>caf\xc3\xa9</p>', None, "café", id="non-text-codec-meta"),
]


@pytest.mark.parametrize(("body", "content_type", "expected"), ENCODING_CASES)
def test_page_decodes_declared_and_detected_encodings(body: bytes, content_type: str | None, expected: str):
    page = Page(URL, body, content_type)
    assert expected in page.text
    assert not page.text.startswith("\ufeff")
    assert page.tree.findtext(".//p") == expected  # the parsed tree agrees with the decoded text


def test_invalid_utf8_bytes_become_replacement_characters():
    page = Page(URL, b"<p>ok \xff\xfe\xc3 end</p>", "text/html; charset=utf-8")
    assert "\ufffd" in page.text
    assert page.tree.findtext(".//p").startswith("ok ")


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'<meta charset="unicode_escape"><a href="\\x3cscript">x</a>', id="unicode-escape"),
        pytest.param(b'<meta charset="raw_unicode_escape"><a href="\\u003cscript">x</a>', id="raw-unicode-escape"),
        pytest.param(b'<meta charset="utf-7"><a href="+ADw-script">x</a>', id="utf-7"),
    ],
)
def test_escaping_charsets_cannot_smuggle_markup(body: bytes):
    page = Page(URL, body)
    assert page.tree.find(".//script") is None
    assert len(page.tree.findall(".//a")) == 1


# --- Page: parsing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b"", b"   \n\t ", b"<!-- only a comment -->", b"\x00\x00"],
    ids=["empty", "whitespace", "comment-only", "nul-bytes"],
)
def test_empty_bodies_give_an_empty_document(body: bytes):
    page = Page(URL, body)
    assert page.tree.tag == "html"
    assert page.tree.findall(".//a") == []
    assert links_analyzer.analyze(page, None) == {"url": URL, "links": [], "count": 0, "skipped": 0, "skipped_by": {}}


def test_malformed_html_is_parsed_leniently():
    result = links_of("<div><p>one<a href=/a>A</div></div></span><p>two<a href='/b'>B<table><td><a href=/c>C")
    assert [link["url"] for link in result["links"]] == [
        "http://example.com/a",
        "http://example.com/b",
        "http://example.com/c",
    ]


def test_deep_nesting_does_not_crash_and_is_reported():
    html = "<p><a href='/before'>before</a></p>" + "<div>" * 5000 + "<a href='/deep'>deep</a>" + "</div>" * 5000
    page = Page(URL, html.encode())
    result = links_analyzer.analyze(page, None)
    assert result["links"][0]["url"] == "http://example.com/before"
    assert page.truncated is True


def test_hundreds_of_unclosed_inline_tags_keep_later_links():
    # Old pages leave <font> open in every row; libxml2's default depth limit (256) would stop there.
    page = Page(URL, ("<font>row " * 600 + "<a href='/after'>after</a>").encode())
    assert [link["url"] for link in links_analyzer.analyze(page, None)["links"]] == ["http://example.com/after"]
    assert page.truncated is False


def test_page_is_decoded_and_parsed_once():
    page = Page(URL, b"<title>t</title>")
    assert page.text is page.text
    assert page.tree is page.tree
    assert page.truncated is False


def test_page_body_must_be_bytes():
    with pytest.raises(ValueError, match="bytes"):
        Page(URL, "<p>text</p>")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        ("", URL),
        ('<base href="/other/">', "http://example.com/other/"),
        ('<base href="https://cdn.example.net/x/">', "https://cdn.example.net/x/"),
        ('<base target="_top"><base href=" sub/ ">', "http://example.com/dir/sub/"),
        ('<base href="/first/"><base href="/second/">', "http://example.com/first/"),
        ('<base href="javascript:alert(1)">', URL),
        ('<base href="http://[broken">', URL),
    ],
    ids=["none", "root-relative", "absolute", "first-with-href", "first-wins", "javascript", "malformed"],
)
def test_base_url(head: str, expected: str):
    assert Page(URL, f"<html><head>{head}</head><body></body></html>".encode()).base_url == expected


# --- links ----------------------------------------------------------------------------------------

LINK_CASES = [
    ("<a href='b.html'>B</a>", [("http://example.com/dir/b.html", "B", "a")]),
    ("<a href='/root'>R</a>", [("http://example.com/root", "R", "a")]),
    ("<a href='../up'>U</a>", [("http://example.com/up", "U", "a")]),
    ("<a href='//cdn.example.org/x'>P</a>", [("http://cdn.example.org/x", "P", "a")]),
    ("<a href='https://other.org/y?q=1'>A</a>", [("https://other.org/y?q=1", "A", "a")]),
    ("<a href='?page=2'>Q</a>", [("http://example.com/dir/page.html?page=2", "Q", "a")]),
    ("<a href='#top'>F</a>", [("http://example.com/dir/page.html#top", "F", "a")]),
    ("<a href=' \n /spaced \t'>S</a>", [("http://example.com/spaced", "S", "a")]),
    (
        "<base href='http://base.example/b/'><a href='rel'>R</a><a href='/abs'>A</a>",
        [("http://base.example/b/rel", "R", "a"), ("http://base.example/abs", "A", "a")],
    ),
    ("<a href='/x'>  Hello \n\t <b>big</b>\u00a0  world </a>", [("http://example.com/x", "Hello big world", "a")]),
    (
        "<a href='/x'><img src='/i.png' alt=' Logo  alt '></a>",
        [
            ("http://example.com/x", "Logo alt", "a"),
            ("http://example.com/i.png", "Logo alt", "img"),
        ],
    ),
    ("<img src='pic.jpg' alt='A picture'>", [("http://example.com/dir/pic.jpg", "A picture", "img")]),
    ("<img src='pic.jpg' title='Titled'>", [("http://example.com/dir/pic.jpg", "Titled", "img")]),
    ("<img src='pic.jpg'>", [("http://example.com/dir/pic.jpg", "", "img")]),
    ("<a href='/t' title='Tip'></a>", [("http://example.com/t", "Tip", "a")]),
    (
        "<link rel='stylesheet' href='s.css'><script src='/app.js'></script><iframe src='f.html'></iframe>"
        "<form action='/search'></form><video src='v.mp4'><source src='v.webm'></video>"
        "<map><area href='/area' alt='Zone'></map>",
        [
            ("http://example.com/dir/s.css", "", "link"),
            ("http://example.com/app.js", "", "script"),
            ("http://example.com/dir/f.html", "", "iframe"),
            ("http://example.com/search", "", "form"),
            ("http://example.com/dir/v.mp4", "", "video"),
            ("http://example.com/dir/v.webm", "", "source"),
            ("http://example.com/area", "Zone", "area"),
        ],
    ),
    (
        "<a href='/same'>one</a><a href='/same'>one</a><a href='/same'>two</a><img src='/same' alt='one'>",
        [
            ("http://example.com/same", "one", "a"),
            ("http://example.com/same", "two", "a"),
            ("http://example.com/same", "one", "img"),
        ],
    ),
    ("<a name='anchor-only'>no href</a><!-- <a href='/commented'>c</a> -->", []),
]


@pytest.mark.parametrize(("html", "expected"), LINK_CASES)
def test_links_are_absolute_in_document_order(html: str, expected: list[tuple[str, str, str]]):
    result = links_of(html)
    assert triples(result) == expected
    assert result["count"] == len(expected)
    assert result["skipped"] == 0


@pytest.mark.parametrize(
    "href",
    [
        "javascript:void(0)",
        " JavaScript:alert(1)",
        "java\nscript:alert(1)",
        "mailto:a@b.c",
        "tel:+123",
        "data:text/html,<p>x</p>",
        "vbscript:msgbox",
        "http://[::1",
    ],
)
def test_skipped_links_are_counted(href: str):
    result = links_of(f"<a href='/kept'>k</a><a href='{href}'>skip</a>")
    assert triples(result) == [("http://example.com/kept", "k", "a")]
    assert result["skipped"] == 1
    [(tag, reasons)] = result["skipped_by"].items()
    assert tag == "a" and sum(reasons.values()) == 1 and set(reasons) <= {"scheme", "malformed"}


@pytest.mark.parametrize("href", ["", "   ", "#top"])
def test_an_empty_href_is_the_page_itself_as_in_a_browser(href: str):
    result = links_of(f"<a href='{href}'>self</a>")
    assert triples(result) == [(URL + href.strip(), "self", "a")]
    assert result["skipped"] == 0


def test_links_result_shape_and_rel():
    result = links_of("<a href='/x' rel=' NoFollow   UGC '>x</a><img src='/i'>")
    assert set(result) == {"url", "links", "count", "skipped", "skipped_by"}
    assert result["url"] == URL
    assert result["links"] == [
        {"url": "http://example.com/x", "text": "x", "tag": "a", "attr": "href", "rel": "nofollow ugc"},
        {"url": "http://example.com/i", "text": "", "tag": "img", "attr": "src", "rel": None},
    ]
    json.dumps(result, allow_nan=False)


# --- fields ---------------------------------------------------------------------------------------

FIELDS_HTML = b"""<html><head><title>
  The   Title
</title><meta name="description" content="  A page  "></head>
<body>
  <h1 class="headline">Big <em>news</em>
  today</h1>
  <ul id="tags">
    <li>alpha</li>
    <li> beta </li>
    <li></li>
  </ul>
  <a name="top">anchor</a>
  <a href="/one" class="nav">One</a>
  <a href="/two" class="nav">Two</a>
  <p>para <b>bold</b> tail</p>
</body></html>"""

FIELD_CASES = [
    ("css-text", FieldRule(css="h1.headline"), "Big news today"),
    ("css-attr", FieldRule(css="meta[name=description]", attr="content"), "A page"),
    ("css-attr-skips-elements-without-it", FieldRule(css="a", attr="href"), "/one"),
    ("css-all", FieldRule(css="#tags li", all=True), ["alpha", "beta", ""]),
    ("css-attr-all", FieldRule(css="a.nav", attr="href", all=True), ["/one", "/two"]),
    ("css-contains", FieldRule(css="a:contains('Two')", attr="href"), "/two"),
    ("css-html-case-insensitive", FieldRule(css="H1", attr="CLASS"), "headline"),
    ("css-no-match", FieldRule(css="h6"), None),
    ("css-no-match-all", FieldRule(css="h6", all=True), []),
    ("css-missing-attr", FieldRule(css="h1", attr="data-x"), None),
    ("xpath-text-node", FieldRule(xpath="//h1/text()"), "Big"),
    ("xpath-text-nodes-all", FieldRule(xpath="//p//text()", all=True), ["para", "bold", "tail"]),
    ("xpath-whitespace-text-nodes-dropped", FieldRule(xpath="//ul/text()", all=True), []),
    ("xpath-element", FieldRule(xpath="//title"), "The Title"),
    ("xpath-attribute-node", FieldRule(xpath="//meta/@content"), "A page"),
    ("xpath-string-function", FieldRule(xpath="string(//title)"), "The Title"),
    ("xpath-count", FieldRule(xpath="count(//a)"), 3.0),
    ("xpath-count-all", FieldRule(xpath="count(//a)", all=True), [3.0]),
    ("xpath-boolean", FieldRule(xpath="boolean(//h1)"), True),
    ("xpath-boolean-false", FieldRule(xpath="boolean(//h6)"), False),
    ("xpath-nan-is-null", FieldRule(xpath="number('x')"), None),
    ("xpath-no-match", FieldRule(xpath="//h6"), None),
    ("xpath-no-match-all", FieldRule(xpath="//h6", all=True), []),
    ("xpath-attr-on-elements", FieldRule(xpath="//a[@href]", attr="href", all=True), ["/one", "/two"]),
    ("from-value-css", FieldRule.from_value("t", "title"), "The Title"),
    ("from-value-xpath", FieldRule.from_value("t", "xpath://a[2]"), "One"),
]


@pytest.mark.parametrize(("name", "rule", "expected"), FIELD_CASES, ids=[case[0] for case in FIELD_CASES])
def test_field_values(name: str, rule: FieldRule, expected: object):
    result = fields_analyzer.analyze(Page(URL, FIELDS_HTML), {name: rule})
    assert result == {"url": URL, "fields": {name: expected}}
    json.dumps(result, allow_nan=False)


def test_fields_gives_one_record_with_every_rule():
    # Several selectors on one tree; lxml's own CSSSelector fails :contains() after another XPath ran.
    rules = {
        "n": FieldRule(xpath="count(//a)"),
        "title": FieldRule(css="title"),
        "links": FieldRule(css="a.nav", attr="href", all=True),
        "two": FieldRule(css="a:contains('Two')", attr="href"),
    }
    page = Page(URL, FIELDS_HTML)
    expected = {"url": URL, "fields": {"n": 3.0, "title": "The Title", "links": ["/one", "/two"], "two": "/two"}}
    assert run_analysis(page, "fields", rules) == expected
    assert run_analysis(page, "fields", rules) == expected


@pytest.mark.parametrize(
    ("rule", "field", "problem"),
    [
        (FieldRule(css="a["), "fields.bad.css", "invalid CSS selector"),
        (FieldRule(css="div >"), "fields.bad.css", "invalid CSS selector"),
        (FieldRule(css="a::attr(href)"), "fields.bad.css", "use the attr key"),
        (FieldRule(xpath="//a["), "fields.bad.xpath", "invalid XPath expression"),
        (FieldRule(xpath="//a/@@href"), "fields.bad.xpath", "invalid XPath expression"),
        (FieldRule(xpath="no-such-function()"), "fields.bad.xpath", "Unregistered function"),
        (FieldRule(xpath="$undefined"), "fields.bad.xpath", "Undefined variable"),
        (FieldRule(xpath="//p[re:test(., '^(a+)+$')]"), "fields.bad.xpath", ""),
        (FieldRule(), "fields.bad", "exactly one of css or xpath"),
        (FieldRule(css="a", xpath="//a"), "fields.bad", "exactly one of css or xpath"),
    ],
    ids=[
        "css-bracket",
        "css-dangling",
        "css-pseudo-element",
        "xpath-bracket",
        "xpath-axis",
        "xpath-function",
        "xpath-variable",
        "xpath-exslt-regex-refused",
        "neither",
        "both",
    ],
)
def test_bad_rules_are_refused(rule: FieldRule, field: str, problem: str):
    for check in (compile_rules, check_rules):
        with pytest.raises(InvalidTask) as caught:
            check({"ok": FieldRule(css="p"), "bad": rule})
        assert caught.value.field == field
        assert problem in caught.value.problem


@pytest.mark.parametrize("rules", [None, {}], ids=["none", "empty"])
def test_fields_analyzer_needs_rules(rules: dict | None):
    with pytest.raises(InvalidTask) as caught:
        fields_analyzer.analyze(Page(URL, FIELDS_HTML), rules)
    assert caught.value.field == "fields"


def test_check_rules_accepts_good_rules_and_none():
    check_rules(None)
    check_rules({"title": FieldRule(css="title"), "n": FieldRule(xpath="count(//a)")})


def test_compiled_rules_are_reusable_across_pages():
    extractors = compile_rules({"h": FieldRule(css="h1")})
    assert extractors["h"](Page(URL, b"<h1>first</h1>").tree) == "first"
    assert extractors["h"](Page(URL, b"<h1>second</h1>").tree) == "second"


# --- registry -------------------------------------------------------------------------------------

PLUGIN_SOURCE = """
from __future__ import annotations

IMPORTS = []
IMPORTS.append(1)
NOT_CALLABLE = 42


def title(page, rules):
    return {"url": page.url, "title": page.tree.findtext(".//title")}


def not_a_dict(page, rules):
    return ["oops"]
"""
PLUGIN = "vcrawl_fake_analyzer_plugin"
BROKEN = "vcrawl_broken_analyzer_plugin"


@pytest.fixture
def plugin_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Write a working and a broken plugin module to an importable directory."""
    (tmp_path / f"{PLUGIN}.py").write_text(textwrap.dedent(PLUGIN_SOURCE))
    (tmp_path / f"{BROKEN}.py").write_text("raise RuntimeError('plugin exploded at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in (PLUGIN, BROKEN):
        sys.modules.pop(name, None)


def entry_point(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group=GROUP)


@pytest.mark.usefixtures("plugin_modules")
def test_plugin_from_entry_point_is_found_and_run():
    registry = Registry(entry_points=[entry_point("title", f"{PLUGIN}:title")])
    assert registry.names() == ["fields", "links", "title"]
    page = Page(URL, b"<title>Plugged</title>")
    assert registry.run(page, "title", None) == {"url": URL, "title": "Plugged"}
    assert registry.get("links") is links_analyzer.analyze
    assert sys.modules[PLUGIN].IMPORTS == [1]


def test_unknown_analyzer_lists_known_names():
    with pytest.raises(UnknownComponent) as caught:
        Registry(entry_points=[]).get("nope")
    assert (caught.value.kind, caught.value.name, caught.value.known) == ("analyzer", "nope", ["fields", "links"])
    assert "fields, links" in str(caught.value)


@pytest.mark.parametrize(
    ("entry_points", "messages"),
    [
        pytest.param(
            [("links", f"{PLUGIN}:title")],
            ["'links = vcrawl_fake_analyzer_plugin:title'", "built-in"],
            id="collides-with-builtin",
        ),
        pytest.param(
            [("title", f"{PLUGIN}:title"), ("title", f"{PLUGIN}:not_a_dict")],
            [f"'title = {PLUGIN}:title'", f"'title = {PLUGIN}:not_a_dict'"],
            id="collides-with-plugin",
        ),
        pytest.param(
            [("gone", "no_such_module_here:analyze")], ["'gone = no_such_module_here:analyze'"], id="module-missing"
        ),
        pytest.param(
            [("boom", f"{BROKEN}:analyze")], [f"'boom = {BROKEN}:analyze'", "plugin exploded"], id="import-raises"
        ),
        pytest.param([("noattr", f"{PLUGIN}:missing")], [f"'noattr = {PLUGIN}:missing'"], id="attribute-missing"),
        pytest.param([("num", f"{PLUGIN}:NOT_CALLABLE")], ["not a callable"], id="not-callable"),
    ],
)
@pytest.mark.usefixtures("plugin_modules")
def test_bad_plugins_are_config_errors_on_first_lookup(entry_points: list[tuple[str, str]], messages: list[str]):
    registry = Registry(entry_points=[entry_point(name, value) for name, value in entry_points])  # lazy: no error
    with pytest.raises(ConfigError) as caught:
        registry.get("links")
    for message in messages:
        assert message in str(caught.value)


@pytest.mark.usefixtures("plugin_modules")
def test_the_same_entry_point_seen_twice_is_one_plugin():
    twice = [entry_point("title", f"{PLUGIN}:title"), entry_point("title", f"{PLUGIN}:title")]
    assert Registry(entry_points=twice).names() == ["fields", "links", "title"]


@pytest.mark.usefixtures("plugin_modules")
def test_analyzer_returning_no_dict_is_refused():
    registry = Registry(entry_points=[entry_point("bad", f"{PLUGIN}:not_a_dict")])
    with pytest.raises(ConfigError, match="'bad' returned list"):
        registry.run(Page(URL, b""), "bad", None)


@pytest.mark.usefixtures("plugin_modules")
def test_installed_entry_points_are_read_once_and_lazily(monkeypatch: pytest.MonkeyPatch):
    calls = []

    def fake_entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        calls.append(group)
        return [entry_point("title", f"{PLUGIN}:title")]

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    registry = Registry()
    assert calls == []
    registry.get("title")
    registry.get("links")
    registry.load()
    assert calls == [GROUP]


def test_default_registry_serves_the_builtins():
    assert get_analyzer("links") is links_analyzer.analyze
    assert get_analyzer("fields") is fields_analyzer.analyze
    assert {"links", "fields"} <= set(analyzer_names())
    result = run_analysis(Page(URL, b"<a href='x'>x</a>"), "links", None)
    assert triples(result) == [("http://example.com/dir/x", "x", "a")]
    with pytest.raises(UnknownComponent):
        run_analysis(Page(URL, b""), "no-such-analyzer", None)


def test_links_past_the_parsers_depth_limit_are_read_tag_by_tag() -> None:
    body = (
        b'<html><body><a href="/before.html">before</a>' + b"<b>" * 5000
        + b'<a href="/deep.html" rel="NoFollow">deep <i>link</i></a><a href="/pic.html"><img alt="a picture"></a>'
        + b'<a href="mailto:x@y.test">mail</a><img src="/i.png" title="icon"><a href="">empty</a>'
    )  # fmt: skip
    page = Page("http://h.test/dir/x", body, "text/html")
    assert page.truncated
    result = links_analyzer.analyze(page)
    assert [(link["url"], link["text"], link["tag"], link["rel"]) for link in result["links"]] == [
        ("http://h.test/before.html", "before", "a", None),
        ("http://h.test/deep.html", "deep link", "a", "nofollow"),
        ("http://h.test/pic.html", "a picture", "a", None),
        ("http://h.test/i.png", "icon", "img", None),
        ("http://h.test/dir/x", "empty", "a", None),  # an empty href is the page itself, as in a browser
    ]
    assert result["skipped_by"] == {"a": {"scheme": 1}}


FOLLOW_PAGE = (
    "<base href='http://example.com/b/'><a href='x'>x</a><a href='x'>again</a><img src='/i.png'>"
    "<area href='/map'><iframe src='frame.html'></iframe><frame src='/f'><link href='/style.css'>"
    "<script src='/s.js'></script><a href='javascript:void(0)'>js</a><a href=''>empty</a><a href='mailto:a@b'>m</a>"
    "<a href='http://[::1'>bad</a><a>no href</a><form action='/post'></form>"
)


@pytest.mark.parametrize("deep", [False, True], ids=["tree", "past-the-depth-limit"])
def test_followed_links_are_the_navigation_targets_of_the_links_analyzer(deep: bool) -> None:
    body = (FOLLOW_PAGE + ("<b>" * 5000 + "<a href='/deep'>d</a>" if deep else "")).encode()
    page = Page(URL, body)
    assert page.truncated is deep
    urls, skipped = links_analyzer.followed_links(page)

    full = links_analyzer.analyze(Page(URL, body))
    navigation = [link["url"] for link in full["links"] if link["tag"] in links_analyzer.FOLLOWED_TAGS]
    assert urls == list(dict.fromkeys(navigation))  # document order, each once
    assert urls[:4] == ["http://example.com/b/x", "http://example.com/map", "http://example.com/b/frame.html",
                        "http://example.com/f"]  # fmt: skip
    assert "http://example.com/b/" in urls  # the empty href: the base itself
    assert skipped == {"scheme": 2, "malformed": 1}
    assert sum(full["skipped_by"]["a"].values()) == sum(skipped.values())


# --- links read from the parser's events, without a tree -------------------------------------------


def test_links_are_read_without_building_a_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_tree(url: str, text: str) -> None:
        pytest.fail("the links were read from a tree")

    monkeypatch.setattr(page_module, "_parse", no_tree)
    page = Page(URL, b"<base href='/b/'><a href='x'>x <img alt='i'></a><area href='/m' alt='map'>")
    assert triples(links_analyzer.analyze(page)) == [("http://example.com/b/x", "x", "a"),
                                                     ("http://example.com/m", "map", "area")]  # fmt: skip
    # A crawl's view of a page past TREE_MOST characters is streamed too (a small page's is its tree's).
    big = Page(
        URL, b"<base href='/b/'><a href='x'>x</a><!--" + b"." * links_analyzer.TREE_MOST + b"--><area href='/m'>"
    )
    assert links_analyzer.followed_links(big) == (["http://example.com/b/x", "http://example.com/m"], {})


@pytest.mark.parametrize(
    "body",
    [
        FOLLOW_PAGE.encode(),
        b"<a href='/in'>in</a></html><a href='/after'>after</a><base href='/b/'>",
        b"<base><base href='/b/'><base href='/c/'><a href=x><frame src=f><iframe src='//h.test/i'><a>",
        b"<a href='x'>" * 30 + b"<area href='y'>" * 30,
        "<meta charset=windows-1251><base href='/s?q=Привет'><a href='?q=Привет'>".encode("windows-1251"),
        b"",
    ],
)
def test_a_crawls_view_read_from_the_tree_is_the_streamed_one(body: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    from_tree = links_analyzer.followed_links(Page(URL, body, max_links=40))
    monkeypatch.setattr(links_analyzer, "TREE_MOST", -1)
    assert links_analyzer.followed_links(Page(URL, body, max_links=40)) == from_tree


@pytest.mark.parametrize("inner", [TREE_DEPTH_LIMIT - 4, TREE_DEPTH_LIMIT - 3], ids=["at-the-limit", "one-deeper"])
def test_the_streamed_depth_limit_is_libxml2s(inner: int) -> None:
    # <html>, <body>, the <b>s, <a>, <i>: a tree holds TREE_DEPTH_LIMIT levels, and a page whose tree
    # stops there has its links read tag by tag. The <base> above the limit counts either way.
    body = b"<base href='/b/'>" + b"<b>" * inner + b"<a href='x'>deep <i>link</i></a>"
    page = Page(URL, body)
    assert page.truncated is (inner + 4 > TREE_DEPTH_LIMIT)
    assert triples(links_analyzer.analyze(page)) == [("http://example.com/b/x", "deep link", "a")]
    assert links_analyzer.followed_links(page) == (["http://example.com/b/x"], {})


def test_markup_after_the_root_element_is_read_as_the_tree_reads_it() -> None:
    # libxml2 puts what follows </html> into a second root, which Page.tree (the first root) does not hold.
    page = Page(URL, b"<a href='/in'>in</a></html><a href='/after'>after</a><base href='/b/'>")
    assert [link.get("href") for link in page.tree.iter("a")] == ["/in"]
    assert triples(links_analyzer.analyze(page)) == [("http://example.com/in", "in", "a")]
    assert links_analyzer.followed_links(page) == (["http://example.com/in"], {})


@pytest.mark.parametrize("deep", [False, True], ids=["tree", "past-the-depth-limit"])
def test_link_texts_are_cut_at_the_text_limit(deep: bool) -> None:
    limit = links_analyzer.TEXT_LIMIT
    words = " \n ".join(f"w{n}" for n in range(limit))  # whitespace runs collapse to one space
    body = ("<b>" * TREE_DEPTH_LIMIT if deep else "") + f"<a href='/long'>{words}</a><img src='/i' alt='{words}'>"
    result = links_of(body)
    assert [link["text"] for link in result["links"]] == [" ".join(words.split())[:limit].rstrip()] * 2


def test_nested_anchors_keep_bounded_texts() -> None:
    # Unclosed <a>s inside blocks stay open in libxml2's tree. As in a browser, a new <a> ends the text
    # of the open ones: only the last holds the text after it, cut at the limit.
    body = "".join(f"<a href='/n{n}'><div>" for n in range(1000)) + "text " * 250_000
    result = links_of(body)
    assert result["count"] == 1000
    assert [len(link["text"]) for link in result["links"]] == [0] * 999 + [links_analyzer.TEXT_LIMIT - 1]


def test_a_link_text_ends_where_the_next_link_starts() -> None:
    result = links_of("<a href='/1'>one <img alt='first'><a href='/2'>two <img alt='second'></a> after</a>")
    assert [(link["url"].rsplit("/", 1)[1], link["text"]) for link in result["links"]] == [("1", "one"), ("2", "two")]


def test_open_links_over_many_text_events_cost_one_read_each() -> None:
    # 1,000 open <a>s and whitespace text events (comments split them): each event was read by every
    # open link that had not filled its text, 4.9 s for these 60,000 (100 s for 10 MB). Now by one: 0.02 s.
    body = "<a href=x><span>" * 1000 + " <!---->" * 60_000
    started = time.process_time()
    result = links_of(body)
    assert result["count"] == 1  # the same href, the same (empty) text: listed once
    assert time.process_time() - started < 2.0


@pytest.mark.parametrize(
    ("charset", "query"),
    [
        ("windows-1251", "%CF%F0%E8%E2%E5%F2"),
        ("koi8-r", "%F0%D2%C9%D7%C5%D4"),
        ("utf-8", "%D0%9F%D1%80%D0%B8%D0%B2%D0%B5%D1%82"),
        ("iso-8859-1", "%26%231055%3B%26%231088%3B%26%231080%3B%26%231074%3B%26%231077%3B%26%231090%3B"),
    ],
)
def test_a_links_query_is_written_in_its_pages_encoding_as_browsers_do(charset: str, query: str) -> None:
    # The path is UTF-8 whatever the page's encoding; the query is in the page's (what it cannot write, &#N;).
    html = f'<meta charset="{charset}"><a href="/Привет?q=Привет#Привет">x</a>'
    page = Page("http://h.test/", html.encode(charset, "xmlcharrefreplace"))
    path = "/%D0%9F%D1%80%D0%B8%D0%B2%D0%B5%D1%82"
    fragment = "#%D0%9F%D1%80%D0%B8%D0%B2%D0%B5%D1%82"
    assert links_analyzer.followed_links(page)[0] == [f"http://h.test{path}?q={query}{fragment}"]
