"""The task graph end to end: crawl.delay -> download queue -> analysis queue, real parts only."""

from __future__ import annotations

import json
import os
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
import vcrawl_test_plugin

import tasks
from tasks import InvalidTask, crawl
from tests.integration.conftest import (
    MAX_BODY_BYTES,
    TEST_REFERERS,
    TEST_USER_AGENTS,
    AlertSinks,
    run_job,
    wait_for_end,
    wait_for_state,
)
from tests.site import Response, TestSite
from vcrawl.settings import Settings

pytestmark = pytest.mark.usefixtures("worker")

PAGE = """<!doctype html><html><head><title>Shop</title></head><body>
<h1 class="name">Claw hammer</h1><span class="price">24.90</span>
<a href="/products/saw.html">Saw <b>now</b></a> <a href="https://other.test/x?a=1">Other</a>
<img src="logo.png" alt="Logo"></body></html>"""


def test_happy_path_stores_page_writes_result_and_reports_analyzed(site: TestSite) -> None:
    url = site.add_page("/shop/index.html", PAGE)

    result = crawl.delay({"url": url})
    record = wait_for_end(result.id)

    assert record["state"] == "analyzed", record
    assert record["http_status"] == 200
    assert record["attempts"] == 1 and record["analysis_attempts"] == 1
    assert record["bytes"] == len(PAGE.encode())
    assert record["ip"] == "127.0.0.1"  # the address the page's connection was pinned to
    for stamp in ("queued_at", "downloading_at", "downloaded_at", "analyzing_at", "analyzed_at"):
        assert stamp in record, stamp
    assert record["queued_at"] <= record["downloaded_at"] <= record["analyzed_at"]
    assert Path(record["save_path"]).read_bytes() == PAGE.encode()
    links = json.loads(Path(record["result_path"]).read_text())["links"]
    assert [link["url"] for link in links] == [
        site.url("/products/saw.html"),
        "https://other.test/x?a=1",
        site.url("/shop/logo.png"),
    ]
    assert links[0]["text"] == "Saw now"


def test_fields_analyzer_writes_one_record_per_page(site: TestSite) -> None:
    url = site.add_page("/p.html", PAGE)
    rules = {"name": "h1.name", "price": "xpath://span[@class='price']/text()", "missing": "div.nope"}

    record = wait_for_end(crawl.delay({"url": url, "analyzer": "fields", "fields": rules}).id)

    assert record["state"] == "analyzed", record
    result = json.loads(Path(record["result_path"]).read_text())
    assert result["fields"] == {"name": "Claw hammer", "price": "24.90", "missing": None}


def stored_file(record: dict, settings: Settings) -> Path:
    """The file a trail's save_path names (relative paths are under the data root)."""
    path = Path(record["save_path"])
    return path if path.is_absolute() else Path(settings.data) / path


def test_404_is_download_failed_by_the_link_error_handler_without_retries(
    site: TestSite, vcrawl_settings: Settings
) -> None:
    record = wait_for_end(crawl.delay({"url": site.url("/gone.html")}).id)

    assert record["state"] == "download_failed"
    assert record["http_status"] == 404 and record["reason"] == "http_404"
    assert record["failed_task"] == "vcrawl.fetch"  # written by the link_error handler only
    assert record["attempts"] == 1
    assert len(site.requests_to("/gone.html")) == 1
    assert not stored_file(record, vcrawl_settings).exists()


def test_503_twice_then_200_succeeds_after_retries(site: TestSite) -> None:
    url = site.add_sequence("/flaky", [Response(b"busy", 503), Response(b"busy", 503), Response(PAGE.encode())])

    record = wait_for_end(crawl.delay({"url": url}).id)

    assert record["state"] == "analyzed", record
    assert record["attempts"] == 3
    assert len(site.requests_to("/flaky")) == 3
    assert "503" in record["last_error"]


def test_retry_after_is_honoured(site: TestSite) -> None:
    url = site.add_sequence("/later", [Response(b"", 429, {"Retry-After": "1"}), Response(PAGE.encode())])

    record = wait_for_end(crawl.delay({"url": url}).id)

    assert record["state"] == "analyzed", record
    first, second = site.requests_to("/later")
    # Backoff alone would retry after ~0.05 s; the server asked for 1 s.
    assert second.at - first.at >= 1.0


def test_retry_after_beyond_the_cap_fails_at_once(site: TestSite, vcrawl_settings: Settings) -> None:
    too_long = str(int(vcrawl_settings.max_retry_after_s) + 60)
    url = site.add_page("/much-later", "", status=503, Retry_After=too_long)

    record = wait_for_end(crawl.delay({"url": url}).id)

    assert record["state"] == "download_failed" and record["reason"] == "http_503"
    assert record["attempts"] == 1


