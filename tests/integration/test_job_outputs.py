"""Completed means stored: right after ``vcrawl submit --wait`` returns, with the worker still running,
the job's WARC files (with their indexes) and record parts are in storage, local or HDFS.

Real processes: a redis-server of its own, a ``celery -A tasks worker`` at the shipped settings
(WARC files roll at 1 GiB, records ship every 60 s: only the completion ships them this soon),
the ``vcrawl`` command line. Re-crawl cycles run on the session's worker, started as beat would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from warcio.archiveiterator import ArchiveIterator

import tasks
from cli.local_redis import LocalRedis
from storage.warc import SERVER_NOT_MODIFIED
from tests.cluster import REPO, cluster_env, start_worker, stop_worker
from tests.site import TestSite, link_page
from tests.webhdfs_server import WebHdfsTestServer
from vcrawl.settings import Settings

pytestmark = pytest.mark.slow

WARCIO = str(Path(sys.executable).with_name("warcio"))
PAGES = 12


def vcrawl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=180)  # fmt: skip


def build_site(site: TestSite) -> set[str]:
    """A home page linking PAGES pages (and one 404); return the URLs of the pages that are stored."""
    paths = [f"/p{n}" for n in range(PAGES)]
    site.add_page("/", link_page(*paths, "/missing"))
    for n, path in enumerate(paths):
        site.add_page(path, f"<html><head><title>page {n}</title></head><body><h1>page {n}</h1></body></html>")
    return {site.url(path) for path in ["/", *paths]}


def job_file(tmp_path: Path, site: TestSite, job_id: str) -> Path:
    rules = [{"pattern": "", "analyzer": "fields", "fields": {"title": "h1"}}]
    job = {"id": job_id, "seeds": [site.url("/")], "warc": True, "rules": rules, "politeness": {"min_interval_s": 0}}
    path = tmp_path / f"{job_id}.json"
    path.write_text(json.dumps(job))
    return path


def warc_summary(files: list[Path]) -> tuple[set[str], list[str]]:
    """(URLs with a 200 response record, files that ``warcio check`` refuses)."""
    ok, bad = set(), []
    for path in files:
        if subprocess.run([WARCIO, "check", str(path)], capture_output=True, timeout=60).returncode != 0:
            bad.append(path.name)
        with open(path, "rb") as stream:
            for record in ArchiveIterator(stream):
                if record.rec_type == "response" and record.http_headers.get_statuscode() == "200":
                    ok.add(record.rec_headers.get_header("WARC-Target-URI"))
    return ok, bad


def submit_and_wait(env: dict[str, str], job: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = vcrawl(env, "submit", str(job), "--wait", "--json", "--timeout", "120")
    return done, time.monotonic() - started


def test_right_after_submit_wait_the_warc_and_records_are_in_local_storage(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "redis") as server, TestSite() as site:
        stored = build_site(site)
        data = tmp_path / "data"
        env = cluster_env(Settings(redis_url=server.url, data=str(data)))
        worker = start_worker(env, "outputs", tmp_path / "worker.log", concurrency=4)
        try:
            done, took_s = submit_and_wait(env, job_file(tmp_path, site, "outputs-local"))
            # At once, the worker still running: what a user archiving the job would read.
            alive = worker.poll() is None
            files = sorted((data / "jobs/outputs-local/warc").glob("*.warc.gz"))
            indexes = sorted((data / "jobs/outputs-local/warc").glob("*.warc.gz.cdxj"))
            record_parts = sorted((data / "jobs/outputs-local/records").glob("*.jsonl"))
            status = json.loads(vcrawl(env, "status", "outputs-local", "--json").stdout.splitlines()[-1])
        finally:
            stop_worker(worker)

    assert done.returncode == 0, done.stderr
    assert alive and took_s < 60, took_s
    assert status["state"] == "completed" and status["pages_stored"] == len(stored), status
    responses, refused = warc_summary(files)
    assert responses == stored and not refused
    assert len(indexes) == len(files) >= 1
    titles = [
        json.loads(line)["data"]["fields"]["title"] for part in record_parts for line in part.read_text().splitlines()
    ]
    assert len(titles) == len(stored)
    assert status["outputs_pending"] == 0
    assert {Path(location).name for location in status["outputs"]} >= {p.name for p in [*files, *record_parts]}


def test_right_after_submit_wait_the_warc_and_records_are_on_hdfs(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "redis") as server, WebHdfsTestServer() as hdfs, TestSite() as site:
        stored = build_site(site)
        settings = Settings(redis_url=server.url, data=f"hdfs://{hdfs.namenode}/crawl", hdfs_user="vcrawl")
        env = cluster_env(settings)
        worker = start_worker(env, "outputs-hdfs", tmp_path / "worker.log", concurrency=4)
        try:
            done, took_s = submit_and_wait(env, job_file(tmp_path, site, "outputs-hdfs"))
            alive = worker.poll() is None
            shipped = {path: hdfs.read(path) or b"" for path in hdfs.walk("/crawl/jobs/outputs-hdfs")}
            status = json.loads(vcrawl(env, "status", "outputs-hdfs", "--json").stdout.splitlines()[-1])
        finally:
            stop_worker(worker)

    assert done.returncode == 0, done.stderr
    assert alive and took_s < 60, took_s
    files = []
    for path, content in shipped.items():
        if path.endswith(".warc.gz"):
            files.append(tmp_path / Path(path).name)
            files[-1].write_bytes(content)
    responses, refused = warc_summary(files)
    assert responses == stored and not refused
    assert sum(path.endswith(".warc.gz.cdxj") for path in shipped) == len(files) >= 1
    records = [line for path, content in shipped.items() if "/records/" in path for line in content.splitlines()]
    assert len(records) == len(stored)
    assert status["outputs_pending"] == 0
    outputs = {path.rsplit("/", 1)[-1] for path in shipped if "/warc/" in path or "/records/" in path}
    assert outputs <= {location.rsplit("/", 1)[-1] for location in status["outputs"]}


ALWAYS_DUE = {"initial_s": 0, "min_s": 0, "max_s": 0}


def run_cycle(spec: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    """One firing as beat sends it; wait until the cycle completed and its output is in storage."""
    result = tasks.start_cycle.apply(args=(spec["id"], spec), task_id=str(uuid.uuid4()))
    assert result.get(disable_sync_subtasks=False)["status"] == "started"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = tasks.job_status(spec["id"])
        assert status is not None
        if status["state"] != "running" and status["outputs_pending"] == 0:
            return status
        time.sleep(0.05)
    raise AssertionError(f"cycle or its output not done after {timeout_s}s: {tasks.job_status(spec['id'])}")


@pytest.mark.usefixtures("worker")
def test_a_second_cycle_writes_revisit_records_for_unchanged_pages(site: TestSite) -> None:
    site.add_versioned("/", link_page("/etag", "/same", "/changes"))
    site.add_versioned("/etag", "<html><body>answers 304</body></html>", validators="etag")
    site.add_versioned("/same", "<html><body>the same bytes, no validators</body></html>", validators="none")
    changes = site.add_versioned("/changes", "<html><body>first</body></html>", validators="none")
    job_id = f"outputs-revisits-{uuid.uuid4().hex[:6]}"
    spec = {"id": job_id, "seeds": [site.url("/")], "warc": True, "revisit": ALWAYS_DUE,
            "politeness": {"min_interval_s": 0}}  # fmt: skip

    first = run_cycle(spec)
    changes.change("<html><body>second</body></html>")
    second = run_cycle(spec)

    assert (first["new"], second["unchanged"], second["changed"]) == (4, 3, 1), second
    store = tasks.deps.storage()
    files = [Path(location) for location in store.list_files(f"jobs/{job_id}/warc") if location.endswith(".warc.gz")]
    responses: dict[str, list[Any]] = {}
    revisits: dict[str, Any] = {}
    for path in files:
        assert subprocess.run([WARCIO, "check", str(path)], capture_output=True, timeout=60).returncode == 0, path
        with open(path, "rb") as stream:
            for record in ArchiveIterator(stream):
                url = record.rec_headers.get_header("WARC-Target-URI")
                if record.rec_type == "response":
                    responses.setdefault(url, []).append(record.rec_headers)
                elif record.rec_type == "revisit":
                    revisits[url] = record.rec_headers
    # Cycle 1 archived every page; cycle 2 the changed page again, the unchanged ones as revisits.
    assert {url: len(found) for url, found in responses.items()} == {
        site.url("/"): 1, site.url("/etag"): 1, site.url("/same"): 1, site.url("/changes"): 2,
    }  # fmt: skip
    assert set(revisits) == {site.url("/"), site.url("/etag"), site.url("/same")}
    for url, headers in revisits.items():
        original = responses[url][0]
        assert headers.get_header("WARC-Refers-To-Target-URI") == url
        assert headers.get_header("WARC-Refers-To-Date") == original.get_header("WARC-Date")
        assert headers.get_header("WARC-Payload-Digest") == original.get_header("WARC-Payload-Digest")
    assert revisits[site.url("/etag")].get_header("WARC-Profile") == SERVER_NOT_MODIFIED
    assert revisits[site.url("/same")].get_header("WARC-Profile").endswith("/identical-payload-digest")
