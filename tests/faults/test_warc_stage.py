"""A worker stopped past the node timeout mid-batch, then resumed, archives none of that batch twice.

Real processes: a redis-server of its own, two ring nodes (``celery -A tasks worker`` with
``VCRAWL_NODE_WEIGHT``, node timeout 3 s) and a loopback site whose page ``/slow`` answers after
6 s. The node fetching ``/slow`` is SIGSTOPped as the request arrives; the other node declares it
down, takes its batch over and fetches ``/slow`` again; then the stopped node gets SIGCONT, ends
its batch and finds its lease gone. The job's WARC files must hold one response per page, its
records one record per page.

The node timeout is shortened so the takeover comes in seconds; the same promise at the shipped
30 s (a plain worker frozen 38 s, one WARC response and one record per page after SIGCONT) is
``tests/faults/test_frozen.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from warcio.archiveiterator import ArchiveIterator

from cli.local_redis import LocalRedis
from cluster.outputs import OutputLedger
from frontier import Frontier
from storage import Storage
from tests.cluster import cluster_env, identify_clients, start_job, start_worker, stop_worker
from tests.site import NOT_PAGES, Response, TestSite, link_page
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = [pytest.mark.slow, pytest.mark.faults]

WARCIO = str(Path(sys.executable).with_name("warcio"))
NODE_TIMEOUT_S = 3.0
SLOW_S = 6.0  # longer than the node timeout plus the watcher's look: the batch is taken over meanwhile


def wait_for(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def test_a_batch_taken_over_from_a_stopped_worker_is_archived_once(tmp_path: Path) -> None:
    nodes: dict[int, str] = {}
    with LocalRedis(tmp_path / "redis") as server, TestSite("127.0.6.1") as site:
        paths = [f"/p{n}" for n in range(6)]
        site.add_page("/", link_page(*paths[:3], "/slow", *paths[3:]))
        for path in paths:
            site.add_page(path, link_page("/"))
        site.add_response("/slow", Response(b"<html><body>slow</body></html>", delay_s=SLOW_S))
        identify_clients(site, nodes)
        settings = Settings(redis_url=server.url, data=str(tmp_path / "data"), node_timeout_s=NODE_TIMEOUT_S)
        env = cluster_env(settings)
        workers = {}
        for name in ("a", "b"):
            process = start_worker({**env, "VCRAWL_NODE_WEIGHT": "100"}, name, tmp_path / f"{name}.log", concurrency=4)
            workers[name], nodes[process.pid] = process, name
        stopped: subprocess.Popen[bytes] | None = None
        try:
            rules = [{"pattern": "", "analyzer": "fields", "fields": {"title": "title"}}]
            job = {"seeds": [site.url("/")], "warc": True, "rules": rules, "politeness": {"min_interval_s": 0.05}}
            job_id = start_job(env, job)
            first = wait_for(lambda: site.requests_to("/slow"), 30, "/slow requested")[0]
            stopped = workers[first.client]
            os.kill(stopped.pid, signal.SIGSTOP)
            wait_for(lambda: len(site.requests_to("/slow")) >= 2, 30, "/slow requested again by the other node")
            os.kill(stopped.pid, signal.SIGCONT)
            client = redis.Redis.from_url(server.url)
            frontier, ledger = Frontier(client), OutputLedger(client, NODE_TIMEOUT_S)
            store = Storage.from_settings(settings)

            def finished() -> dict[str, Any] | None:
                status = job_status(frontier, job_id, store, ledger)
                done = status is not None and status["state"] != "running" and status["outputs_pending"] == 0
                return status if done else None

            status = wait_for(finished, 90, "the job completed and its output shipped")
        finally:
            if stopped is not None:
                os.kill(stopped.pid, signal.SIGCONT)
            for process in workers.values():
                stop_worker(process)
        fetched = Counter(seen.path for seen in site.seen if seen.path not in NOT_PAGES)

    warcs = sorted((tmp_path / "data/jobs" / job_id / "warc").glob("*.warc.gz"))
    responses: Counter[str] = Counter()
    for path in warcs:
        assert subprocess.run([WARCIO, "check", str(path)], capture_output=True, timeout=60).returncode == 0, path
        with open(path, "rb") as stream:
            responses.update(
                record.rec_headers.get_header("WARC-Target-URI")
                for record in ArchiveIterator(stream)
                if record.rec_type == "response"
            )
    assert status["state"] == "completed" and status["pages_stored"] == len(paths) + 2, status
    assert fetched["/slow"] == 2, fetched  # the batch really ran twice
    assert responses == Counter({site.url(path): 1 for path in ["/", "/slow", *paths]}), responses
    parts = (tmp_path / "data/jobs" / job_id / "records").glob("*.jsonl")
    records = Counter(json.loads(line)["url"] for part in parts for line in part.read_text().splitlines())
    assert records == Counter({site.url(path): 1 for path in ["/", "/slow", *paths]}), records
