"""url_id: the same id for a page in its record, its WARC capture and index line, its failure and its
task's trail, so the outputs of different jobs (and tools) join on it."""

from __future__ import annotations

import io
import json
import time
import uuid
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

import tasks
from frontier.url_ids import url_id
from storage.warc import URL_ID_HEADER
from tests.integration.conftest import run_job, wait_for_end
from tests.site import TestSite, link_page

pytestmark = pytest.mark.usefixtures("worker")


def test_records_warc_failures_and_two_jobs_share_each_pages_url_id(site: TestSite) -> None:
    site.add_page("/", link_page("/a?utm_source=x", "/b", "/missing"))
    for path in ("/a", "/b"):
        site.add_page(path, f"<html><body><h1>{path}</h1></body></html>")
    rules = [{"pattern": "", "analyzer": "fields", "fields": {"title": "h1"}}]
    ids = {}
    for kind in ("first", "second"):
        job_id = f"url-ids-{kind}-{uuid.uuid4().hex[:6]}"
        status = run_job({"id": job_id, "seeds": [site.url("/")], "warc": True, "rules": rules,
                          "politeness": {"min_interval_s": 0, "jitter": 0}})  # fmt: skip
        assert status["state"] == "completed", status
        ids[kind] = job_outputs(job_id)

    first, second = ids["first"], ids["second"]
    expected = {site.url(p): url_id(site.url(p)) for p in ("/", "/a", "/b")}
    assert first["records"] == expected == second["records"]  # two jobs: one id per page
    missing = {site.url("/missing"): url_id(site.url("/missing"))}
    assert first["warc"] == first["cdxj"] == {**expected, **missing}  # the 404 is archived too
    assert first["failures"] == missing


def job_outputs(job_id: str) -> dict[str, dict[str, str]]:
    deadline = time.monotonic() + 20
    while (tasks.job_status(job_id) or {}).get("outputs_pending") and time.monotonic() < deadline:
        time.sleep(0.05)
    out = io.StringIO()
    tasks.export_records(job_id, out, "jsonl")
    records = {r["url"]: r["url_id"] for r in map(json.loads, out.getvalue().splitlines())}
    store = tasks.deps.storage()
    warc, cdxj = {}, {}
    for location in store.list_files(f"jobs/{job_id}/warc"):
        if location.endswith(".warc.gz"):
            with open(location, "rb") as stream:
                for record in ArchiveIterator(stream):
                    if record.rec_type in ("response", "request"):
                        warc[record.rec_headers.get_header("WARC-Target-URI")] = record.rec_headers.get_header(
                            URL_ID_HEADER
                        )
        elif location.endswith(".cdxj"):
            for line in Path(location).read_text().splitlines():
                entry = json.loads(line.split(" ", 2)[2])
                cdxj[entry["url"]] = entry["url_id"]
    failures = {f["url"]: f["url_id"] for f in tasks.job_failures(job_id)}
    return {"records": records, "warc": warc, "cdxj": cdxj, "failures": failures}


def test_a_single_tasks_trail_carries_its_url_id(site: TestSite) -> None:
    url = site.add_page("/single", "<html><body><a href='/x'>x</a></body></html>")
    task_id = tasks.crawl.delay({"url": url}).id
    trail = wait_for_end(task_id)
    assert trail["url_id"] == url_id(url)
