"""An analysis message lost between kombu's BRPOP and its unacked note (a worker killed in that
moment) is found by the analysis watchdog and sent again: the job completes with every page.

Real processes at vcrawl's shipped settings (no timeout shortened): a download-only worker fetches
the seed; the test takes the seed's analysis message off the analysis queue as a killed worker
would (BRPOP, never noted as unacknowledged); an analysis worker started afterwards finds the
batch released with no analysis message anywhere and sends it again.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from celeryconfig import ANALYSIS_QUEUE, queue_lists
from cli.local_redis import LocalRedis
from frontier import Frontier
from tasks.batch_analysis import WATCH_EVERY_S
from tasks.broker.lost_analyses import FIRST_LOOK_S, analysis_task_id
from tests.cluster import cluster_env, start_worker, stop_worker
from tests.faults.test_faults import Note, serve_pages, start_job, wait_done
from tests.site import TestSite
from vcrawl import redis_keys
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = [pytest.mark.slow, pytest.mark.faults]


def test_a_lost_analysis_message_is_sent_again_and_the_job_completes(tmp_path: Path, fault_report: Note) -> None:
    with LocalRedis(tmp_path / "redis") as server, TestSite("127.0.0.1") as site:
        env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data")))
        expected = {site.url(path) for path in serve_pages(site, 6)}
        client = redis.Redis.from_url(server.url)
        downloader = start_worker(env, "downloader", tmp_path / "downloader.log", queues="download,download.dynamic")
        analyst = None
        try:
            job_id = start_job(env, {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.05, "jitter": 0}})
            lost = _take_analysis_message(client, job_id, timeout_s=30)
            status = job_status(Frontier(client), job_id)
            assert status["state"] == "running" and status["pending"] >= 1  # the lost batch's page, at least

            taken_at = time.monotonic()
            analyst = start_worker(env, "analyst", tmp_path / "analyst.log", queues=ANALYSIS_QUEUE)
            status = wait_done(lambda: Frontier(client), job_id, FIRST_LOOK_S + 2 * WATCH_EVERY_S + 60)
            completed_s = time.monotonic() - taken_at
        finally:
            for worker in (downloader, analyst):
                if worker is not None:
                    stop_worker(worker)
        assert status["state"] == "completed", status
        assert (status["pages_stored"], status["analysed"], status["pending"]) == (len(expected), len(expected), 0)
        assert site.requests_to("/") and all(len(site.requests_to(f"/p{n}")) == 1 for n in range(6))
        log = "".join((tmp_path / name).read_text() for name in ("downloader.log", "analyst.log"))  # either looked
        assert f"job {job_id}: the analysis message of batch {lost} was lost; sent again" in log
    fault_report(fault="analysis message lost between BRPOP and unacked (shipped settings)",
                 completed_s_after_loss=round(completed_s, 1))  # fmt: skip


def _take_analysis_message(client: redis.Redis, job_id: str, timeout_s: float) -> str:
    """BRPOP the analysis message of the seed's page as a worker killed right after would: gone,
    never unacknowledged. Return the batch's id. (Analysis messages of batches that stored nothing,
    such as robots.txt's, go back where they were.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        taken = client.brpop(queue_lists(ANALYSIS_QUEUE), timeout=1)
        if taken is None:
            continue
        key, payload = taken
        for batch_id in map(bytes.decode, client.hkeys(redis_keys.job_released(job_id))):
            if f'"id": "{analysis_task_id(job_id, batch_id)}"'.encode() in payload:
                return batch_id
        client.lpush(key, payload)  # to the back of the line, where kombu publishes
        time.sleep(0.05)
    raise AssertionError(f"no analysis message of a stored page of job {job_id} within {timeout_s}s")
