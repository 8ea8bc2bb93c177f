"""Canonical URLs: one spelling per page, idempotent, and only ValueError for junk."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from urllib.parse import urljoin

import pytest

from frontier.urls import DEFAULT_TRACKING_PARAMS, canonical_url, dedup_key, host_key, origin

BASE = "http://example.com/a/b/page.html?x=1#top"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # scheme and host case, default ports
        ("HTTP://Example.COM/Path", "http://example.com/Path"),
        ("http://example.com:80/", "http://example.com/"),
        ("https://example.com:443/x", "https://example.com/x"),
        ("http://example.com:443/", "http://example.com:443/"),
        ("https://example.com:80/", "https://example.com:80/"),
        ("http://127.0.1.1:8800/a", "http://127.0.1.1:8800/a"),
        ("http://example.com:0080/", "http://example.com/"),
        ("http://example.com:/x", "http://example.com/x"),
        ("http://example.com./", "http://example.com/"),
        ("http://user:secret@Example.com/", "http://example.com/"),
        # empty path
        ("http://example.com", "http://example.com/"),
        ("http://example.com?q=1", "http://example.com/?q=1"),
        # percent-escapes as written (a browser sends them so; dedup_key normalises them)
        ("http://example.com/%7euser", "http://example.com/%7euser"),
        ("http://example.com/%7Euser", "http://example.com/%7Euser"),
        ("http://example.com/~user", "http://example.com/~user"),
        ("http://example.com/%41%62%2d", "http://example.com/%41%62%2d"),
        ("http://example.com/a%2fb", "http://example.com/a%2fb"),
        ("http://example.com/a%3fb", "http://example.com/a%3fb"),
        ("http://example.com/foo%2zbar", "http://example.com/foo%2zbar"),
        ("http://example.com/a[b]|c^", "http://example.com/a[b]|c%5E"),
        ("http://example.com/100%", "http://example.com/100%"),
        ("http://example.com/a b", "http://example.com/a%20b"),
        ("http://example.com/?q=a b", "http://example.com/?q=a%20b"),
        ("http://example.com/?q=a+b&r=a%20b", "http://example.com/?q=a+b&r=a%20b"),
        ("http://example.com/?q=%7e%2f", "http://example.com/?q=%7e%2f"),
        # UTF-8 path and query, IDN host to punycode (nothing is resolved)
        ("http://example.com/ü", "http://example.com/%C3%BC"),
        ("http://example.com/%c3%bc", "http://example.com/%c3%bc"),
        ("http://example.com/?q=ü", "http://example.com/?q=%C3%BC"),
        ("http://bücher.example/", "http://xn--bcher-kva.example/"),
        ("http://BÜCHER.example/", "http://xn--bcher-kva.example/"),
        ("http://xn--bcher-kva.example/", "http://xn--bcher-kva.example/"),
        ("http://例え.テスト/", "http://xn--r8jz45g.xn--zckzah/"),
        # fragments
        ("http://example.com/a#frag", "http://example.com/a"),
        ("http://example.com/a?b=1#frag", "http://example.com/a?b=1"),
        ("http://example.com/#", "http://example.com/"),
        # tracking parameters, any case, prefix utm_*, percent-encoded names
        ("http://example.com/?utm_source=x&id=1", "http://example.com/?id=1"),
        ("http://example.com/?UTM_SOURCE=x&Utm_Medium=y&id=1", "http://example.com/?id=1"),
        ("http://example.com/?utm_whatever=1", "http://example.com/"),
        ("http://example.com/?utm%5Fsource=1&a=2", "http://example.com/?a=2"),
        ("http://example.com/?fbclid=1&gclid=2&_ga=3&mc_cid=4&igshid=5", "http://example.com/"),
        ("http://example.com/?PHPSESSID=abc&page=2", "http://example.com/?page=2"),
        ("http://example.com/?utmost=1", "http://example.com/?utmost=1"),
        # session ids as path parameters
        ("http://example.com/cart;jsessionid=ABC", "http://example.com/cart"),
        ("http://example.com/cart;JSESSIONID=ABC?x=1", "http://example.com/cart?x=1"),
        ("http://example.com/a;jsessionid=ABC;v=2/b", "http://example.com/a;v=2/b"),
        ("http://example.com/a;v=2", "http://example.com/a;v=2"),
        # query: in the order written (robots.txt rules match it so), blanks kept, empty pieces dropped
        ("http://example.com/?b=2&a=1", "http://example.com/?b=2&a=1"),
        ("http://example.com/?c=red&a=1&c=blue", "http://example.com/?c=red&a=1&c=blue"),
        ("http://example.com/?flag&a=", "http://example.com/?flag&a="),
        (
            "http://h.example/foo/bar?qux=taz&baz=http://foo.bar?tar&par",
            "http://h.example/foo/bar?qux=taz&baz=http://foo.bar?tar&par",
        ),
        ("http://example.com/?&&a=1&", "http://example.com/?&&a=1&"),
        ("http://example.com/?&&utm_source=1&a=1&", "http://example.com/?&&a=1&"),
        ("http://example.com/?", "http://example.com/?"),
        ("http://example.com/?utm_source=1", "http://example.com/"),
        # dot segments, also percent-encoded ones
        ("http://example.com/a/./b/../c", "http://example.com/a/c"),
        ("http://example.com/../../x", "http://example.com/x"),
        ("http://example.com/a/b/..", "http://example.com/a/"),
        ("http://example.com/a/%2e%2E/b", "http://example.com/b"),
        ("http://example.com/a//b", "http://example.com/a//b"),
        # whitespace around, tabs and newlines inside (WHATWG), backslashes as slashes
        ("  http://example.com/x \n", "http://example.com/x"),
        ("http://exa\nmple.com/a\t/b\r\n", "http://example.com/a/b"),
        ("http:\\\\example.com\\a\\b", "http://example.com/a/b"),
        # IPv6
        ("http://[::1]:8080/", "http://[::1]:8080/"),
        ("http://[0:0:0:0:0:0:0:1]/", "http://[::1]/"),
        ("https://[::1]:443/x", "https://[::1]/x"),
        ("http://[2001:DB8::1]/", "http://[2001:db8::1]/"),
        # other schemes: stripped, scheme lowercased, otherwise untouched
        ("javascript:alert(1)", "javascript:alert(1)"),
        ("JavaScript:void(0)", "javascript:void(0)"),
        ("mailto:Someone@Example.com", "mailto:Someone@Example.com"),
        (" data:text/plain,Hi#x ", "data:text/plain,Hi#x"),
        ("FTP://Example.com/x", "ftp://Example.com/x"),
    ],
)
def test_canonical_form(url: str, expected: str) -> None:
    assert canonical_url(url) == expected


@pytest.mark.parametrize(
    ("href", "expected"),
    [
        ("../x", "http://example.com/a/x"),
        ("x.html", "http://example.com/a/b/x.html"),
        ("./x/../y", "http://example.com/a/b/y"),
        ("/root", "http://example.com/root"),
        ("//Other.example/x", "http://other.example/x"),
        ("https://secure.example/", "https://secure.example/"),
        ("?q=1", "http://example.com/a/b/page.html?q=1"),
        ("#frag", "http://example.com/a/b/page.html?x=1"),
        ("", "http://example.com/a/b/page.html?x=1"),
        ("  \n\t ", "http://example.com/a/b/page.html?x=1"),
        (" /a\n/b ", "http://example.com/a/b"),
        ("x y", "http://example.com/a/b/x%20y"),
        ("mailto:a@b.example", "mailto:a@b.example"),
        ("javascript:void(0)", "javascript:void(0)"),
    ],
)
def test_relative_links_resolve_against_the_base(href: str, expected: str) -> None:
    assert canonical_url(href, BASE) == expected


RFC3986_BASE = "http://a/b/c/d;p?q"
# RFC 3986 section 5.4, canonicalized (no fragment, "/" for an empty path).
RFC3986_EXAMPLES = {
    "g:h": "g:h",
    "g": "http://a/b/c/g",
    "./g": "http://a/b/c/g",
    "g/": "http://a/b/c/g/",
    "/g": "http://a/g",
    "//g": "http://g/",
    "?y": "http://a/b/c/d;p?y",
    "g?y": "http://a/b/c/g?y",
    "#s": "http://a/b/c/d;p?q",
    "g#s": "http://a/b/c/g",
    "g?y#s": "http://a/b/c/g?y",
    ";x": "http://a/b/c/;x",
    "g;x": "http://a/b/c/g;x",
    "g;x?y#s": "http://a/b/c/g;x?y",
    "": "http://a/b/c/d;p?q",
    ".": "http://a/b/c/",
    "./": "http://a/b/c/",
    "..": "http://a/b/",
    "../": "http://a/b/",
    "../g": "http://a/b/g",
    "../..": "http://a/",
    "../../": "http://a/",
    "../../g": "http://a/g",
    "../../../g": "http://a/g",
    "../../../../g": "http://a/g",
    "/./g": "http://a/g",
    "/../g": "http://a/g",
    "g.": "http://a/b/c/g.",
    ".g": "http://a/b/c/.g",
    "g..": "http://a/b/c/g..",
    "..g": "http://a/b/c/..g",
    "./../g": "http://a/b/g",
    "./g/.": "http://a/b/c/g/",
    "g/./h": "http://a/b/c/g/h",
    "g/../h": "http://a/b/c/h",
    "g;x=1/./y": "http://a/b/c/g;x=1/y",
    "g;x=1/../y": "http://a/b/c/y",
    "g?y/./x": "http://a/b/c/g?y/./x",
    "g?y/../x": "http://a/b/c/g?y/../x",
    "g#s/./x": "http://a/b/c/g",
    "http:g": "http://a/b/c/g",  # the backward-compatible reading (RFC 3986 5.4.2), as urljoin does
    # RFC 3986 and WHATWG: a bare "?" is an empty query; urljoin keeps the base query (a Python quirk).
    "?": "http://a/b/c/d;p?",
}


@pytest.mark.parametrize(("href", "expected"), RFC3986_EXAMPLES.items())
def test_rfc3986_reference_resolution(href: str, expected: str) -> None:
    assert canonical_url(href, RFC3986_BASE) == expected


@pytest.mark.parametrize(
    "base", [RFC3986_BASE, "https://Ex.example", "http://ex.example/dir/", "http://u@ex.example:81/a?y#f"]
)
@pytest.mark.parametrize("href", [h for h in RFC3986_EXAMPLES if h != "?"])
def test_joining_agrees_with_urljoin(base: str, href: str) -> None:
    assert _outcome(lambda: canonical_url(href, base)) == _outcome(lambda: canonical_url(urljoin(base, href)))


def _outcome(call: Callable[[], str]) -> str:
    try:
        return call()
    except ValueError:
        return "ValueError"


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "relative/path",
        "/absolute/path",
        "//host.example/x",
        "http://",
        "https://",
        "http://[::1",
        "http://[::1]x/",
        "http://[not-ipv6]/",
        "http://exa mple.com/",
        "http://a..b/",
        "http://.example.com/",
        "http://:80/",
        "http://@/",
        "http://example.com:99999/",
        "http://example.com:abc/",
        "http://example.com:0/",
    ],
)
def test_unparseable_urls_raise_value_error(url: str) -> None:
    with pytest.raises(ValueError):
        canonical_url(url)


def test_junk_raises_only_value_error() -> None:
    rng = random.Random(20240501)
    pieces = ["http://", "HTTPS://", "//", "/", "..", ".", "?", "#", "[", "]", "::1", "@", ":", "%", "%2e", "%zz"]
    pieces += ["ex.com", "bücher.de", ";jsessionid=1", "utm_source=1&", "\\", " ", "\n", "\x00", "mailto:", ":99999"]
    alphabet = "abcXYZ019-._~!$&'()*+,;=%/?#[]@ \t\nü€\x7f"
    for _ in range(3000):
        text = "".join(
            rng.choice(pieces) if rng.random() < 0.6 else rng.choice(alphabet) for _ in range(rng.randint(0, 9))
        )
        base = rng.choice([None, BASE, "https://[::1]:8080/x/", "mailto:x", "junk"])
        try:
            result = canonical_url(text, base)
        except ValueError:
            continue
        assert canonical_url(result) == result, (text, base)


def _variants() -> list[str]:
    hosts = ["Example.COM", "bücher.example", "127.0.0.1:8080", "[::1]", "example.com:80", "u:p@example.com."]
    paths = ["", "/", "/a/./b/../c", "/%7euser/a b", "/ü/%c3%bc", "/cart;jsessionid=X", "/a%2fb"]
    queries = ["", "?b=2&a=1", "?utm_source=x&q=%7e", "?c=2&c=1&flag", "?q=a+b%20c"]
    fragments = ["", "#frag"]
    combos = itertools.product(["http", "HTTPS"], hosts, paths, queries, fragments)
    return [f"{s}://{h}{p}{q}{f}" for s, h, p, q, f in combos][::8]


def test_canonical_url_is_idempotent() -> None:
    variants = _variants()
    assert len(variants) >= 100
    for url in variants:
        once = canonical_url(url)
        assert canonical_url(once) == once, url


def test_equivalent_spellings_meet() -> None:
    spellings = [
        "HTTP://WWW.Example.com:80/a/./b/../c/%7euser?utm_source=n&a=1&b=2#x",
        "http://www.example.com/a/c/~user?a=1&b=2",
        "http://www.example.com/a/c/%7Euser?a=1&gclid=9&b=2",
        " http://www.example.com./a/c/~user?a=1&b=2&fbclid=1 ",
    ]
    assert len({dedup_key(canonical_url(s)) for s in spellings}) == 1


def test_very_long_url_is_kept_whole() -> None:
    url = "http://example.com/" + "a" * 10_000 + "?q=" + "z" * 5_000
    assert canonical_url(url) == url


@pytest.mark.parametrize(
    ("drop", "expected"),
    [
        ({"page"}, "http://example.com/?utm_source=x&q=1"),
        (["PAGE", "utm_*"], "http://example.com/?q=1"),
        (frozenset(), "http://example.com/?utm_source=x&page=2&q=1"),
        (lambda name: name.startswith("p"), "http://example.com/?utm_source=x&q=1"),
    ],
)
def test_drop_params_can_be_replaced(drop: object, expected: str) -> None:
    assert canonical_url("http://example.com/?utm_source=x&page=2&q=1", drop_params=drop) == expected  # type: ignore[arg-type]


def test_drop_params_refuses_a_bare_string() -> None:
    with pytest.raises(ValueError):
        canonical_url("http://example.com/?a=1", drop_params="a")


def test_default_tracking_params_cover_the_documented_names() -> None:
    names = "utm_source utm_medium utm_campaign utm_term utm_content utm_id fbclid gclid dclid msclkid mc_cid"
    names += " mc_eid yclid igshid _ga jsessionid phpsessid sid sessionid aspsessionid utm_*"
    assert set(names.split()) <= DEFAULT_TRACKING_PARAMS


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # what a browser requests for these (WHATWG), once thought junk
        ("http:///x", "http://x/"),
        ("http://%65xample.com/", "http://example.com/"),
        ("http:example.com", "http://example.com/"),
    ],
)
def test_urls_a_browser_reads(url: str, expected: str) -> None:
    assert canonical_url(url) == expected


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("http://example.com/%7euser", "http://example.com/~user"),
        ("http://example.com/%41%62%2d", "http://example.com/Ab-"),
        ("http://example.com/a%2fb?q=%7e%2f", "http://example.com/a%2Fb?q=~%2F"),
        ("http://example.com/100%", "http://example.com/100%"),
        ("http://example.com/a?b", "http://example.com/a?b"),
    ],
)
def test_dedup_key_normalises_escapes(url: str, key: str) -> None:
    assert dedup_key(url) == key


def test_a_path_parameter_dropped_leaves_no_dot_segment_and_no_authority() -> None:
    assert canonical_url("http://h/a/..;jsessionid=2/b") == "http://h/b"
    assert canonical_url("http://h/;jsessionid=1/x") == "http://h//x"


@pytest.mark.parametrize(
    ("url", "key", "url_origin"),
    [
        ("http://example.com/a", "example.com", "http://example.com"),
        ("http://127.0.1.1:8800/x", "127.0.1.1:8800", "http://127.0.1.1:8800"),
        ("https://Example.com:443/", "example.com", "https://example.com"),
        ("http://example.com:443/", "example.com:443", "http://example.com:443"),
        ("https://example.com:80/", "example.com:80", "https://example.com:80"),
        ("http://[::1]:8080/", "[::1]:8080", "http://[::1]:8080"),
        ("https://[::1]/", "[::1]", "https://[::1]"),
        ("http://u:p@example.com/?q#f", "example.com", "http://example.com"),
    ],
)
def test_host_key_and_origin(url: str, key: str, url_origin: str) -> None:
    assert host_key(url) == key
    assert origin(url) == url_origin


@pytest.mark.parametrize("url", ["mailto:a@b.example", "/relative", "http://", "http://example.com:abc/"])
def test_host_key_needs_a_host(url: str) -> None:
    with pytest.raises(ValueError):
        host_key(url)
