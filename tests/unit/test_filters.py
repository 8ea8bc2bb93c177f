"""Scope filters: one reason per rejected URL, the first failing check wins."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from frontier import canonical_url
from frontier.filters import DEFAULT_SKIP_SUFFIXES, REASONS, Scope, _host, _path, reject_reason


def _scope(
    hosts: tuple[str, ...] = ("example.com",),
    domains: tuple[str, ...] = ("example.org",),
    allow: tuple[str, ...] = (),
    deny: tuple[str, ...] = (),
    max_depth: int = 3,
    **kwargs: int,
) -> Scope:
    return Scope(
        hosts=frozenset(hosts),
        domains=domains,
        allow=tuple(re.compile(p) for p in allow),
        deny=tuple(re.compile(p) for p in deny),
        max_depth=max_depth,
        **kwargs,  # type: ignore[arg-type]
    )


SCOPE = _scope(deny=(r"/logout", r"[?&]sort="), max_url_length=80)

CASES = [
    # kept
    ("http://example.com/", 0, None),
    ("https://example.com/products/saw.html", 3, None),
    ("http://example.com:8080/x", 0, None),
    ("http://example.org/", 0, None),
    ("http://shop.example.org/item?id=7", 1, None),
    ("http://example.com/download?file=a.pdf", 0, None),
    ("http://example.com/pdf", 0, None),
    ("http://example.com/feed.xml", 0, None),
    ("http://example.com/2024/05/05/post", 0, None),
    ("http://example.com/a/b/a/b/a/b/", 0, None),
    # scheme
    ("mailto:someone@example.com", 0, "scheme"),
    ("javascript:void(0)", 0, "scheme"),
    ("ftp://example.com/file", 0, "scheme"),
    # too_long
    ("http://example.com/" + "a" * 62, 0, "too_long"),
    # depth
    ("http://example.com/", 4, "depth"),
    # host
    ("http://other.example/", 0, "host"),
    ("http://www.example.com/", 0, "host"),
    ("http://badexample.org/", 0, "host"),
    ("http://example.org.evil.test/", 0, "host"),
    # deny
    ("http://example.com/logout", 0, "deny"),
    ("http://example.com/list?page=2&sort=asc", 0, "deny"),
    # suffix (case-insensitive, query ignored)
    ("http://example.com/a.pdf", 0, "suffix"),
    ("http://example.com/IMG_1.JPG", 0, "suffix"),
    ("http://example.com/a.pdf?download=1", 0, "suffix"),
    ("http://example.com/dist/app.tar.gz", 0, "suffix"),
    ("http://example.com/static/site.css", 0, "suffix"),
    # trap
    ("http://example.com/a/b/a/b/a/b/a/b/", 0, "trap"),
    ("http://example.com/foo/foo/", 0, "trap"),
    ("http://example.com/x/foo//foo", 0, "trap"),
    ("http://example.com/p/1/p/2/p/3/p/4", 0, "trap"),
]


@pytest.mark.parametrize(("url", "depth", "reason"), CASES)
def test_reject_reason(url: str, depth: int, reason: str | None) -> None:
    assert reject_reason(url, depth, SCOPE) == reason


def test_every_reason_is_listed_and_covered() -> None:
    produced = {reason for _, _, reason in CASES} | {"allow"}
    assert set(REASONS) == produced - {None}
    assert REASONS == ("scheme", "too_long", "depth", "host", "deny", "allow", "suffix", "trap")


@pytest.mark.parametrize(
    ("url", "depth", "scope", "reason"),
    [
        ("http://example.com/x", 0, _scope(allow=(r"/products/",)), "allow"),
        ("http://example.com/products/saw", 0, _scope(allow=(r"/products/",)), None),
        ("http://example.com/blog/x", 0, _scope(allow=(r"/products/", r"/blog/")), None),
        ("http://anything.test/", 0, _scope(hosts=(), domains=()), None),
        ("http://[::1]:8080/", 0, _scope(hosts=("[0::1]",)), None),
        ("http://[::2]/", 0, _scope(hosts=("::1",)), "host"),
        ("http://example.com/a/a/a/b", 0, _scope(max_segment_repeats=5), "trap"),
        ("http://example.com/a/b/a/b/a/b/a/b/", 0, _scope(max_segment_repeats=4), None),
        ("http://example.com/a.pdf", 0, _scope(skip_suffixes=frozenset({".exe"})), None),
    ],
)
def test_scope_options(url: str, depth: int, scope: Scope, reason: str | None) -> None:
    assert reject_reason(url, depth, scope) == reason


@pytest.mark.parametrize(
    ("url", "depth", "scope", "reason"),
    [
        # The first failing check wins, in the order of REASONS.
        ("ftp://" + "x" * 100, 9, _scope(max_url_length=20), "scheme"),
        ("http://other.example/" + "x" * 100, 9, _scope(max_url_length=20), "too_long"),
        ("http://other.example/logout", 9, _scope(deny=("logout",)), "depth"),
        ("http://other.example/logout", 0, _scope(deny=("logout",)), "host"),
        ("http://example.com/logout.pdf", 0, _scope(deny=("logout",), allow=("/shop/",)), "deny"),
        ("http://example.com/a.pdf", 0, _scope(allow=("/shop/",)), "allow"),
        ("http://example.com/a/a/a/a.pdf", 0, _scope(), "suffix"),
    ],
)
def test_checks_run_in_order(url: str, depth: int, scope: Scope, reason: str) -> None:
    assert reject_reason(url, depth, scope) == reason


@pytest.mark.parametrize(
    "kwargs",
    [
        {"hosts": ("example.com:8080",)},
        {"hosts": ("Example.com",)},
        {"hosts": ("bücher.example",)},
        {"domains": (".example.org",)},
        {"domains": ("Example.org",)},
        {"max_depth": -1},
        {"max_url_length": 0},
        {"max_segment_repeats": 0},
        {"skip_suffixes": frozenset({"pdf"})},
        {"skip_suffixes": frozenset({".PDF"})},
    ],
)
def test_scope_refuses_bad_values(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        _scope(**kwargs)


def test_scope_refuses_a_bare_string_for_hosts_or_domains() -> None:
    with pytest.raises(ValueError, match="hosts"):
        Scope(hosts="example.com", domains=(), allow=(), deny=(), max_depth=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="domains"):
        Scope(hosts=frozenset(), domains="example.org", allow=(), deny=(), max_depth=1)  # type: ignore[arg-type]


def test_default_skip_suffixes_are_lowercase_with_a_dot() -> None:
    assert all(s.startswith(".") and s == s.lower() for s in DEFAULT_SKIP_SUFFIXES)
    assert {".jpg", ".mp4", ".zip", ".pdf", ".docx", ".css", ".js", ".woff2", ".exe", ".iso"} <= DEFAULT_SKIP_SUFFIXES
    assert not {".html", ".htm", ".php", ".asp", ".json", ".xml"} & DEFAULT_SKIP_SUFFIXES


def test_scopes_compare_by_their_fields() -> None:
    assert _scope() == _scope()
    assert hash(_scope()) == hash(_scope())


def test_a_canonical_urls_host_and_path_are_what_urlsplit_gives() -> None:
    cases = json.loads((Path(__file__).parent.parent / "data" / "wpt-url" / "urltestdata.json").read_text("utf-8"))
    urls = [case["href"] for case in cases if isinstance(case, dict) and case.get("href", "").startswith("http")]
    rng = random.Random(5)
    urls += [f"http://h{rng.randint(0, 9)}.test:{rng.choice(['', '81'])}/{rng.choice(['a', 'b/c.PNG', ''])}"
             f"{rng.choice(['', '?q=/x', '?', '#f'])}" for _ in range(200)]  # fmt: skip
    checked = 0
    for url in urls:
        try:
            url = canonical_url(url)
        except ValueError:
            continue
        checked += 1
        parts = urlsplit(url)
        assert (_host(url), _path(url)) == (parts.hostname or "", parts.path), url
    assert checked > 250
