"""A batch analysis map message lost for good is sent again within the node timeout, at the shipped settings.

kombu's Redis transport takes a message off its queue (BRPOP) before it notes it as unacknowledged; a
worker SIGKILLed between the two loses it, and nothing of the broker's brings it back. The test makes
that loss for real on a private redis-server: `vcrawl analyze` sends its chord while no analysis
worker runs, the test takes one map message off the queue, then an analysis worker subprocess starts.
The visibility timeout stays at its shipped hour: the watchdog must not wait for it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from batch_analysis.runs import AnalysisRuns
from celeryconfig import ANALYSIS_QUEUE, queue_lists
from cli.local_redis import LocalRedis
from frontier import Frontier
from tasks.batch_analysis import map_task_id
from tests.cluster import REPO, cluster_env, start_job, start_worker
from tests.faults.test_batch_analysis_kill import stop_everything
from tests.site import TestSite
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = [pytest.mark.slow, pytest.mark.faults]  # a lost message: with the fault tests (make test-faults)

LOST_CHUNK = 4
PAGES = 30  # + the home page: 31 URLs, 11 chunks of 3


def serve_pages(site: TestSite) -> None:
    links = "".join(f'<a href="/p{n}">p{n}</a>' for n in range(PAGES))
    site.add_page("/", f"<html><body>{links}</body></html>")
    for n in range(PAGES):
        site.add_page(f"/p{n}", f'<html><head><title>p{n}</title></head><body><a href="/">home</a></body></html>')


def wait_for(check: object, timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():  # type: ignore[operator]
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def ended(client: redis.Redis, job_id: str) -> dict | None:
    status = job_status(Frontier(client), job_id)
    return status if status is not None and status["state"] != "running" else None


def analyze(env: dict[str, str], job_id: str, chunk: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "cli", "analyze", job_id, "--analyzer", "site-report", "--chunk", str(chunk),
               "--json", "--timeout", "120"]  # fmt: skip
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def report_of(process: subprocess.Popen[str]) -> tuple[dict, dict]:
    out, err = process.communicate(timeout=180)
    assert process.returncode == 0, err
    run = json.loads(out.splitlines()[-1])
    report = json.loads(Path(run["result"]).read_text())
    return run, {key: report[key] for key in ("hosts", "totals", "urls")}


def take_off_the_queue(client: redis.Redis, task_id: str) -> int:
    """Remove the message of ``task_id`` from the analysis queue, as a worker's BRPOP would."""
    for key in queue_lists(ANALYSIS_QUEUE):
        for payload in client.lrange(key, 0, -1):
            if f'"id": "{task_id}"' in payload:
                return int(client.lrem(key, 1, payload))
    return 0


def test_a_map_message_lost_off_the_queue_is_sent_again_within_the_node_timeout(tmp_path: Path) -> None:
    settings = Settings()
    assert settings.visibility_timeout_s >= 3600  # the shipped hour: waiting for it is what must not happen
    with LocalRedis(tmp_path / "redis") as server, TestSite() as site:
        env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data")))
        client = redis.Redis.from_url(server.url, decode_responses=True)
        serve_pages(site)
        workers = [start_worker(env, "crawler", tmp_path / "crawler.log")]
        analysis: subprocess.Popen[str] | None = None
        try:
            job_id = start_job(env, {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0}})
            status = wait_for(lambda: ended(client, job_id), 60, "the crawl")
            assert status["state"] == "completed" and status["pages_stored"] == PAGES + 1, status  # type: ignore[index]
            workers[0].terminate()  # warm shutdown: ships its fetch log; nothing takes the chord's messages
            workers[0].wait(30)
            analysis = analyze(env, job_id, chunk=3)
            runs = AnalysisRuns(client)
            sent = wait_for(lambda: [run for run in runs.list(job_id) if run.get("sent_at")], 60, "the chord sent")
            run_id = sent[0]["run"]  # type: ignore[index]
            assert take_off_the_queue(client, map_task_id(run_id, LOST_CHUNK)) == 1
            workers.append(start_worker(env, "analyst", tmp_path / "analyst.log", queues="analysis"))
            consuming_at = time.monotonic()
            run, disturbed = report_of(analysis)
            finished_s = time.monotonic() - consuming_at
            _, undisturbed = report_of(analyze(env, job_id, chunk=100))
        finally:
            stop_everything(analysis, workers)
    log = (tmp_path / "analyst.log").read_text()
    assert f"the messages of chunks [{LOST_CHUNK}] were lost; sent again" in log
    assert run["chunks"] == 11 and run.get("resent_at") is not None
    # The other 10 chunks take a second; the look comes 10 s after, within one watchdog period (5 s).
    assert finished_s < settings.node_timeout_s, f"report {finished_s:.1f}s after the worker started"
    assert disturbed == undisturbed
    assert disturbed["totals"]["pages"] == PAGES + 1
