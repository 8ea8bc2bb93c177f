"""A batch analysis survives the SIGKILL of its analysis worker mid-chord: the same result, nothing lost.

Its own redis-server, a crawl worker, then an analysis worker killed while a map runs (a slow
plugin batch analyzer: the site report, each map sleeping first) and a fresh one started. The
killed map's message comes back when the killed worker is declared down (the shipped node timeout,
30 s; the visibility timeout stays at its shipped hour) and runs again; the chord then completes
with the report an undisturbed run gives. With two analysis workers, one killed and none started,
the report comes within the node timeout and a little, also when a map message the killed worker
had taken off the queue without noting it is lost for good (the watchdog sends it again).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from batch_analysis.runs import AnalysisRuns
from celeryconfig import ANALYSIS_QUEUE, queue_lists
from cli.local_redis import LocalRedis
from frontier import Frontier
from tests.cluster import REPO, cluster_env, start_worker, stop_worker
from tests.conftest import PLUGIN_SITE
from tests.faults.test_faults import (
    TAKEOVER_S,
    Note,
    lines,
    serve_pages,
    start_job,
    stop_gracefully,
    wait_done,
)
from tests.site import TestSite
from vcrawl.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.faults]


def analyze(env: dict[str, str], job_id: str, analyzer: str, chunk: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "cli", "analyze", job_id, "--analyzer", analyzer, "--chunk", str(chunk),
               "--json", "--timeout", "120"]  # fmt: skip
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop_everything(analysis: subprocess.Popen[str] | None, workers: list[subprocess.Popen[bytes]]) -> None:
    """The test's `vcrawl analyze` (if still running) and its workers, stopped."""
    if analysis is not None and analysis.poll() is None:
        analysis.kill()
        analysis.wait(10)
    for worker in workers:
        stop_worker(worker)


def shipped_env(server: LocalRedis, tmp_path: Path, started_log: Path) -> dict[str, str]:
    """A worker's environment at the shipped settings (the node and visibility timeouts above all: the
    recovery path), with the slow plug-in analyzer's maps logged to ``started_log``."""
    settings = Settings(redis_url=server.url, data=str(tmp_path / "data"))
    return {**cluster_env(settings), "PYTHONPATH": f"{REPO}{os.pathsep}{PLUGIN_SITE}",
            "VCRAWL_TEST_ANALYSIS_LOG": str(started_log), "VCRAWL_TEST_ANALYSIS_SLEEP_S": "0.8"}  # fmt: skip


def reports_after_the_kill(
    analysis: subprocess.Popen[str], killed_at: float, env: dict[str, str], job_id: str
) -> tuple[dict, float, dict]:
    """The interrupted run's report, the seconds from the kill to it, and an undisturbed run's report."""
    disturbed = result_of(analysis)
    finished_s = time.monotonic() - killed_at
    return disturbed, finished_s, result_of(analyze(env, job_id, "site-report", chunk=100))


def result_of(process: subprocess.Popen[str]) -> dict:
    out, err = process.communicate(timeout=180)
    assert process.returncode == 0, err
    run = json.loads(out.splitlines()[-1])
    report = json.loads(Path(run["result"]).read_text())
    return {key: report[key] for key in ("hosts", "totals", "urls")}


def test_an_analysis_worker_killed_mid_chord_loses_nothing(tmp_path: Path, fault_report: Note) -> None:
    started_log = tmp_path / "maps-started.log"
    with LocalRedis(tmp_path / "redis") as server, TestSite() as site:
        env = shipped_env(server, tmp_path, started_log)
        serve_pages(site, 30)
        workers = [start_worker(env, "crawler", tmp_path / "crawler.log")]
        analysis: subprocess.Popen[str] | None = None
        try:
            job_id = start_job(env, {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0}})
            status = wait_done(lambda: Frontier(redis.Redis.from_url(server.url)), job_id, 60)
            assert status["state"] == "completed" and status["pages_stored"] == 31, status
            stop_gracefully(workers.pop())  # ships its fetch log
            workers.append(start_worker(env, "analyst-0", tmp_path / "analyst-0.log", queues="analysis"))
            analysis = analyze(env, job_id, "slow-site-report", chunk=3)
            deadline = time.monotonic() + 60
            while len(lines(started_log)) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.1)  # inside the 0.8 s map of the chunk whose start was logged last (0.7 s spare)
            os.kill(workers[0].pid, signal.SIGKILL)
            killed_at = time.monotonic()
            workers[0].wait(10)
            interrupted = lines(started_log)[-1]
            workers.append(start_worker(env, "analyst-1", tmp_path / "analyst-1.log", queues="analysis"))
            disturbed, finished_s, undisturbed = reports_after_the_kill(analysis, killed_at, env, job_id)
        finally:
            stop_everything(analysis, workers)
    runs = Counter(lines(started_log))
    fault_report(fault="analysis worker SIGKILLed mid-chord", chunks=len(runs), interrupted_map_runs=runs[interrupted],
                 finished_s_after_kill=round(finished_s, 1))  # fmt: skip
    assert runs[interrupted] >= 2  # the killed map ran again
    assert len(runs) == 11  # the fetch log's 31 URLs, 3 per chunk
    assert disturbed == undisturbed
    assert disturbed["totals"]["pages"] == 31