@pytest.mark.parametrize(
    "response",
    [
        Response(b"x" * (MAX_BODY_BYTES + 1)),  # declared by Content-Length
        Response(b"", chunks=[b"y" * 65536] * (MAX_BODY_BYTES // 65536 + 2)),  # streamed, no length
    ],
    ids=["content-length", "streamed"],
)
def test_body_over_the_limit_is_too_large(site: TestSite, response: Response, vcrawl_settings: Settings) -> None:
    url = site.add_response("/huge", response)

    record = wait_for_end(crawl.delay({"url": url}).id)

    assert record["state"] == "download_failed"
    assert record["reason"] == "too_large"
    assert record["attempts"] == 1
    assert not stored_file(record, vcrawl_settings).exists()
    assert stored_file(record, vcrawl_settings).parent.is_relative_to(vcrawl_settings.data)


def alerts_for_task(sinks: AlertSinks, task_id: str) -> tuple[list[dict[str, Any]], list[Message]]:
    """The webhook posts and emails about ``task_id``'s failed analysis."""
    return sinks.received(
        lambda hook: hook.get("details", {}).get("task_id") == task_id,
        lambda mail: task_id in (mail.get_payload(decode=True) or b"").decode(errors="replace"),
    )


def test_failing_analyzer_gets_four_attempts_then_one_alert(site: TestSite, alert_sinks: AlertSinks) -> None:
    url = site.add_page("/buggy.html", PAGE)
    vcrawl_test_plugin.CALLS.clear()

    record = wait_for_end(crawl.delay({"url": url, "analyzer": "always_fails"}).id)

    assert record["state"] == "analysis_failed", record
    assert record["analysis_attempts"] == 4
    assert vcrawl_test_plugin.CALLS == [url] * 4
    assert "RuntimeError: analyzer bug" in record["error"]
    webhooks, emails = alerts_for_task(alert_sinks, record["id"])
    assert len(emails) == 1 and len(webhooks) == 1
    assert url in emails[0]["Subject"] and emails[0]["To"] == "ops@example.test"
    assert webhooks[0]["details"]["task_id"] == record["id"]
    assert webhooks[0]["details"]["attempts"] == 4


def test_missing_stored_page_fails_analysis_at_once_with_an_alert(site: TestSite, alert_sinks: AlertSinks) -> None:
    # The page vanishes between download and analysis: retrying cannot bring it back.
    url = site.add_page("/vanishing.html", PAGE)
    record = wait_for_end(crawl.delay({"url": url}).id)
    Path(record["save_path"]).unlink()
    page = {
        "url": url, "final_url": url, "save_path": record["save_path"], "http_status": 200,
        "bytes": 1, "content_type": "text/html", "elapsed_s": 0.0, "headers": {},
    }  # fmt: skip
    job = {"trail_id": record["id"], "analyzer": "links", "result_path": record["result_path"]}

    tasks.analyze.apply_async((page, job), link_error=tasks.record_failure.s())

    record = wait_for_state(record["id"], "analysis_failed")
    assert record["reason"] == "missing_page"
    assert record["analysis_attempts"] == 2  # the first, successful analysis and one failed attempt
    webhooks, emails = alerts_for_task(alert_sinks, record["id"])
    assert len(webhooks) == 1 and len(emails) == 1


def test_user_agent_and_referer_are_drawn_from_the_lists(site: TestSite) -> None:
    paths = [f"/ua/{n}.html" for n in range(20)]
    ids = [crawl.delay({"url": site.add_page(path, PAGE)}).id for path in paths]
    for task_id in ids:
        assert wait_for_end(task_id)["state"] == "analyzed"

    requests = [request for path in paths for request in site.requests_to(path)]
    agents = {request.headers["User-Agent"] for request in requests}
    referers = {request.headers["Referer"] for request in requests}
    assert len(requests) == 20
    assert agents <= set(TEST_USER_AGENTS) and len(agents) > 1
    assert referers <= set(TEST_REFERERS) and len(referers) > 1


def test_symlink_escape_is_refused_at_write_time(site: TestSite, vcrawl_settings: Settings, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (Path(vcrawl_settings.data) / "pages").mkdir(exist_ok=True)
    link = Path(vcrawl_settings.data) / "pages" / "escape"  # inside the single-task area, leading out
    link.symlink_to(outside, target_is_directory=True)
    try:
        url = site.add_page("/s.html", PAGE)
        with pytest.raises(InvalidTask) as refused:
            crawl.delay({"url": url, "save_path": "pages/escape/page.html"})
        assert refused.value.field == "save_path" and "escapes the storage root" in refused.value.problem
        # A message from another producer is refused on arrival, too: nothing lands outside.
        tasks.app.send_task(
            "vcrawl.fetch",
            args=[
                {"url": url, "save_path": "pages/escape/page.html", "result_path": "results/r.json"},
                "symlink-escape-1",
            ],
            link_error=tasks.record_failure.s(),
        )
        record = wait_for_end("symlink-escape-1")
        assert record["state"] == "download_failed"
        assert record["reason"] == "invalid_task" and record["error"].startswith("save_path:")
        assert os.listdir(outside) == []
    finally:
        link.unlink()


# Another job's files, its records (which `vcrawl export` lists) and vcrawl's own state.
OUT_OF_AREA = [
    ("save_path", "jobs/other-job/pages/x.html"),
    ("result_path", "jobs/other-job/records/injected.jsonl"),
    ("save_path", ".vcrawl-redis/appendonly.aof"),
    ("result_path", ".spool/records/x.jsonl"),
    ("save_path", "page.html"),
]


@pytest.mark.parametrize(("key", "location"), OUT_OF_AREA, ids=[location for _, location in OUT_OF_AREA])
def test_a_crawl_message_writing_outside_the_single_task_areas_is_refused_by_the_worker(
    site: TestSite, vcrawl_settings: Settings, key: str, location: str
) -> None:
    data = Path(vcrawl_settings.data)
    url = site.add_page(f"/area-{key}.html", PAGE)
    absolute = str(data.resolve() / location)
    name = location.replace("/", "-")
    for spelling, message_id in ((location, f"area-{name}"), (absolute, f"area-abs-{name}")):
        # send_task bypasses crawl.delay's check: the worker's crawl task validates the message itself.
        tasks.app.send_task("vcrawl.crawl", args=[{"url": url, key: spelling}], task_id=message_id)
        record = wait_for_end(message_id)
        assert record["state"] == "download_failed", record
        assert record["reason"] == "invalid_task" and record["error"].startswith(f"{key}: ")
        assert "outside the single-task areas" in record["error"]
    assert not (data / location).exists()
    assert site.requests_to(f"/area-{key}.html") == []  # refused before any fetch


def test_fetch_and_analyze_messages_outside_the_areas_are_refused_on_arrival(
    site: TestSite, vcrawl_settings: Settings
) -> None:
    data = Path(vcrawl_settings.data)
    url = site.add_page("/area-raw.html", PAGE)
    tasks.app.send_task(
        "vcrawl.fetch",
        args=[{"url": url, "save_path": "jobs/other-job/pages/x.html", "result_path": "results/x.json"}, "area-fetch"],
        link_error=tasks.record_failure.s(),
    )
    record = wait_for_end("area-fetch")
    assert record["state"] == "download_failed"
    assert record["reason"] == "invalid_task" and record["error"].startswith("save_path:")

    # An analysis message naming a job's records as its result: refused, nothing written there.
    stored = wait_for_end(crawl.delay({"url": url}).id)
    page = {
        "url": url, "final_url": url, "save_path": stored["save_path"], "http_status": 200,
        "bytes": 1, "content_type": "text/html", "elapsed_s": 0.0, "headers": {},
    }  # fmt: skip
    job = {"trail_id": stored["id"], "analyzer": "links", "result_path": "jobs/other-job/records/injected.jsonl"}
    tasks.analyze.apply_async((page, job), link_error=tasks.record_failure.s())
    record = wait_for_state(stored["id"], "analysis_failed")
    assert record["reason"] == "invalid_task" and "outside the single-task areas" in record["error"]
    assert not (data / "jobs" / "other-job").exists()
    assert len(site.requests_to("/area-raw.html")) == 1  # the refused fetch message sent no request


def test_worker_validates_messages_from_other_producers() -> None:
    tasks.app.send_task(
        "vcrawl.fetch", args=[{"url": "ftp://example.test/x"}, "raw-bad-1"], link_error=tasks.record_failure.s()
    )
    record = wait_for_end("raw-bad-1")
    assert record["state"] == "download_failed"
    assert record["reason"] == "invalid_task" and record["error"].startswith("url:")


def test_crawl_message_from_another_producer_runs_the_graph(site: TestSite) -> None:
    url = site.add_page("/raw.html", PAGE)
    result = tasks.app.send_task("vcrawl.crawl", args=[{"url": url}])
    record = wait_for_end(result.id)
    assert record["state"] == "analyzed"


def test_a_jobs_fetch_batch_that_fails_for_good_hands_its_urls_back_through_its_link_error(
    site: TestSite, vcrawl_settings: Settings
) -> None:
    # Every page write fails (the job's pages folder is a file): the error escapes vcrawl.fetch_batch,
    # which takes no Celery retries. Its link_error (vcrawl.fetch_batch_failed, run by the worker) gives
    # the lease back with one more attempt counted, then fails the URL: the job completes at once,
    # not after its lease runs out, and a batch that fails every time does not loop.
    job_id = f"fetch-breaks-{os.getpid()}-{site.address[1]}"
    pages = Path(vcrawl_settings.data) / "jobs" / job_id / "pages"
    pages.parent.mkdir(parents=True)
    pages.write_text("not a folder")
    seed = site.add_page("/", "<html><body><a href='/a'>a</a></body></html>")

    status = run_job({"id": job_id, "seeds": [seed], "politeness": {"min_interval_s": 0.0}}, timeout_s=30)

    assert status["state"] == "completed", status
    assert status["failed"] == {"fetch_task_failed": 1}, status["failed"]
    attempts = vcrawl_settings.fetch_retries + 1
    assert len(site.requests_to("/")) == attempts  # each attempt fetched, then failed to store
    failures = tasks.job_failures(job_id)
    assert [(f["url"], f["reason"]) for f in failures] == [(seed, "fetch_task_failed")], failures
