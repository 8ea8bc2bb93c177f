"""Batch analyzers and the fetch log as plain code: SimHash clusters, the fetch log's lines, the registry."""

from __future__ import annotations

import random

import pytest

from analyzers import Page
from analyzers.batch import CrawledUrl
from analyzers.batch_registry import BatchRegistry
from analyzers.near_duplicates import MAX_DISTANCE, NearDuplicates, simhash
from engine.fetch_log import LoggedUrl, latest_by_url, log_lines
from engine.outcomes import Failed, Redirected, RobotsBlocked, Stored, Unchanged
from frontier import Entry
from vcrawl.errors import ConfigError, UnknownComponent
from vcrawl.payloads import FetchedPage

WORDS = [f"w{n}" for n in range(2000)]


class NoContext:
    def canonical(self, url: str) -> str:
        return url

    def final_status(self, url: str) -> int | None:
        return None


def text(seed: int, length: int = 400) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(WORDS) for _ in range(length)]


def html_page(url: str, words: list[str]) -> CrawledUrl:
    body = f"<html><body><script>var x = 1;</script><p>{' '.join(words)}</p></body></html>".encode()
    return CrawledUrl(url, "h", "stored", 200, 0, len(body), "text/html", page=Page(url, body))


def test_simhash_of_a_one_word_edit_is_near_and_of_other_text_is_far() -> None:
    words = text(1)
    edited = [*words[:200], "changed", *words[201:]]
    assert bin(simhash(words) ^ simhash(edited)).count("1") <= MAX_DISTANCE * 3
    far = [bin(simhash(text(1)) ^ simhash(text(seed))).count("1") for seed in range(2, 40)]
    assert min(far) > MAX_DISTANCE


def test_clusters_join_identical_bodies_and_near_texts_but_nothing_unrelated() -> None:
    base = text(7, 1200)
    near = [*base[:-1], "tail"]  # one word of 1200 changed: near-identical
    pages = [
        html_page("http://h/a", base),
        html_page("http://h/a?sort=asc", base),  # byte-identical alias
        html_page("http://h/near", near),
        *[html_page(f"http://h/other{n}", text(100 + n)) for n in range(30)],
    ]
    analyzer = NearDuplicates()
    partials = [analyzer.map(pages[i : i + 4], NoContext()) for i in range(0, len(pages), 4)]

    result = analyzer.reduce(partials)

    assert result["pages"] == 33
    assert [cluster["urls"] for cluster in result["clusters"]] == [
        ["http://h/a", "http://h/a?sort=asc", "http://h/near"]
    ]
    assert result["clusters"][0]["identical"] is False
    assert analyzer.reduce(reversed(partials)) == result


def test_a_pdf_clusters_only_by_identity() -> None:
    pdf = CrawledUrl(
        "http://h/x.pdf", "h", "stored", 200, 0, 9, "application/pdf", page=Page("http://h/x.pdf", b"%PDF-1.4 x")
    )
    copy = CrawledUrl(
        "http://h/y.pdf", "h", "stored", 200, 0, 9, "application/pdf", page=Page("http://h/y.pdf", b"%PDF-1.4 x")
    )
    analyzer = NearDuplicates()
    result = analyzer.reduce([analyzer.map([pdf, copy], NoContext())])
    assert result["clusters"] == [{"size": 2, "identical": True, "urls": ["http://h/x.pdf", "http://h/y.pdf"]}]


