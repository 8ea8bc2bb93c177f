"""page_type api without sockets: the rule's api spec, reading answers, paging URLs, auth, rate limits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from analyzers.api import read_answer, with_param
from engine.api_pages import (
    ACCEPT,
    api_headers,
    api_links,
    api_records,
    auth_header,
    masked_headers,
    masked_result,
    rate_limit_wait_s,
    with_rate_limit,
)
from engine.fetch_batch import fold_release
from engine.fetch_step import stops_batch
from engine.jobs import Link
from engine.outcomes import Stored, Visit
from fetchers import FetchResult
from frontier import Entry, canonical_url
from vcrawl.api_rules import ApiSpec
from vcrawl.errors import ConfigError, InvalidTask, NotJson
from vcrawl.jobs import JobSpec
from vcrawl.payloads import AnalysisJob, DownloadTask, FetchedPage, Rule
from vcrawl.policies import PolitenessPolicy
from vcrawl.settings import Settings

API = "http://api.test/v1/items"


def _job(rule: dict[str, Any]) -> JobSpec:
    return JobSpec.from_dict({"seeds": [API], "rules": [{"pattern": "", "page_type": "api", **rule}]})


def _refused(rule: dict[str, Any]) -> InvalidTask:
    with pytest.raises(InvalidTask) as refused:
        _job(rule)
    return refused.value


# --- the rule's api spec ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ({}, "rules[0].api"),
        ({"api": "data"}, "rules[0].api"),
        ({"api": {"records": "data["}}, "rules[0].api.records"),
        ({"api": {"records": ""}}, "rules[0].api.records"),
        ({"api": {"records": 5}}, "rules[0].api.records"),
        ({"api": {"record": "data"}}, "rules[0].api.record"),
        ({"api": {"next": "links.[next"}}, "rules[0].api.next"),
        ({"api": {"cursor": {"field": "meta.next"}}}, "rules[0].api.cursor.param"),
        ({"api": {"cursor": {"param": "cursor"}}}, "rules[0].api.cursor.field"),
        ({"api": {"cursor": {"field": "n", "param": "a b"}}}, "rules[0].api.cursor.param"),
        ({"api": {"cursor": {"field": "n", "param": "sid"}}}, "rules[0].api.cursor.param"),  # canonical_url drops it
        ({"api": {"cursor": {"field": "n", "param": "c", "x": 1}}}, "rules[0].api.cursor.x"),
        ({"api": {"page": {"param": "page", "start": -1}}}, "rules[0].api.page.start"),
        ({"api": {"page": {"param": "page", "stop": "meta.("}}}, "rules[0].api.page.stop"),
        ({"api": {"page": {"param": "page", "size": 50}}}, "rules[0].api.page.size_param"),
        ({"api": {"page": {"param": "page", "step": 2}}}, "rules[0].api.page.step"),
        ({"api": {"offset": {"param": "offset"}}}, "rules[0].api.offset.step"),
        ({"api": {"offset": {"param": "offset", "step": 0}}}, "rules[0].api.offset.step"),
        ({"api": {"next": "n", "cursor": {"field": "c", "param": "c"}}}, "rules[0].api.cursor"),
        ({"api": {"follow": "items[].href"}}, "rules[0].api.follow"),
        ({"api": {"follow": ["items[].href", "a[["]}}, "rules[0].api.follow[1]"),
        ({"api": {"fields": {"id": "id", "name": "["}}}, "rules[0].api.fields.name"),
        ({"api": {"fields": {}}}, "rules[0].api.fields"),
        ({"api": {}, "auth": "acme"}, "rules[0].auth"),
        ({"api": {}, "auth": "ACME API"}, "rules[0].auth"),
        ({"api": {}, "auth": 3}, "rules[0].auth"),
        ({"api": {}, "analyzer": "links"}, "rules[0].analyzer"),
        ({"api": {}, "fields": {"title": "h1"}}, "rules[0].fields"),
    ],
)
def test_bad_api_rule_is_refused_naming_its_key(rule: dict[str, Any], field: str) -> None:
    assert _refused(rule).field == field


@pytest.mark.parametrize("key", ["api", "auth"])
def test_api_keys_belong_to_api_pages(key: str) -> None:
    value = {"records": "data"} if key == "api" else "ACME"
    with pytest.raises(InvalidTask) as refused:
        JobSpec.from_dict({"seeds": [API], "rules": [{"pattern": "", key: value}]})
    assert refused.value.field == f"rules[0].{key}"


def test_api_rule_round_trips_through_the_job_json() -> None:
    spec = _job(
        {
            "auth": "ACME_API",
            "api": {
                "records": "data.items",
                "fields": {"id": "id", "name": "attributes.name"},
                "page": {"param": "page", "start": 1, "size_param": "per_page", "size": 50, "stop": "meta.pages"},
                "follow": ["data.items[].links.self"],
            },
        }
    )
    assert JobSpec.from_dict(json.loads(spec.to_json())) == spec
    rule = spec.rule_for(API)
    assert rule.auth == "ACME_API" and rule.api is not None and rule.api.paging == "page"
    assert "VCRAWL_API_AUTH" not in spec.to_json()  # the job names the secret, never holds it


def test_single_api_task_round_trips_and_analyses_with_its_spec() -> None:
    task = DownloadTask.from_dict({"url": API, "page_type": "api", "api": {"records": "data"}, "auth": "ACME"})
    assert task.analyzer == "api" and task.rule.api == ApiSpec(records="data")
    assert DownloadTask.from_dict(json.loads(json.dumps(task.to_dict()))) == task
    job = AnalysisJob.for_task("t-1", task.with_paths("p", "r"))
    assert AnalysisJob.from_dict(json.loads(json.dumps(job.to_dict()))) == job
    assert job.api == ApiSpec(records="data")


def test_canonical_url_keeps_paging_parameters_in_order() -> None:
    # Paging relies on the query as the API wrote it: nothing sorted, nothing of ours dropped.
    url = "http://api.test/v1/items?size=7&page=3&cursor=eyJpZCI6IDd9&offset=14&after=x%2Fy&limit=5"
    assert canonical_url(url) == url
    assert canonical_url(with_param(url, "page", "4")) == url.replace("page=3", "page=4")


# --- reading answers ----------------------------------------------------------------------------


def _read(body: Any, spec: dict[str, Any], url: str = API, content_type: str | None = "application/json") -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return read_answer(raw, content_type, url, ApiSpec.from_value(spec))


def test_records_are_picked_and_reshaped_by_jmespath() -> None:
    body = {"data": {"items": [{"id": 1, "a": {"n": "x"}}, {"id": 2, "a": {"n": "y"}}]}}
    assert _read(body, {"records": "data.items"}).records == tuple(body["data"]["items"])
    reshaped = _read(body, {"records": "data.items", "fields": {"id": "id", "name": "a.n", "gone": "nope"}})
    assert reshaped.records == ({"id": 1, "name": "x", "gone": None}, {"id": 2, "name": "y", "gone": None})
    assert _read({"item": {"id": 9}}, {"records": "item"}).records == ({"id": 9},)  # one object: one record
    assert _read({"data": None}, {"records": "data.items"}).records == ()


def test_cursor_paging_sets_the_cursor_parameter_until_there_is_none() -> None:
    spec = {"records": "items", "cursor": {"field": "meta.next_cursor", "param": "cursor"}}
    first = _read({"items": [1], "meta": {"next_cursor": "c/2"}}, spec, f"{API}?limit=7")
    assert first.next_url == f"{API}?limit=7&cursor=c%2F2"
    second = _read({"items": [2], "meta": {"next_cursor": "c3"}}, spec, first.next_url)
    assert second.next_url == f"{API}?limit=7&cursor=c3"
    for last in (None, "", False):
        assert _read({"items": [3], "meta": {"next_cursor": last}}, spec, second.next_url).next_url is None
    assert _read({"items": [], "meta": {"next_cursor": 42}}, spec).next_url == f"{API}?cursor=42"


def test_next_link_paging_joins_relative_links() -> None:
    spec = {"records": "data", "next": "links.next"}
    assert (
        _read({"data": [1], "links": {"next": "/v1/items?page=2"}}, spec).next_url == "http://api.test/v1/items?page=2"
    )
    assert _read({"data": [1], "links": {"next": None}}, spec).next_url is None


@pytest.mark.parametrize(
    ("url", "body", "spec", "expected"),
    [
        # page numbers, stop at an empty page (the default)
        (API, {"items": [1]}, {"param": "page"}, f"{API}?page=2"),
        (f"{API}?page=4", {"items": [1]}, {"param": "page"}, f"{API}?page=5"),
        (f"{API}?page=4", {"items": []}, {"param": "page"}, None),
        (API, {"items": [1]}, {"param": "p", "start": 0, "size_param": "n", "size": 7}, f"{API}?p=1&n=7"),
        # page numbers, stop at the last page an expression names
        (f"{API}?page=2", {"items": [1], "pages": 3}, {"param": "page", "stop": "pages"}, f"{API}?page=3"),
        (f"{API}?page=3", {"items": [1], "pages": 3}, {"param": "page", "stop": "pages"}, None),
        (f"{API}?page=1", {"items": [1], "pages": "3"}, {"param": "page", "stop": "pages"}, None),  # not a number
    ],
)
def test_page_number_paging(url: str, body: Any, spec: dict[str, Any], expected: str | None) -> None:
    assert _read(body, {"records": "items", "page": spec}, url).next_url == expected


@pytest.mark.parametrize(
    ("url", "total", "expected"),
    [(API, 25, f"{API}?offset=10"), (f"{API}?offset=10", 25, f"{API}?offset=20"), (f"{API}?offset=20", 25, None)],
)
def test_offset_paging_stops_past_the_total(url: str, total: int, expected: str | None) -> None:
    spec = {"records": "items", "offset": {"param": "offset", "step": 10, "stop": "total"}}
    assert _read({"items": [1], "total": total}, spec, url).next_url == expected


def test_json_lines_make_one_record_a_line() -> None:
    body = b'{"id": 1, "href": "/d/1"}\n\n{"id": 2, "href": "/d/2"}\n'
    spec = {"records": "ignored", "follow": ["href"], "fields": {"id": "id"}, "page": {"param": "page"}}
    for content_type in ("application/x-ndjson", "application/jsonl; charset=utf-8", "text/plain", None):
        answer = _read(body, spec, content_type=content_type)
        assert answer.records == ({"id": 1}, {"id": 2})
        assert answer.follow == ("http://api.test/d/1", "http://api.test/d/2")
        assert answer.next_url == f"{API}?page=2"
    assert _read(b"", spec, content_type="application/x-ndjson").next_url is None  # no records: the last page


def test_a_body_that_is_not_json_is_refused() -> None:
    with pytest.raises(NotJson):
        _read(b"<html>nope</html>", {"records": "@"}, content_type="text/html")


def test_follow_ups_are_one_level_deeper_and_next_pages_at_the_same_depth() -> None:
    answer = _read(
        {"items": [{"url": "/d/1"}, {"url": "http://api.test/d/2"}], "next": "?page=2"},
        {"records": "items", "next": "next", "follow": ["items[].url"]},
    )
    page = FetchedPage(API, API, "p", 200, 10, depth=2, fetched_at="2026-11-26T00:00:00+00:00", ip="127.0.0.1")
    assert api_links(answer, page, 5) == (
        Link(f"{API}?page=2", 2, 5),
        Link("http://api.test/d/1", 3, 5),
        Link("http://api.test/d/2", 3, 5),
    )
    records = api_records(answer, page, "job-1")
    assert [(r["analyzer"], r["index"], r["data"], r["job"]) for r in records] == [
        ("api", 0, {"url": "/d/1"}, "job-1"),
        ("api", 1, {"url": "http://api.test/d/2"}, "job-1"),
    ]


# --- auth ---------------------------------------------------------------------------------------


def test_auth_secret_sets_authorization_or_the_header_it_names() -> None:
    assert auth_header("Bearer t-1") == ("Authorization", "Bearer t-1")
    assert auth_header("X-Api-Key: k:2") == ("X-Api-Key", "k:2")
    assert auth_header("Basic dXNlcjpwYXNz") == ("Authorization", "Basic dXNlcjpwYXNz")
    rule = Rule(page_type="api", api=ApiSpec(), auth="ACME")
    assert api_headers(rule, {"ACME": "X-Api-Key: k-1"}) == {"Accept": ACCEPT, "X-Api-Key": "k-1"}
    assert api_headers(Rule(page_type="api", api=ApiSpec()), {}) == {"Accept": ACCEPT}


def test_missing_auth_secret_is_a_config_error_naming_the_variable() -> None:
    rule = Rule(pattern="/v1/", page_type="api", api=ApiSpec(), auth="ACME")
    with pytest.raises(ConfigError, match="VCRAWL_API_AUTH_ACME is not set"):
        api_headers(rule, {"OTHER": "Bearer x"})


def test_auth_secret_is_masked_in_the_request_headers_kept() -> None:
    rule = Rule(page_type="api", api=ApiSpec(), auth="ACME")
    secrets = {"ACME": "Bearer s3cret"}
    sent = {"User-Agent": "ua", "authorization": "Bearer s3cret"}
    assert masked_headers(sent, rule, secrets) == {"User-Agent": "ua", "authorization": "***"}
    result = masked_result(FetchResult(API, API, 200, request_headers=sent), rule, secrets)
    assert "s3cret" not in json.dumps(dict(result.request_headers))


def test_auth_secrets_come_from_their_own_variables_and_stay_out_of_repr() -> None:
    settings = Settings.from_env({"VCRAWL_API_AUTH_ACME_API": "Bearer s3cret", "VCRAWL_API_TOKEN": "t"})
    assert settings.api_auth == {"ACME_API": "Bearer s3cret"} and settings.api_token == "t"
    assert "s3cret" not in repr(settings)
    assert Settings.from_env(settings.to_env()).api_auth == settings.api_auth  # a child worker gets them too
    for bad in ({"VCRAWL_API_AUTH_acme": "x"}, {"VCRAWL_API_AUTH_ACME": " "}):
        with pytest.raises(ConfigError, match="VCRAWL_API_AUTH_"):
            Settings.from_env(bad)


# --- rate limits --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "wait_s"),
    [
        ({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "12"}, 12.0),
        ({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1700000100"}, 100.0),  # epoch seconds
        ({"ratelimit-remaining": "0", "ratelimit-reset": "3"}, 3.0),
        ({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "99999"}, 600.0),  # bounded
        ({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1699999000"}, 0.0),  # reset in the past
        ({"x-ratelimit-remaining": "4", "x-ratelimit-reset": "12"}, 0.0),
        ({"x-ratelimit-remaining": "0"}, 0.0),
        ({"x-ratelimit-remaining": "zero", "x-ratelimit-reset": "12"}, 0.0),
        ({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "soon"}, 0.0),
        ({}, 0.0),
    ],
)
def test_rate_limit_headers(headers: dict[str, str], wait_s: float) -> None:
    assert rate_limit_wait_s(headers, now=1_700_000_000.0, longest_s=600.0) == wait_s


def test_a_spent_rate_limit_holds_the_host_until_its_reset() -> None:
    page = FetchedPage(API, API, "p", 200, 10)
    stored = Stored(Entry(API, 0), page, Visit(requested=True))
    spent = FetchResult(API, API, 200, headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": "30"})
    held = with_rate_limit(stored, spent, now=0.0, longest_s=600.0)
    assert held.visit.host_wait_s == 30.0 and stops_batch(held)
    assert with_rate_limit(stored, FetchResult(API, API, 200), 0.0, 600.0) is stored
    release = fold_release([held], [], [], PolitenessPolicy(0.25, 0.0), clock=lambda: 1000.0)
    assert release.host_delay_ms == pytest.approx(30_000)


def test_answers_an_expression_cannot_apply_to_or_too_deep_to_parse_are_tolerated() -> None:
    # The API's data, not the rule, is wrong: nothing is found, or the body is not JSON.
    assert _read({"items": [1, "a"]}, {"records": "sort(items)", "fields": {"n": "abs(@)"}}).records == ()
    assert _read({"items": [{"n": "x"}]}, {"records": "items", "fields": {"n": "abs(n)"}}).records == ({"n": None},)
    with pytest.raises(NotJson):
        _read(b"[" * 100_000 + b"]" * 100_000, {"records": "@"})
