"""Batch analysis and replay of a crawl stored on HDFS: pages, fetch log, chunks, partials and result all there.

No Hadoop can run here: the WebHDFS protocol-level test server (tests/webhdfs_server.py) stands in
for the NameNode; the client under test is the real ``hdfs`` package. Real processes otherwise: a
redis-server of its own and a ``celery -A tasks worker`` on every queue, at the shipped settings.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from cli.local_redis import LocalRedis
from frontier import Frontier
from tests.cluster import REPO, cluster_env, start_job, start_worker, stop_worker
from tests.site import TestSite, link_page
from tests.webhdfs_server import WebHdfsTestServer
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = pytest.mark.slow


def vcrawl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=180)  # fmt: skip


def test_a_crawl_stored_on_hdfs_is_analysed_and_replayed_from_hdfs(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "redis") as server, WebHdfsTestServer() as hdfs, TestSite() as site:
        site.add_page("/", link_page("/a", "/b", "/missing"))
        site.add_page("/a", "<html><head><title>A</title></head><body><a href='/missing'>x</a></body></html>")
        site.add_page("/b", "<html><head><title>B</title></head><body>b</body></html>")
        settings = Settings(redis_url=server.url, data=f"hdfs://{hdfs.namenode}/crawl", hdfs_user="vcrawl",
                            allowed_networks=("127.0.0.0/8",))  # fmt: skip
        env = cluster_env(settings)
        worker = start_worker(env, "hdfs", tmp_path / "worker.log", concurrency=4)
        try:
            job_id = start_job(env, {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0}})
            deadline = time.monotonic() + 60
            while (status := job_status(Frontier(redis.Redis.from_url(server.url)), job_id))["state"] == "running":
                assert time.monotonic() < deadline, status
                time.sleep(0.1)
            analysed = vcrawl(env, "analyze", job_id, "--analyzer", "site-report", "--chunk", "2", "--json")
            rules = tmp_path / "rules.json"
            rules.write_text(json.dumps({"title": "title"}))
            replayed = vcrawl(env, "reanalyze", job_id, "--analyzer", "fields", "--fields", str(rules), "--json")
        finally:
            stop_worker(worker)
        report = json.loads(hdfs.read(f"/crawl/jobs/{job_id}/results/site-report.json") or b"{}")
        run = json.loads(replayed.stdout.splitlines()[-1]) if replayed.returncode == 0 else {}
        records = [
            json.loads(line)
            for path in hdfs.walk(f"/crawl/jobs/{job_id}/replays/{run.get('run')}/records")
            for line in (hdfs.read(path) or b"").decode().splitlines()
        ]
        fetch_log = hdfs.walk(f"/crawl/jobs/{job_id}/fetch-log")

    assert status["state"] == "completed" and status["pages_stored"] == 3, status
    assert analysed.returncode == 0, analysed.stderr
    assert json.loads(analysed.stdout.splitlines()[-1])["result"] == (
        f"hdfs://{hdfs.namenode}/crawl/jobs/{job_id}/results/site-report.json"
    )
    assert fetch_log and report["totals"]["pages"] == 3
    host = report["hosts"][site.base.split("//")[1]]
    assert host["broken_links"] == {site.url("/missing"): {"status": 404, "referrers": [site.url("/"), site.url("/a")]}}
    assert replayed.returncode == 0, replayed.stderr
    assert sorted(record["data"]["fields"]["title"] or "" for record in records) == ["", "A", "B"]