def test_the_fetch_log_has_a_line_per_final_outcome_and_none_for_retries() -> None:
    page = FetchedPage(
        "http://h/a", "http://h/a", "/d/a.html", 200, 10, "text/html", fetched_at="2026-11-26T00:00:00+00:00"
    )
    outcomes = [
        Stored(Entry("http://h/a", 1), page),
        Redirected(Entry("http://h/r", 2), "http://h/a", 301),
        Failed(Entry("http://h/x", 1), "http_404", 404),
        Unchanged(Entry("http://h/u", 1)),
        RobotsBlocked(Entry("http://h/private", 1)),
    ]
    lines = log_lines(outcomes, cycle=3, now=100.0)
    assert [(line.outcome, line.status, line.cycle) for line in lines] == [
        ("stored", 200, 3), ("redirect", 301, 3), ("failed", 404, 3), ("unchanged", None, 3),
        ("robots_blocked", None, 3),
    ]  # fmt: skip
    assert lines[0].location == "/d/a.html" and lines[0].final_url == "" and lines[1].target == "http://h/a"
    assert [LoggedUrl.from_json(line.to_json()) for line in lines] == lines


def test_the_last_line_of_a_url_wins_and_a_cycle_can_be_picked() -> None:
    lines = [
        LoggedUrl("http://h/a", "failed", 503, cycle=1, at=10.0),
        LoggedUrl("http://h/a", "stored", 200, cycle=1, at=20.0),
        LoggedUrl("http://h/a", "stored", 200, cycle=2, at=30.0, bytes=5),
        LoggedUrl("http://h/b", "stored", 200, cycle=1, at=15.0),
    ]
    assert [(line.url, line.at) for line in latest_by_url(lines)] == [("http://h/a", 30.0), ("http://h/b", 15.0)]
    assert [(line.url, line.at) for line in latest_by_url(lines, cycle=1)] == [
        ("http://h/a", 20.0),
        ("http://h/b", 15.0),
    ]
    with pytest.raises(ValueError):
        LoggedUrl.from_json({"url": "http://h/a"})


def test_across_cycles_an_unchanged_page_is_its_last_stored_version() -> None:
    lines = [
        LoggedUrl("http://h/a", "stored", 200, cycle=1, at=10.0, location="cycle-1/a"),
        LoggedUrl("http://h/a", "unchanged", None, cycle=2, at=20.0),
        LoggedUrl("http://h/b", "unchanged", None, cycle=2, at=20.0),  # stored before the log began
    ]
    assert [(line.url, line.outcome) for line in latest_by_url(lines)] == [
        ("http://h/a", "stored"),
        ("http://h/b", "unchanged"),
    ]
    assert [line.outcome for line in latest_by_url(lines, cycle=2)] == ["unchanged", "unchanged"]


def test_the_batch_registry_refuses_unknown_names_and_taken_plugin_names() -> None:
    registry = BatchRegistry(entry_points=())
    assert registry.names() == ["near-duplicates", "site-report"]
    with pytest.raises(UnknownComponent, match="known: near-duplicates, site-report"):
        registry.get("nope")
    from importlib.metadata import EntryPoint

    clash = EntryPoint("site-report", "analyzers.site_report:SiteReport", "vcrawl.batch_analyzers")
    with pytest.raises(ConfigError, match="taken name"):
        BatchRegistry(entry_points=[clash]).names()
    plugin = EntryPoint("mine", "analyzers.site_report:SiteReport", "vcrawl.batch_analyzers")
    assert BatchRegistry(entry_points=[plugin]).names() == ["mine", "near-duplicates", "site-report"]


@pytest.mark.parametrize(
    ("value", "words"),
    [("no_such_module_here:Report", "failed to load"), ("analyzers.batch:BATCH_ENTRY_POINT_GROUP", "not a callable")],
    ids=["module-missing", "not-callable"],
)
def test_a_bad_batch_analyzer_plugin_is_named_like_every_other_plugin(value: str, words: str) -> None:
    from importlib.metadata import EntryPoint

    bad = EntryPoint("mine", value, "vcrawl.batch_analyzers")
    with pytest.raises(ConfigError) as refused:
        BatchRegistry(entry_points=[bad]).names()
    assert f"batch analyzer plugin 'mine = {value}' (vcrawl.batch_analyzers, no distribution)" in str(refused.value)
    assert words in str(refused.value)
