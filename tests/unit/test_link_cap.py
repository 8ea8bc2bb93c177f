"""A page's links are read up to its cap (``max_links_per_page``); the rest are counted, not read."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from analyzers import TRUNCATED, Page
from analyzers import links as links_analyzer
from analyzers.page import TREE_DEPTH_LIMIT
from vcrawl.errors import InvalidTask
from vcrawl.jobs import JobSpec
from vcrawl.payloads import MAX_LINKS_PER_PAGE

URL = "http://example.com/dir/page.html"
DEEP = "<b>" * TREE_DEPTH_LIMIT  # past libxml2's depth limit: the page is read tag by tag


def anchors(count: int, start: int = 0) -> str:
    return "".join(f"<a href='/l/{n}'>link {n}</a>" for n in range(start, start + count))


@pytest.mark.parametrize("prefix", ["", DEEP], ids=["tree", "past-the-depth-limit"])
def test_a_page_over_the_cap_gives_the_first_links_in_document_order(prefix: str) -> None:
    page = Page(URL, f"{prefix}<img src='/i.png'>{anchors(12)}".encode(), max_links=5)
    urls, skipped = links_analyzer.followed_links(page)
    assert urls == [f"http://example.com/l/{n}" for n in range(5)]  # images are not followed: not counted
    assert skipped == {TRUNCATED: 7}


def test_repeats_and_skipped_links_count_towards_the_cap() -> None:
    # The cap bounds the links read, whatever they turn out to be: a link is known to be a repeat or
    # a javascript: one only once it is read.
    body = "<a href='/a'>a</a><a href='javascript:x()'>j</a><a href='/a'>a</a><a href='/b'>b</a><a href='/c'>c</a>"
    urls, skipped = links_analyzer.followed_links(Page(URL, body.encode(), max_links=3))
    assert urls == ["http://example.com/a"]
    assert skipped == {"scheme": 1, TRUNCATED: 2}


@pytest.mark.parametrize("prefix", ["", DEEP], ids=["tree", "past-the-depth-limit"])
def test_the_links_analyzer_lists_the_first_links_and_says_how_many_it_left_out(prefix: str) -> None:
    body = f"{prefix}<link href='/s.css'><a href='/x' rel='NoFollow'><img src='/i.png' alt='pic'></a>{anchors(10)}"
    result = links_analyzer.analyze(Page(URL, body.encode(), max_links=4))
    assert [(link["url"], link["text"], link["tag"]) for link in result["links"]] == [
        ("http://example.com/s.css", "", "link"),
        ("http://example.com/x", "pic", "a"),
        ("http://example.com/i.png", "pic", "img"),
        ("http://example.com/l/0", "link 0", "a"),
    ]
    assert result["count"] == 4 and result[TRUNCATED] == 9 and result["skipped"] == 0
    json.dumps(result, allow_nan=False)


@pytest.mark.parametrize("prefix", ["", DEEP], ids=["tree", "past-the-depth-limit"])
def test_a_page_at_the_cap_is_read_as_without_one(prefix: str) -> None:
    body = f"{prefix}<base href='/b/'><a href='x'>x</a><a href='mailto:m@x.test'>m</a>{anchors(8)}".encode()
    at_cap, default = Page(URL, body, max_links=10), Page(URL, body)
    assert links_analyzer.analyze(at_cap) == links_analyzer.analyze(default)
    assert TRUNCATED not in links_analyzer.analyze(at_cap)
    assert links_analyzer.followed_links(at_cap) == links_analyzer.followed_links(default)
    assert links_analyzer.followed_links(at_cap)[1] == {"scheme": 1}


def test_the_default_cap_is_the_jobs_default() -> None:
    assert Page(URL, b"").max_links == JobSpec(seeds=("http://example.com/",)).max_links_per_page
    assert MAX_LINKS_PER_PAGE == 10_000
    with pytest.raises(ValueError, match="max_links"):
        Page(URL, b"", max_links=0)


Reader = Callable[[Page], Any]


@pytest.mark.parametrize("read", [links_analyzer.followed_links, links_analyzer.analyze], ids=["followed", "analyze"])
def test_reading_a_link_dense_page_holds_memory_for_the_links_kept_not_for_the_page(read: Reader) -> None:
    # 300,000 anchors, 8.8 MB: the tree alone took over 200 MB of RSS, and the lists of every link
    # built from it 57 MB (followed_links) and 124 MB (analyze) of traced memory. Now the parser's
    # events go by in 64 KiB chunks and only the first MAX_LINKS_PER_PAGE links are kept.
    body = ("<html><body>" + anchors(300_000) + "</body></html>").encode()
    page = Page("http://127.0.0.1/", body)
    assert page.text  # decoded before tracing: a page's text is not the link extraction's
    tracemalloc.start()
    try:
        result = read(page)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(result[0] if isinstance(result, tuple) else result["links"]) == MAX_LINKS_PER_PAGE
    assert peak < 1024 * 1024 + 1024 * MAX_LINKS_PER_PAGE  # 11.3 MB; measured 2.7 MB / 5.8 MB


# --- the job's setting ----------------------------------------------------------------------------

SEED = {"seeds": ["http://example.com/"]}


def test_a_job_sets_its_cap_and_keeps_it_over_the_wire() -> None:
    spec = JobSpec.from_dict({**SEED, "max_links_per_page": 250})
    assert spec.max_links_per_page == 250
    assert JobSpec.from_dict(json.loads(spec.to_json())) == spec


def test_a_job_at_the_default_cap_is_written_without_it_for_older_workers() -> None:
    spec = JobSpec.from_dict(SEED)
    assert spec.max_links_per_page == MAX_LINKS_PER_PAGE
    assert "max_links_per_page" not in spec.to_dict()
    assert JobSpec.from_dict(json.loads(spec.to_json())) == spec


@pytest.mark.parametrize("value", [0, -1, 10_000_001, 2.5, "100", True, None])
def test_a_bad_cap_is_refused_naming_its_key(value: object) -> None:
    with pytest.raises(InvalidTask) as refused:
        JobSpec.from_dict({**SEED, "max_links_per_page": value})
    assert refused.value.field == "max_links_per_page"
