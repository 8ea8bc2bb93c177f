"""Payload decoding is strict and names the field; valid payloads survive the JSON round trip."""

from __future__ import annotations

import json

import pytest

from frontier import Batch, Entry, RecentUrls
from vcrawl.errors import InvalidTask
from vcrawl.payloads import AnalysisJob, DownloadTask, FetchedPage, FieldRule


def test_defaults() -> None:
    task = DownloadTask.from_dict({"url": "https://shop.test/a"})
    assert (task.page_type, task.analyzer, task.save_path, task.job) == ("static", "links", None, None)


def test_json_round_trip_keeps_everything() -> None:
    data = {
        "url": "https://shop.test/a?b=1",
        "page_type": "dynamic",
        "js_function": "window.shop.loadMore",
        "analyzer": "fields",
        "fields": {"title": "h1", "price": {"xpath": "//span/text()"}, "tags": {"css": "li", "all": True}},
        "job": "shop-2026.11",
        "save_path": "pages/a.html",
        "result_path": "results/a.json",
    }
    task = DownloadTask.from_dict(data)
    again = DownloadTask.from_dict(json.loads(json.dumps(task.to_dict())))
    assert again == task
    assert task.fields["title"] == FieldRule(css="h1")
    assert task.fields["price"] == FieldRule(xpath="//span/text()")


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("h1.name", FieldRule(css="h1.name")),
        ("css:h1", FieldRule(css="h1")),
        ("xpath://h1/text()", FieldRule(xpath="//h1/text()")),
        ({"css": "a", "attr": "href", "all": True}, FieldRule(css="a", attr="href", all=True)),
    ],
)
def test_field_rule_spellings(value: object, rule: FieldRule) -> None:
    assert FieldRule.from_value("x", value) == rule


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"css": "h1", "extra": 1}, "fields.x"),
        ({"css": 5}, "fields.x.css"),
        ({"css": "h1", "all": "yes"}, "fields.x.all"),
        ({"css": "a", "attr": "on click"}, "fields.x.attr"),
        ({}, "fields.x"),
        ("  ", "fields.x"),
        (["h1"], "fields.x"),
    ],
)
def test_bad_field_rules_name_their_path(value: object, field: str) -> None:
    with pytest.raises(InvalidTask) as refused:
        FieldRule.from_value("x", value)
    assert refused.value.field == field


def test_analysis_job_and_fetched_page_round_trip() -> None:
    job = AnalysisJob("t1", "fields", "results/x.json", {"t": FieldRule(css="h1")}, "j")
    assert AnalysisJob.from_dict(json.loads(json.dumps(job.to_dict()))) == job
    page = FetchedPage("http://a.test/", "http://a.test/b", "pages/b.html", 200, 10, "text/html", 0.1, {"etag": '"1"'})
    assert FetchedPage.from_dict(json.loads(json.dumps(page.to_dict()))) == page


def test_fetched_page_refuses_unknown_fields() -> None:
    with pytest.raises(InvalidTask) as refused:
        FetchedPage.from_dict({"url": "x", "body": "<html>"})
    assert refused.value.field == "body"


def test_frontier_entries_and_batches_round_trip_with_their_optional_fields() -> None:
    waiting = Entry("http://a.test/x", 2, 1, 4, not_before_s=1_800_000_000.125)
    plain = Entry("http://a.test/y")
    assert "n" not in json.loads(plain.encode())  # old messages and new ones look the same without a wait
    assert Entry.decode(waiting.encode()) == waiting and Entry.decode(plain.encode()) == plain
    batch = Batch("7", "a.test", (waiting, plain), cycle=3, paced=True)
    assert Batch.from_dict(batch.to_dict()) == batch
    assert Batch.from_dict({"id": "7", "host": "a.test", "entries": [plain.encode()]}).paced is False
    for bad in ({"paced": "yes"}, {"entries": ['{"u": "x", "d": 0, "a": 0, "r": 5, "n": "Infinity"}']}):
        with pytest.raises(ValueError):
            Batch.from_dict({"id": "7", "host": "a.test", "entries": [plain.encode()], **bad})


def test_recent_urls_keep_the_newest_up_to_their_capacity() -> None:
    recent = RecentUrls(capacity=3)
    recent.add_all(["a", "b", "c"])
    recent.add_all(["d"])
    assert len(recent) == 3 and "a" not in recent and all(url in recent for url in "bcd")


def test_a_fetch_batch_hand_over_from_before_the_redesign_still_decodes() -> None:
    from vcrawl.payloads import FetchedBatch

    old = {
        "job": "j", "batch": "7",
        "pages": [{"url": "http://a.test/", "final_url": "http://a.test/", "save_path": "jobs/j/pages/a.html",
                   "content_type": "text/html", "depth": 1, "analyzer": "links", "fields": None,
                   "fetched_at": "2026-11-20T10:00:00+00:00"}],
        "redirects": [{"url": "http://a.test/r", "target": "http://a.test/t", "depth": 1, "redirects_left": 4}],
    }  # fmt: skip
    batch = FetchedBatch.from_dict(old)
    assert batch.done == 2 and batch.pages[0].depth == 1 and batch.pages[0].save_path == "jobs/j/pages/a.html"
    assert FetchedBatch.from_dict(batch.to_dict()) == batch
