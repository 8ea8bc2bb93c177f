"""A frozen worker (SIGSTOP), at the shipped settings: shorter than the node timeout it keeps its
work; longer, it is taken over, and after SIGCONT the job still counts and stores each page once
(records, WARC). Real ``celery worker`` subprocesses on a private redis-server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from frontier import Frontier
from storage import Storage
from storage.records import read_records
from tests.cluster import cluster_env, identify_clients, start_worker
from tests.faults.test_faults import Note, fetches, start_job, stop_gracefully, wait_done
from tests.faults.test_orphans import NODE_TIMEOUT_S, TAKEOVER_S, member, shipped_settings, slow_pages
from tests.site import TestSite

pytestmark = [pytest.mark.slow, pytest.mark.faults]


def in_flight(worker: subprocess.Popen[bytes], sites: tuple[TestSite, ...], timeout_s: float = 60) -> None:
    """Return as soon as a request from ``worker`` reaches a site (its response takes 0.3 s more)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(seen.client == "frozen" for site in sites for seen in list(site.seen)):
            return
        time.sleep(0.005)
    raise AssertionError(f"worker {worker.pid} sent no request")


def _frozen_run(tmp_path: Path, freeze_s: float) -> dict[str, Any]:
    """A job on two download workers and an analysis worker; one download worker SIGSTOPped for
    ``freeze_s`` while it holds a fetch, then SIGCONTed; returns what happened."""
    with LocalRedis(tmp_path / "redis") as server, TestSite("127.0.0.1") as a, TestSite("127.0.0.2") as b:
        data = tmp_path / "data"
        env = cluster_env(shipped_settings(server, data))
        expected = {site.base: slow_pages(site, 60, 0.3) for site in (a, b)}
        job = {"seeds": [a.url("/"), b.url("/")], "politeness": {"min_interval_s": 0.1, "jitter": 0, "per_host": 2},
               "warc": True, "rules": [{"pattern": "", "analyzer": "fields", "fields": {"link": "a"}}]}  # fmt: skip
        client = redis.Redis.from_url(server.url)
        workers = {
            "steady": start_worker(env, "steady", tmp_path / "steady.log", queues="download,download.dynamic"),
            "frozen": start_worker(env, "frozen", tmp_path / "frozen.log", queues="download,download.dynamic"),
            "analyst": start_worker(env, "analyst", tmp_path / "analyst.log", queues="analysis"),
        }
        pids = {workers["frozen"].pid: "frozen", workers["steady"].pid: "steady"}
        for site in (a, b):  # which worker's socket sent each request
            identify_clients(site, pids)
        try:
            before = member(env, "frozen")
            job_id = start_job(env, job)
            in_flight(workers["frozen"], (a, b))  # frozen in the middle of a fetch, its message unacknowledged
            os.kill(workers["frozen"].pid, signal.SIGSTOP)
            time.sleep(freeze_s)
            # Listed while still frozen only past the node timeout: the listing takes seconds under load.
            during = member(env, "frozen") if freeze_s > NODE_TIMEOUT_S else None
            os.kill(workers["frozen"].pid, signal.SIGCONT)
            status = wait_done(lambda: Frontier(client), job_id, TAKEOVER_S + 60)
            time.sleep(3)  # the thawed worker's late work, if any, lands now
            after = member(env, "frozen")
            task_ids = Counter(line.split("Task ")[-1].split("[")[1].split("]")[0]
                               for name in workers for line in (tmp_path / f"{name}.log").read_text().splitlines()
                               if "received" in line and "Task " in line and "[" in line)  # fmt: skip
            final = Frontier(client).stats.host_stats(job_id)
            logs = {name: (tmp_path / f"{name}.log").read_text().splitlines() for name in workers}
            watchers = logs["steady"] + logs["analyst"]
            declared_down = sum("frozen@" in line and " is down (silent" in line for line in watchers)
            # Put back by the sweep (any worker, the thawed one included), or, for a message it had
            # taken off the queue but not yet noted as unacknowledged, handed back by the lost-fetch watch.
            swept = sum("no live worker holds put back" in line or "leased batch(es) was lost" in line
                        for lines in logs.values() for line in lines)  # fmt: skip
        finally:
            for process in workers.values():
                stop_gracefully(process)
    storage = Storage(str(data))
    records = list(read_records(storage, f"jobs/{job_id}/records"))
    refetched = sum(sum(fetches(site).values()) - len(fetches(site)) for site in (a, b))
    return {"status": status, "before": before, "during": during, "after": after, "records": records,
            "refetched": refetched, "expected": sum(len(paths) for paths in expected.values()),
            "task_ids": task_ids, "hosts": final, "declared_down": declared_down, "swept": swept,
            "warc_urls": _warc_response_urls(data / "jobs" / job_id / "warc")}  # fmt: skip


def _warc_response_urls(root: Path) -> Counter[str]:
    from warcio.archiveiterator import ArchiveIterator

    urls: Counter[str] = Counter()
    for path in sorted(root.rglob("*.warc.gz")):
        with path.open("rb") as stream:
            for record in ArchiveIterator(stream):
                if record.rec_type == "response":
                    urls[record.rec_headers.get_header("WARC-Target-URI")] += 1
    return urls


def test_a_worker_frozen_for_less_than_the_node_timeout_keeps_its_work(tmp_path: Path, fault_report: Note) -> None:
    run = _frozen_run(tmp_path, freeze_s=NODE_TIMEOUT_S - 10)
    twice = {task_id: n for task_id, n in run["task_ids"].items() if n > 1}
    fault_report(fault=f"download worker SIGSTOPped {NODE_TIMEOUT_S - 10:g} s", refetched=run["refetched"],
                 received_twice=len(twice))  # fmt: skip
    assert run["status"]["state"] == "completed" and run["status"]["pages_stored"] == run["expected"], run["status"]
    assert run["declared_down"] == 0 and run["after"]["state"] == "up", (run["before"], run["after"])
    assert twice == {}  # no message of the frozen worker was given to another one
    # Its fetches in flight may time out on its thawed clock and be tried again: never more than those.
    assert run["refetched"] <= 4, run["refetched"]
    assert len(run["records"]) == len({r["url"] for r in run["records"]}) == run["expected"]


def test_a_worker_frozen_past_the_node_timeout_is_taken_over_and_stores_nothing_twice(
    tmp_path: Path, fault_report: Note
) -> None:
    run = _frozen_run(tmp_path, freeze_s=NODE_TIMEOUT_S + 8)
    fault_report(fault=f"download worker SIGSTOPped {NODE_TIMEOUT_S + 8:g} s", refetched=run["refetched"],
                 taken_over=run["during"].get("taken_over"))  # fmt: skip
    assert run["during"]["state"] == "down", run["during"]
    assert run["declared_down"] == 1, run["declared_down"]  # by one watcher
    # The fetch it was in the middle of went back: at once if its last word listed it, else by the
    # sweep once it was down (its claims count no more), or by the lost-fetch watch.
    assert run["during"]["taken_over"]["restored"] + run["swept"] >= 1, (run["during"], run["swept"])
    assert run["after"]["state"] == "up", run["after"]  # thawed, it beats again: back as a member
    status = run["status"]
    assert status["state"] == "completed" and status["pages_stored"] == run["expected"], status
    assert sum(host["done"] for host in run["hosts"].values()) == run["expected"], run["hosts"]
    # The job's output holds each page once: records exported, and WARC responses.
    urls = {r["url"] for r in run["records"]}
    assert len(urls) == run["expected"]
    assert set(run["warc_urls"]) == urls and max(run["warc_urls"].values()) == 1, run["warc_urls"].most_common(3)