def take_off_the_queue(client: redis.Redis, run_id: str) -> int | None:
    """Remove one map message of ``run_id`` still waiting on the analysis queue (as the BRPOP of a worker
    killed before it noted the message would); return its chunk, None if none waits."""
    for key in queue_lists(ANALYSIS_QUEUE):
        for payload in client.lrange(key, 0, -1):
            if found := re.search(rf'"id": "{re.escape(run_id)}\.map\.(\d+)"', payload):
                if client.lrem(key, 1, payload):
                    return int(found.group(1))
    return None


@pytest.mark.parametrize("lose_a_queued_map", [False, True], ids=["held messages", "and one lost in BRPOP"])
def test_one_of_two_analysis_workers_killed_mid_chord_delays_the_report_by_the_node_timeout_at_most(
    tmp_path: Path, fault_report: Note, lose_a_queued_map: bool
) -> None:
    """Two analysis workers at the shipped settings; one is SIGKILLed while maps run, none replaces it.
    What it held comes back when it is declared down (node timeout); a message it had taken off the
    queue without noting it (``lose_a_queued_map``) is found by the watchdog sooner."""
    started_log = tmp_path / "maps-started.log"
    with LocalRedis(tmp_path / "redis") as server, TestSite() as site:
        env = shipped_env(server, tmp_path, started_log)
        client = redis.Redis.from_url(server.url, decode_responses=True)
        serve_pages(site, 30)
        workers = [start_worker(env, "crawler", tmp_path / "crawler.log")]
        analysis: subprocess.Popen[str] | None = None
        try:
            job_id = start_job(env, {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0}})
            status = wait_done(lambda: Frontier(client), job_id, 60)
            assert status["state"] == "completed" and status["pages_stored"] == 31, status
            stop_gracefully(workers.pop())  # ships its fetch log
            for name in ("analyst-0", "analyst-1"):
                workers.append(start_worker(env, name, tmp_path / f"{name}.log", queues="analysis"))
            analysis = analyze(env, job_id, "slow-site-report", chunk=3)
            deadline = time.monotonic() + 60
            while len(lines(started_log)) < 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.1)  # inside the 0.8 s maps that began (0.7 s spare)
            os.kill(workers[0].pid, signal.SIGKILL)
            killed_at = time.monotonic()
            lost = None
            if lose_a_queued_map:
                [run] = AnalysisRuns(client).list(job_id)
                lost = take_off_the_queue(client, run["run"])
                assert lost is not None, "no map message waited on the queue"
            workers[0].wait(10)
            disturbed, finished_s, undisturbed = reports_after_the_kill(analysis, killed_at, env, job_id)
        finally:
            stop_everything(analysis, workers)
    runs = Counter(lines(started_log))
    fault_report(fault="one of two analysis workers SIGKILLed mid-chord", lost_queued_map=lost, chunks=len(runs),
                 finished_s_after_kill=round(finished_s, 1))  # fmt: skip
    assert len(runs) == 11  # the fetch log's 31 URLs, 3 per chunk: every chunk mapped
    assert disturbed == undisturbed
    assert disturbed["totals"]["pages"] == 31
    # Held messages: back at the node timeout + the hand-over grace + a watcher's look (TAKEOVER_S), then a map.
    assert finished_s < TAKEOVER_S + 5, f"report {finished_s:.1f}s after the kill"
