"""page_type api on the session's worker: a local JSON API paged by cursor and by page number, a 429 on
the way, detail endpoints followed, a secret sent and kept out of everything stored, a missing one."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from warcio.archiveiterator import ArchiveIterator

import tasks
from storage.records import read_records
from tests.integration.conftest import TEST_API_SECRET, run_job, wait_for_end
from tests.proxy import ForwardProxy
from tests.site import NOT_PAGES, Response, TestSite

pytestmark = pytest.mark.usefixtures("worker")

FAST = {"min_interval_s": 0.0}
JSON = {"Content-Type": "application/json"}


def answer(body: Any, status: int = 200, **headers: str) -> Response:
    return Response(json.dumps(body).encode(), status, {**JSON, **{k.replace("_", "-"): v for k, v in headers.items()}})


def records_of(job_id: str) -> list[dict[str, Any]]:
    tasks.deps.flush_records()
    return list(read_records(tasks.deps.storage(), f"jobs/{job_id}/records"))


def api_requests(site: TestSite) -> Counter[str]:
    return Counter(seen.path for seen in site.seen if seen.path not in NOT_PAGES)


def cursor_api(site: TestSite, pages: int = 5, per_page: int = 7, throttled: int | None = 2) -> str:
    """``pages`` pages of ``per_page`` records, chained by cursors; page ``throttled`` answers 429 first."""
    for number in range(pages):
        path = "/v1/items?limit=7" + (f"&cursor=c{number}" if number else "")
        items = [{"id": number * per_page + n, "name": f"item {number}.{n}"} for n in range(per_page)]
        body = {"data": {"items": items}, "meta": {"next": f"c{number + 1}" if number + 1 < pages else None}}
        if number == throttled:
            site.add_sequence(path, [answer({"error": "slow down"}, 429, Retry_After="1"), answer(body)])
        else:
            site.add_response(path, answer(body))
    return site.url("/v1/items?limit=7")


CURSOR_RULE = {
    "pattern": "/v1/items",
    "page_type": "api",
    "api": {"records": "data.items", "cursor": {"field": "meta.next", "param": "cursor"}},
}


def test_cursor_paged_api_yields_every_record_once_through_a_429(site: TestSite) -> None:
    seed = cursor_api(site)
    # max_depth 0: next pages are at their page's depth, so paging never spends the depth.
    status = run_job({"seeds": [seed], "politeness": FAST, "max_depth": 0, "rules": [CURSOR_RULE]})

    assert status["state"] == "completed", status
    records = records_of(status["job"])
    assert sorted(record["data"]["id"] for record in records) == list(range(35))  # each once
    assert {record["analyzer"] for record in records} == {"api"} and status["records"] == 35
    assert api_requests(site) == {
        "/v1/items?limit=7": 1,
        "/v1/items?limit=7&cursor=c1": 1,
        "/v1/items?limit=7&cursor=c2": 2,  # 429 with Retry-After: 1, then the page
        "/v1/items?limit=7&cursor=c3": 1,
        "/v1/items?limit=7&cursor=c4": 1,
    }
    first, second = site.requests_to("/v1/items?limit=7&cursor=c2")
    assert second.at - first.at >= 0.9  # Retry-After was honoured
    assert all(seen.headers.get("Accept", "").startswith("application/json") for seen in site.seen
               if seen.path not in NOT_PAGES)  # fmt: skip


def test_api_pages_go_through_the_jobs_proxy(site: TestSite) -> None:
    seed = cursor_api(site, pages=3, throttled=None)
    with ForwardProxy() as proxy:
        job = {"seeds": [seed], "politeness": FAST, "max_depth": 0, "rules": [CURSOR_RULE], "proxies": [proxy.url]}
        status = run_job(job)

    assert status["state"] == "completed", status
    assert sorted(record["data"]["id"] for record in records_of(status["job"])) == list(range(21))
    api_paths = set(api_requests(site))
    assert len(api_paths) == 3
    proxied = [seen for seen in proxy.seen if seen.forwarded]
    assert {site.url(path) for path in api_paths} <= {seen.target for seen in proxied}  # every API page, proxied
    assert all(seen.method == "GET" for seen in proxied)
    # Nothing reached the API but through the proxy: as many API requests at the site as the proxy forwarded.
    api_urls = {site.url(path) for path in api_paths}
    assert sum(seen.path in api_paths for seen in site.seen) == sum(seen.target in api_urls for seen in proxied)


def test_a_cursor_that_comes_back_ends_at_dedup(site: TestSite) -> None:
    site.add_response("/loop", answer({"items": [1, 2], "next": "again"}))
    site.add_response("/loop?cursor=again", answer({"items": [3], "next": "again"}))
    api = {"records": "items", "cursor": {"field": "next", "param": "cursor"}}
    rule = {"pattern": "/loop", "page_type": "api", "api": api}
    status = run_job({"seeds": [site.url("/loop")], "politeness": FAST, "rules": [rule]})

    assert status["state"] == "completed" and status["records"] == 3
    assert api_requests(site) == {"/loop": 1, "/loop?cursor=again": 1}


def test_page_numbers_until_an_empty_page_and_detail_endpoints_followed(site: TestSite) -> None:
    for number in range(1, 6):  # pages 1-4 hold 3 records each, page 5 none
        items = [{"id": f"{number}-{n}", "href": f"/v1/things/{number}-{n}"} for n in range(3)] if number < 5 else []
        site.add_response(f"/v1/list?page={number}&per_page=3", answer({"results": items}))
        for item in items:
            site.add_response(item["href"], answer({"id": item["id"], "detail": {"size": len(item["id"])}}))
    site.add_response("/v1/list?per_page=3", answer({"results": [{"id": "never"}]}))  # not asked: page 1 is given
    rules = [
        {"pattern": "/v1/things/", "page_type": "api", "api": {"fields": {"id": "id", "size": "detail.size"}}},
        {
            "pattern": "/v1/list",
            "page_type": "api",
            "api": {
                "records": "results",
                "fields": {"id": "id"},
                "page": {"param": "page", "size_param": "per_page", "size": 3},
                "follow": ["results[].href"],
            },
        },
    ]
    seed = site.url("/v1/list?page=1&per_page=3")
    status = run_job({"seeds": [seed], "politeness": FAST, "max_depth": 1, "rules": rules})

    assert status["state"] == "completed", status
    records = records_of(status["job"])
    listed = sorted(r["data"]["id"] for r in records if "/v1/list" in r["url"])
    details = sorted((r["data"]["id"], r["data"]["size"]) for r in records if "/v1/things/" in r["url"])
    expected = sorted(f"{number}-{n}" for number in range(1, 5) for n in range(3))
    assert listed == expected and details == [(key, 3) for key in expected]
    asked = api_requests(site)
    assert asked["/v1/list?page=5&per_page=3"] == 1 and "/v1/list?page=6&per_page=3" not in asked
    assert "/v1/list?per_page=3" not in asked and set(asked.values()) == {1}


def test_a_spent_rate_limit_holds_the_host_until_its_reset(site: TestSite) -> None:
    site.add_response("/rl?page=1", answer({"items": [1]}, X_RateLimit_Remaining="0", X_RateLimit_Reset="1"))
    site.add_response("/rl?page=2", answer({"items": []}))
    rule = {"pattern": "/rl", "page_type": "api", "api": {"records": "items", "page": {"param": "page"}}}
    status = run_job({"seeds": [site.url("/rl?page=1")], "politeness": FAST, "rules": [rule]})

    assert status["state"] == "completed" and status["records"] == 1
    [first], [second] = site.requests_to("/rl?page=1"), site.requests_to("/rl?page=2")
    assert second.at - first.at >= 0.9


def test_the_auth_secret_is_sent_and_kept_out_of_status_records_warc_and_logs(
    site: TestSite, caplog: pytest.LogCaptureFixture
) -> None:
    seed = cursor_api(site, pages=2, throttled=None)
    rule = {**CURSOR_RULE, "auth": "TEST"}
    with caplog.at_level(logging.DEBUG):
        status = run_job({"seeds": [seed], "politeness": FAST, "warc": True, "rules": [rule]})
    tasks.deps.close_warc()

    assert status["state"] == "completed" and status["records"] == 14, status
    sent = [seen for seen in site.seen if seen.path not in NOT_PAGES]
    assert len(sent) == 2 and all(seen.headers.get("Authorization") == TEST_API_SECRET for seen in sent)
    # Only the API's own requests: not robots.txt, not the sitemap discovered.
    assert "Authorization" not in site.requests_to("/robots.txt")[0].headers
    assert all("Authorization" not in seen.headers for seen in site.requests_to("/sitemap.xml"))
    secret = TEST_API_SECRET.split()[-1]
    assert secret not in json.dumps(status) and secret not in json.dumps(records_of(status["job"]))
    spec = tasks.deps.frontier().jobs.raw_state(status["job"])["spec"]
    assert '"auth":"TEST"' in spec and secret not in spec  # the job names the secret, never holds it
    assert "robots.txt of" in caplog.text and secret not in caplog.text  # the worker's debug lines were caught
    requests_archived = []
    for path in tasks.deps.storage().list_files(f"jobs/{status['job']}/warc"):
        if path.endswith(".warc.gz"):
            assert secret.encode() not in Path(path).read_bytes()  # compressed: also read record by record
            with open(path, "rb") as stream:
                for record in ArchiveIterator(stream):
                    if record.rec_type == "request" and not record.rec_headers.get_header("WARC-Target-URI").endswith(
                        "/sitemap.xml"
                    ):  # the sitemap discovered is archived too, with no secret at all
                        requests_archived.append(record.http_headers.get_header("Authorization"))
                    assert secret.encode() not in record.content_stream().read()
    assert requests_archived == ["***", "***"]


def test_a_missing_auth_secret_fails_the_job_naming_the_variable(site: TestSite) -> None:
    seed = cursor_api(site, pages=2, throttled=None)
    status = run_job({"seeds": [seed], "politeness": FAST, "rules": [{**CURSOR_RULE, "auth": "NOT_SET_HERE"}]})

    assert status["state"] == "failed", status
    assert "VCRAWL_API_AUTH_NOT_SET_HERE is not set" in status["error"]
    assert not api_requests(site)  # nothing was sent without the secret


def test_a_single_api_task_writes_the_records_of_its_one_page(site: TestSite) -> None:
    seed = cursor_api(site, pages=2, throttled=None)
    task = {"url": seed, "page_type": "api", "auth": "TEST", **{k: v for k, v in CURSOR_RULE.items() if k == "api"}}
    record = wait_for_end(tasks.crawl.delay(task).id)

    assert record["state"] == "analyzed", record
    result = json.loads(Path(record["result_path"]).read_text())
    assert [item["id"] for item in result["records"]] == list(range(7))
    assert result["next"] == site.url("/v1/items?limit=7&cursor=c1") and result["follow"] == []
    assert api_requests(site) == {"/v1/items?limit=7": 1}  # a single task fetches its one URL
    assert site.requests_to("/v1/items?limit=7")[0].headers["Authorization"] == TEST_API_SECRET


def test_a_single_api_task_without_its_secret_fails_naming_the_variable(site: TestSite) -> None:
    seed = cursor_api(site, pages=1, throttled=None)
    task = {"url": seed, "page_type": "api", "auth": "NOT_SET_HERE", "api": {"records": "data.items"}}
    record = wait_for_end(tasks.crawl.delay(task).id)

    assert record["state"] == "download_failed" and "VCRAWL_API_AUTH_NOT_SET_HERE" in record["error"], record
    assert not api_requests(site)
