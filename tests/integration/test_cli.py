"""The command line on the embedded default: private Redis, in-process worker, JSON summary."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks import crawl
from tests.cluster import REPO
from tests.integration.conftest import redis_env, wait_for_end
from tests.site import NOT_PAGES, Response, TestSite
from tests.webhdfs_server import WebHdfsTestServer
from vcrawl.settings import Settings

pytestmark = pytest.mark.slow


def _vcrawl(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")}
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        env={**base, "PYTHONPATH": str(REPO), **(env or {})},
        cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip


def test_crawl_command_runs_a_job_itself_and_prints_a_json_summary(site: TestSite, tmp_path: Path) -> None:
    good = site.add_page("/good.html", "<a href='/x'>x</a> <a href='/good.html#again'>again</a>")
    missing = site.url("/missing.html")

    done = _vcrawl("crawl", good, missing, "--delay", "0", "--workers", "1", "--data", str(tmp_path / "data"), "--json",
                   "--allow-network", "127.0.0.1/32")  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert "private redis-server" in done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["state"] == "completed"
    assert summary["pages_fetched"] == 3 and summary["pages_stored"] == 1
    assert summary["pages_failed"] == 2 and summary["failed"] == {"http_404": 2}
    assert summary["duplicates"] == 1 and summary["robots_blocked"] == 0
    assert summary["bytes"] == len(b"<a href='/x'>x</a> <a href='/good.html#again'>again</a>")
    assert summary["data_dir"] == str((tmp_path / "data").resolve())
    # The private Redis served this run alone: its cost is the run's (benchmarks report it per page).
    assert summary["redis"]["requests"] > 0 and summary["redis"]["commands"] > 0
    assert "requests (" in done.stdout and "per page fetched" in done.stdout
    assert len(list(Path(summary["job_dir"]).rglob("*.html"))) == 1


def test_demo_crawls_the_bundled_site_by_following_links(tmp_path: Path) -> None:
    done = _vcrawl("demo", "--data", str(tmp_path / "demo"), "--json")

    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["state"] == "completed"
    assert summary["pages_stored"] == 7 and summary["records"] == 4
    assert summary["failed"] == {"http_404": 1}
    exported = _vcrawl("export", summary["job"], "--data", str(tmp_path / "demo"))
    records = [json.loads(line) for line in exported.stdout.splitlines()]
    assert sorted(r["data"]["fields"]["sku"] for r in records) == ["TS-101", "TS-202", "TS-303", "TS-404"]
    as_csv = _vcrawl("export", summary["job"], "--format", "csv", "--data", str(tmp_path / "demo"))
    header, *rows = as_csv.stdout.splitlines()
    assert header.startswith("url,final_url,fetched_at,job,analyzer,") and "sku" in header and len(rows) == 4


def test_submit_status_and_cancel_against_a_running_cluster(
    worker: object, vcrawl_settings: Settings, site: TestSite, tmp_path: Path
) -> None:
    for n in range(30):
        site.add_page(f"/p{n}.html", f"<a href='/p{n + 1}.html'>next</a>")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"seeds: [{site.url('/p0.html')}]\nmax_depth: 50\npoliteness: {{min_interval_s: 0.3}}\n")
    env = {**redis_env(vcrawl_settings), "VCRAWL_DATA": vcrawl_settings.data}

    submitted = _vcrawl("submit", str(job_file), env=env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    time.sleep(1.0)
    shown = _vcrawl("status", job_id, "--json", env=env)
    cancelled = _vcrawl("cancel", job_id, env=env)
    again = _vcrawl("cancel", job_id, env=env)

    assert json.loads(shown.stdout)["state"] == "running"
    assert cancelled.returncode == 0 and again.returncode == 1
    assert json.loads(_vcrawl("status", job_id, "--json", env=env).stdout)["state"] == "cancelled"
    assert _vcrawl("submit", str(tmp_path / "missing.yaml"), env=env).returncode == 2


def test_submit_wait_follows_the_job_on_the_cluster_to_its_end(
    worker: object, vcrawl_settings: Settings, site: TestSite, tmp_path: Path
) -> None:
    for n in range(5):
        site.add_page(f"/w{n}.html", f"<a href='/w{n + 1}.html'>next</a>")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"seeds: [{site.url('/w0.html')}]\nmax_depth: 10\npoliteness: {{min_interval_s: 0}}\n")
    env = {**redis_env(vcrawl_settings), "VCRAWL_DATA": vcrawl_settings.data}

    done = _vcrawl("submit", str(job_file), "--wait", "--json", env=env)

    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["state"] == "completed" and summary["pages_stored"] == 5 and summary["failed"] == {"http_404": 1}
    assert "redis" not in summary  # a cluster's Redis serves others too: its cost is not this run's


def test_status_command_shows_the_trail(worker: object, vcrawl_settings: Settings, site: TestSite) -> None:
    task_id = crawl.delay({"url": site.add_page("/s.html", "<p>hi</p>")}).id
    wait_for_end(task_id)
    env = redis_env(vcrawl_settings)

    shown = _vcrawl("status", task_id, "--json", env=env)
    unknown = _vcrawl("status", "no-such-task", env=env)

    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)
    assert record["state"] == "analyzed" and record["http_status"] == 200 and record["attempts"] == 1
    assert unknown.returncode == 1 and "no job or task" in unknown.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_stops_promptly_and_leaves_no_redis_behind(site: TestSite, tmp_path: Path, signum: int) -> None:
    url = site.add_response("/stuck", Response(b"late", delay_s=20))
    base = {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "crawl", url, "--workers", "1", "--data", str(tmp_path / "data"),
         "--allow-network", "127.0.0.1/32"],
        env={**base, "PYTHONPATH": str(REPO)}, cwd=REPO, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first_line = process.stderr.readline()  # "started a private redis-server (pid N)"
        redis_pid = int(re.search(r"pid (\d+)", first_line).group(1))
        second_line = process.stderr.readline()  # "started 1 worker processes (pids [N])"
        worker_pids = [int(pid) for pid in re.findall(r"\d+", second_line.split("pids", 1)[1])]
        deadline = time.monotonic() + 20
        while not site.requests_to("/stuck") and time.monotonic() < deadline:
            time.sleep(0.05)
        sent_at = time.monotonic()
        process.send_signal(signum)
        process.wait(15)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    assert process.returncode == 130
    # What the run waits by design (cli/run.py), ~6.5 s here: the default --grace of 4 s (/stuck stays
    # in flight all of it), 2 s for the workers' warm shutdown before they are killed, Redis's stop.
    # 4 s of slack for a loaded machine (8 s left 1.5 s); an ignored interrupt would wait /stuck's 20 s.
    assert time.monotonic() - sent_at < 4.0 + 2.0 + 4.0
    assert len(worker_pids) == 1
    for pid in [redis_pid, *worker_pids]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_crawl_to_hdfs_moves_every_output_there(site: TestSite) -> None:
    site.add_page("/", "<a href='/p.html'>p</a> <a href='/gone.html'>gone</a>")
    site.add_page("/p.html", "<h1>Product</h1>")
    with WebHdfsTestServer() as hdfs:
        done = _vcrawl(
            "crawl", site.url("/"), "--delay", "0", "--workers", "1", "--warc", "--analyzer", "fields",
            "--data", f"hdfs://{hdfs.namenode}/crawl", "--json", "--allow-network", "127.0.0.1/32",
            env={"VCRAWL_HDFS_USER": "vcrawl"},
        )  # fmt: skip
        assert done.returncode == 2  # the fields analyzer needs rules: refused before anything runs
        done = _vcrawl(
            "crawl", site.url("/"), "--delay", "0", "--workers", "1", "--warc", "--analyzer", "links",
            "--data", f"hdfs://{hdfs.namenode}/crawl", "--json", "--allow-network", "127.0.0.1/32",
            env={"VCRAWL_HDFS_USER": "vcrawl"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        job = f"/crawl/jobs/{summary['job']}"
        pages = hdfs.walk(f"{job}/pages")
        records = hdfs.walk(f"{job}/records")
        warcs = hdfs.walk(f"{job}/warc")
        exported = _vcrawl("export", summary["job"], "--data", f"hdfs://{hdfs.namenode}/crawl",
                           env={"VCRAWL_HDFS_USER": "vcrawl"})  # fmt: skip

    assert summary["pages_stored"] == 2 and summary["records"] == 2
    assert summary["job_dir"] == f"hdfs://{hdfs.namenode}{job}"
    assert len(pages) == 2 and records and any(w.endswith(".warc.gz") for w in warcs)
    assert any(w.endswith(".cdxj") for w in warcs)
    assert len(exported.stdout.splitlines()) == 2


def test_crawl_command_runs_an_api_job_with_the_secret_its_workers_get(site: TestSite, tmp_path: Path) -> None:
    for number in (1, 2, 3):
        items = [{"id": number * 10 + n} for n in range(2)] if number < 3 else []
        site.add_response(f"/v1/items?page={number}", Response(json.dumps({"data": items}).encode(), 200,
                                                               {"Content-Type": "application/json"}))  # fmt: skip
    job = tmp_path / "api.yaml"
    job.write_text(
        f"seeds: ['{site.url('/v1/items?page=1')}']\n"
        "politeness: {min_interval_s: 0}\n"
        "rules:\n"
        "  - {pattern: /v1/items, page_type: api, auth: ACME, api: {records: data, page: {param: page}}}\n"
    )
    args = ("crawl", "--job", str(job), "--workers", "1", "--data", str(tmp_path / "data"), "--json",
            "--allow-network", "127.0.0.1/32")  # fmt: skip

    refused = _vcrawl(*args)
    assert refused.returncode == 2 and "rules[0].auth: VCRAWL_API_AUTH_ACME is not set" in refused.stderr
    assert not site.seen  # refused before anything ran

    done = _vcrawl(*args, env={"VCRAWL_API_AUTH_ACME": "X-Api-Key: k-123"})
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["state"] == "completed" and summary["records"] == 4, summary
    assert [seen.headers.get("X-Api-Key") for seen in site.seen if seen.path not in NOT_PAGES] == ["k-123"] * 3
    assert "k-123" not in done.stdout + done.stderr
