"""Invalid tasks are refused at ``crawl.delay()`` time, naming the field, and nothing is sent."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from tasks import InvalidTask, crawl
from vcrawl.settings import Settings

URL = "http://127.0.0.1:9/page.html"

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
    ("same paths", {"url": URL, "save_path": "a.html", "result_path": "a.html"}, "result_path", "differ"),
    ("job chars", {"url": URL, "job": "a job/with spaces"}, "job", "letters"),
    ("job type", {"url": URL, "job": 7}, "job", "string or null"),
]


@pytest.mark.parametrize(("payload", "field", "words"), [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_invalid_task_is_refused_at_delay_naming_the_field(
    vcrawl_settings: Settings, payload: Any, field: str, words: str
) -> None:
    client = redis.Redis.from_url(vcrawl_settings.redis_url)
    keys_before = set(client.scan_iter("vcrawl:task:*"))

    with pytest.raises(InvalidTask) as refused:
        crawl.delay(payload)

    assert refused.value.field == field
    assert str(refused.value).startswith(f"{field}: ")
    assert words in str(refused.value)
    assert set(client.scan_iter("vcrawl:task:*")) == keys_before  # nothing was recorded or sent


def test_crawl_takes_exactly_one_payload(vcrawl_settings: Settings) -> None:
    with pytest.raises(InvalidTask, match="exactly one argument"):
        crawl.apply_async(({"url": URL}, {"url": URL}))
