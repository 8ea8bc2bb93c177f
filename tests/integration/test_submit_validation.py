"""Invalid tasks are refused at ``crawl.delay()`` time, naming the field, and nothing is sent."""

from __future__ import annotations

import os
from typing import Any

import pytest
import redis

from tasks import InvalidTask, crawl
from tasks.crawl import validate
from vcrawl.settings import Settings

URL = "http://127.0.0.1:9/page.html"
AREAS = "outside the single-task areas: a single task writes only under pages/ or results/ of the data root"

CASES: list[tuple[str, Any, str, str]] = [
    ("not a dict", "http://x.test/", "task", "must be an object"),
    ("url missing", {"analyzer": "links"}, "url", "required"),
    ("url not a string", {"url": 42}, "url", "must be a string"),
    ("url scheme", {"url": "ftp://x.test/file"}, "url", "http or https"),
    ("url javascript", {"url": "javascript:alert(1)"}, "url", "http or https"),
    ("url without host", {"url": "http:///path"}, "url", "no host"),
    ("url with spaces", {"url": "http://x.test/a b"}, "url", "whitespace"),
    ("url bad port", {"url": "http://x.test:99999/"}, "url", "malformed"),
    ("unknown field", {"url": URL, "priority": 5}, "priority", "unknown field"),
    ("page_type", {"url": URL, "page_type": "ajax"}, "page_type", "no fetcher for page_type 'ajax'; known: api"),
    ("page_type path", {"url": URL, "page_type": "os:system"}, "page_type", "must be a page type name"),
    ("wait_for bad css", {"url": URL, "page_type": "dynamic", "wait_for": "div[["}, "wait_for", "invalid CSS"),
    ("wait_for static", {"url": URL, "wait_for": "div.x"}, "wait_for", "only dynamic"),
    ("js_function script", {"url": URL, "page_type": "dynamic", "js_function": "fetch('/x')"}, "js_function", ""),
    ("js_function static", {"url": URL, "js_function": "loadMore"}, "js_function", "only dynamic"),
    (
        "analyzer unknown",
        {"url": URL, "analyzer": "nope"},
        "analyzer",
        "known: always_fails, fails_twice, fields, links",
    ),
    ("analyzer path", {"url": URL, "analyzer": "os:system"}, "analyzer", "not an analyzer name"),
    ("fields without rules", {"url": URL, "analyzer": "fields"}, "fields", "at least one field rule"),
    ("fields bad css", {"url": URL, "analyzer": "fields", "fields": {"a": "h1[["}}, "fields.a.css", ""),
    ("fields bad xpath", {"url": URL, "analyzer": "fields", "fields": {"a": "xpath://h1[("}}, "fields.a.xpath", ""),
    ("fields both", {"url": URL, "fields": {"a": {"css": "h1", "xpath": "//h1"}}}, "fields.a", "exactly one"),
    ("save_path dotdot", {"url": URL, "save_path": "../../etc/cron.d/x"}, "save_path", "escapes"),
    ("save_path absolute", {"url": URL, "save_path": "/etc/passwd"}, "save_path", "escapes"),
    ("save_path file url", {"url": URL, "save_path": "file:///etc/passwd"}, "save_path", "escapes"),
    ("save_path hdfs", {"url": URL, "save_path": "hdfs://nn:9870/x"}, "save_path", "hdfs"),
    ("result_path dotdot", {"url": URL, "result_path": "a/../../../x.json"}, "result_path", "escapes"),
    ("same paths", {"url": URL, "save_path": "pages/a.html", "result_path": "pages/a.html"}, "result_path", "differ"),
    # A single task writes only under pages/ and results/ of the data root ("{data}": its absolute path).
    ("save_path in a job", {"url": URL, "save_path": "jobs/other-job/pages/x.html"}, "save_path", AREAS),
    (
        "result_path in a job's records",
        {"url": URL, "result_path": "jobs/other-job/records/injected.jsonl"},
        "result_path",
        AREAS,
    ),
    (
        "result_path a job's result",
        {"url": URL, "result_path": "jobs/other-job/results/site-report.json"},
        "result_path",
        AREAS,
    ),
    ("save_path redis aof", {"url": URL, "save_path": ".vcrawl-redis/appendonly.aof"}, "save_path", AREAS),
    ("result_path spool", {"url": URL, "result_path": ".spool/records/x.jsonl"}, "result_path", AREAS),
    ("save_path in the root", {"url": URL, "save_path": "page.html"}, "save_path", AREAS),
    ("save_path other top dir", {"url": URL, "save_path": "proxies/one.html"}, "save_path", AREAS),
    ("save_path absolute in jobs", {"url": URL, "save_path": "{data}/jobs/other-job/pages/x.html"}, "save_path", AREAS),
    (
        "result_path file url in spool",
        {"url": URL, "result_path": "file://{data}/.spool/warc/x.warc.gz"},
        "result_path",
        AREAS,
    ),
    (
        "save_path out of the area by dotdot",
        {"url": URL, "save_path": "pages/../jobs/j/pages/x.html"},
        "save_path",
        AREAS,
    ),
    ("save_path hidden dir", {"url": URL, "save_path": "pages/.cache/x.html"}, "save_path", "hidden component"),
    ("job chars", {"url": URL, "job": "a job/with spaces"}, "job", "letters"),
    ("job type", {"url": URL, "job": 7}, "job", "string or null"),
]


@pytest.mark.parametrize(("payload", "field", "words"), [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_invalid_task_is_refused_at_delay_naming_the_field(
    vcrawl_settings: Settings, payload: Any, field: str, words: str
) -> None:
    client = redis.Redis.from_url(vcrawl_settings.redis_url)
    keys_before = set(client.scan_iter("vcrawl:task:*"))
    if isinstance(payload, dict):
        data = os.path.realpath(vcrawl_settings.data)
        payload = {
            key: value.replace("{data}", data) if isinstance(value, str) else value for key, value in payload.items()
        }

    with pytest.raises(InvalidTask) as refused:
        crawl.delay(payload)

    assert refused.value.field == field
    assert str(refused.value).startswith(f"{field}: ")
    assert words in str(refused.value)
    assert set(client.scan_iter("vcrawl:task:*")) == keys_before  # nothing was recorded or sent


def test_crawl_takes_exactly_one_payload(vcrawl_settings: Settings) -> None:
    with pytest.raises(InvalidTask, match="exactly one argument"):
        crawl.apply_async(({"url": URL}, {"url": URL}))


def test_the_defaults_and_given_paths_in_the_areas_are_accepted(vcrawl_settings: Settings) -> None:
    # validate() alone: nothing is sent (a worker would fetch the unreachable URL for nothing).
    data = os.path.realpath(vcrawl_settings.data)
    for given in (
        {},
        {"save_path": "pages/mine/a.html", "result_path": "results/mine/a.json"},
        {"save_path": f"{data}/results/x.html", "result_path": f"file://{data}/pages/x.json"},
    ):
        task = validate({"url": URL, **given})
        assert task.save_path is not None and task.result_path is not None
