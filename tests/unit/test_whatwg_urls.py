"""The fast paths of vcrawl.whatwg_urls give what ada-url (the WHATWG URL Standard) gives."""

from __future__ import annotations

import random

import ada_url
import pytest

from vcrawl.whatwg_urls import parse, resolve, serialized

_PIECES = [
    "a",
    "B",
    "0",
    "9",
    ".",
    "..",
    "/",
    "//",
    "?",
    "#",
    "%",
    "%2e",
    "%2E",
    "%41",
    "%zz",
    "'",
    "[",
    "]",
    "|",
    "^",
    "`",
    "{",
    "}",
    ":",
    "@",
    ";",
    "=",
    "&",
    "+",
    "!",
    "~",
    "_",
    "-",
    " ",
    "\t",
    "\\",
    "ü",
    "\x00",
    "*",
]
_HOSTS = [
    "h.test",
    "H.test",
    "127.0.1.1",
    "127.0.1.1:8800",
    "1.2.3",
    "1.2.3.04",
    "0x7f.0.0.1",
    "a..b",
    "h.test.",
    "xn--bcher-kva.example",
    "xn--zz.test",
    "h_1.test",
    "h:80",
    "h:0080",
    "h:65536",
    "h:443",
    "9.test",
    "t.9",
]


def _text(rng: random.Random, most: int) -> str:
    return "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, most)))


def _ada(call, *args: str) -> str | None:
    try:
        return call(*args)
    except ValueError:
        return None


def _ours(call, *args: str) -> str | None:
    try:
        return call(*args)
    except ValueError:
        return None


def test_a_url_called_serialized_is_what_the_standard_writes() -> None:
    rng = random.Random(36)
    plain = 0
    for _ in range(20_000):
        url = f"{rng.choice(['http', 'https'])}://{rng.choice(_HOSTS)}/{_text(rng, 8)}"
        if serialized(url):
            plain += 1
            assert ada_url.URL(url).href == url, url
        assert _ours(parse, url) == _ada(lambda u: ada_url.URL(u).href, url), url
    assert plain > 2_000


def test_a_link_resolved_without_the_parser_is_resolved_as_the_standard_resolves_it() -> None:
    rng = random.Random(37)
    bases = [
        "http://h.test/a/b.html",
        "http://h.test/",
        "http://127.0.1.1:8800/a/b/?q=1#f",
        "https://h.test/a/",
        "http://h.test/a/b?x",
        "http://h.test/%7e/x",
        "http://h.test//a",
    ]
    for _ in range(60_000):
        base, href = rng.choice(bases), _text(rng, 6)
        form = rng.randrange(4)  # relative; absolute; scheme-relative; relative after dot segments
        if form == 1:
            href = f"{rng.choice(['http', 'https', 'HTTP'])}://{rng.choice(_HOSTS)}/{href}"
        elif form == 2:
            href = f"//{rng.choice(_HOSTS)}/{href}"
        elif form == 3:
            href = rng.choice(["../", "./", "..", ".", "a/../", "../../", "/..", "/./", "a/./"]) + href
        assert _ours(resolve, base, href) == _ada(ada_url.join_url, base, href), (base, href)


@pytest.mark.parametrize(
    ("base", "href", "expected"),
    [
        ("http://h.test/a/b", "c", "http://h.test/a/c"),
        ("http://h.test/a/b", "/c?d#e", "http://h.test/c?d#e"),
        ("http://h.test/a/b?x#y", "", "http://h.test/a/b?x"),
        ("http://h.test/a/b?x#y", "#z", "http://h.test/a/b?x#z"),
        ("http://h.test/a/b?x", "?", "http://h.test/a/b?"),
        ("http://h.test/a/b", "./c/../d", "http://h.test/a/d"),
        ("http://h.test/a/b/c", "../../../..", "http://h.test/"),
        ("http://h.test/a/b", "./c/%2e%2e/d", "http://h.test/a/d"),  # "%2e" segments: the parser
        ("http://h.test/a/b", "//other.test/x", "http://other.test/x"),
        ("http://h.test/a/b", "//Other.test/x", "http://other.test/x"),  # to lowercase: the parser
        ("http://h.test/a/b", "https://o.test:443/x", "https://o.test/x"),  # a default port: the parser
    ],
)
def test_links(base: str, href: str, expected: str) -> None:
    assert resolve(base, href) == expected == ada_url.join_url(base, href)
