"""No message stays unacknowledged without a live worker behind it, at the shipped settings.

Real ``celery worker`` subprocesses on a private redis-server, nothing about visibility set (an
hour, as users run it). A worker SIGKILLed while it holds messages is declared down after the node
timeout (30 s) and its messages go back at once. A frozen worker: tests/faults/test_frozen.py.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from frontier import Frontier
from storage import Storage
from storage.records import read_records
from tests.cluster import REPO, cluster_env, ring_listing, start_worker, stop_worker
from tests.conftest import PLUGIN_SITE
from tests.faults.test_faults import Note, fetches, page, serve_pages, start_job, stop_gracefully, wait_done
from tests.site import Response, TestSite
from tests.waiting import wait_until
from vcrawl import redis_keys
from vcrawl.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.faults]

NODE_TIMEOUT_S = Settings().node_timeout_s  # shipped: 30 s
# Declared down after the timeout and the hand-over grace; then the job needs a few seconds more.
TAKEOVER_S = NODE_TIMEOUT_S + 2 + 25


def shipped_settings(server: LocalRedis, data: Path) -> Settings:
    settings = Settings(redis_url=server.url, data=str(data))
    assert settings.visibility_timeout_s == 3600  # what users run
    return settings


def unacked(client: redis.Redis) -> dict[str, str]:
    """Delivery tag -> queue of every unacknowledged message."""
    return {tag.decode(): json.loads(raw)[-1] for tag, raw in client.hgetall("unacked").items()}


def drained(client: redis.Redis, within_s: float = 10.0) -> dict[str, str]:
    """What is still unacknowledged once live workers had ``within_s`` to acknowledge what they hold.

    The job completes inside its last analysis task, before that task's message is acknowledged
    (acks_late), so a read at the moment of completion can still see it. Read it after the dead
    worker is declared down (``declared_down``): until then its messages are rightly its own.
    """
    deadline = time.monotonic() + within_s
    while (left := unacked(client)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def described(client: redis.Redis, left: dict[str, str], logs: list[Path]) -> str:
    """What a failing test prints about messages left unacknowledged: each one's task, its delivery
    time, who says it holds it, and the worker log lines that name its task id."""
    if not left:
        return ""
    holders = {name.decode(): set(json.loads(raw)["tags"]) for name, raw in client.hgetall(redis_keys.HOLDERS).items()}
    delivered = {tag.decode(): at for tag, at in client.zrange("unacked_index", 0, -1, withscores=True)}
    lines = [f"now {time.time():.3f}"]
    for tag, queue in left.items():
        raw = client.hget("unacked", tag)
        headers = json.loads(raw)[0].get("headers", {}) if raw else {}
        task_id = headers.get("id", "?")
        held = [name for name, tags in holders.items() if tag in tags]
        lines.append(f"{tag} on {queue}: {headers.get('task')} {task_id} argsrepr={headers.get('argsrepr')} "
                     f"delivered {delivered.get(tag)} held by {held}")  # fmt: skip
        for log in (log for log in logs if log.exists()):
            text = log.read_text(errors="replace").splitlines()
            lines += [f"  {log.name}: {line}" for line in text if task_id in line]
    return "\n".join(lines)


def swept_back(log: Path, queue: str) -> list[str]:
    """The sweep's lines in a worker log that put unacknowledged messages back on ``queue``."""
    return [line for line in log.read_text(errors="replace").splitlines()
            if "no live worker holds put back on" in line and queue in line]  # fmt: skip


def held_by(client: redis.Redis, worker: str) -> set[str]:
    """What worker ``worker`` (its name before the ``@``) said it holds."""
    for name, raw in client.hgetall(redis_keys.HOLDERS).items():
        if name.decode().startswith(f"{worker}@"):
            return set(json.loads(raw)["tags"])
    return set()


def slow_pages(site: TestSite, count: int, delay_s: float) -> list[str]:
    """``serve_pages``, each page answering after ``delay_s``: fetches are in flight when a worker dies."""
    paths = serve_pages(site, count)
    for path in paths[1:]:
        site.add_response(path, Response(page("/").encode(), delay_s=delay_s, headers={"Content-Type": "text/html"}))
    return paths


def wait_holding(client: redis.Redis, worker: str, queue: str, timeout_s: float = 60) -> set[str]:
    """Wait until ``worker`` says it holds a message of ``queue`` that is unacknowledged; return them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pending = unacked(client)
        mine = {tag for tag in held_by(client, worker) if pending.get(tag) == queue}
        if mine:
            return mine
        time.sleep(0.05)
    raise AssertionError(f"{worker} never held a message of {queue}: {unacked(client)}")


def member(env: dict[str, str], name: str) -> dict[str, Any]:
    return next(row for row in ring_listing(env)["nodes"] if row["name"].startswith(f"{name}@"))


def declared_down(env: dict[str, str], name: str) -> dict[str, Any]:
    """Wait until worker ``name`` is declared down; return its row.

    A job can complete before that: a worker killed after it released its batch, before it sent
    the analysis, has that analysis sent again by the watchdog 10 s later (tasks/broker/lost_analyses.py),
    while the fetch message it held waits for the declaration (seen once in CI).
    """
    return wait_until(lambda: (row := member(env, name))["state"] == "down" and row, TAKEOVER_S,
                      f"{name} declared down", poll_s=1.0)  # fmt: skip


def test_a_killed_analysis_worker_s_messages_go_back_when_it_is_declared_down(
    tmp_path: Path, fault_report: Note
) -> None:
    with LocalRedis(tmp_path / "redis") as server, TestSite() as site:
        data = tmp_path / "data"
        env = {**cluster_env(shipped_settings(server, data)), "PYTHONPATH": f"{REPO}{os.pathsep}{PLUGIN_SITE}",
               "VCRAWL_TEST_ANALYSIS_SLEEP_S": "0.3"}  # fmt: skip
        paths = serve_pages(site, 40)
        job = {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.01, "jitter": 0},
               "rules": [{"pattern": "", "analyzer": "slow_words"}]}  # fmt: skip
        client = redis.Redis.from_url(server.url)
        fetcher = start_worker(env, "fetcher", tmp_path / "fetcher.log", queues="download,download.dynamic")
        analysts = [start_worker(env, "analyst-0", tmp_path / "analyst-0.log", queues="analysis")]
        try:
            job_id = start_job(env, job)
            held = wait_holding(client, "analyst-0", "analysis")
            os.kill(analysts[0].pid, signal.SIGKILL)
            killed_at = time.monotonic()
            analysts[0].wait(10)
            analysts.append(start_worker(env, "analyst-1", tmp_path / "analyst-1.log", queues="analysis"))
            status = wait_done(lambda: Frontier(client), job_id, TAKEOVER_S + 30)
            completed_s = time.monotonic() - killed_at
            dead = declared_down(env, "analyst-0")
            left = drained(client)
            logs = [tmp_path / f"{name}.log" for name in ("fetcher", "analyst-0", "analyst-1")]
            detail = described(client, left, logs)
        finally:
            stop_worker(fetcher)
            for analyst in analysts:
                stop_gracefully(analyst)
    records = list(read_records(Storage(str(data)), f"jobs/{job_id}/records"))
    fault_report(fault="analysis worker SIGKILLed holding messages (shipped settings)", held=len(held),
                 completed_s_after_kill=round(completed_s, 1), taken_over=dead.get("taken_over"))  # fmt: skip
    assert status["state"] == "completed" and status["pages_stored"] == len(paths), status
    assert completed_s < TAKEOVER_S, completed_s  # not the visibility timeout (an hour)
    assert left == {}, detail  # nothing unacknowledged without a worker
    assert dead["state"] == "down" and dead["taken_over"]["restored"] >= 1, dead
    assert {r["url"] for r in records} == {site.url(path) for path in paths}


def test_a_killed_download_worker_s_fetches_go_back_when_it_is_declared_down(
    tmp_path: Path, fault_report: Note
) -> None:
    with LocalRedis(tmp_path / "redis") as server, TestSite("127.0.0.1") as a, TestSite("127.0.0.2") as b:
        env = cluster_env(shipped_settings(server, tmp_path / "data"))
        expected = {site.base: slow_pages(site, 40, 0.4) for site in (a, b)}
        job = {"seeds": [a.url("/"), b.url("/")], "politeness": {"min_interval_s": 0.05, "jitter": 0, "per_host": 2}}
        client = redis.Redis.from_url(server.url)
        steady = start_worker(env, "steady", tmp_path / "steady.log")
        victim = start_worker(env, "victim", tmp_path / "victim.log", queues="download,download.dynamic")
        try:
            job_id = start_job(env, job)
            held = wait_holding(client, "victim", "download")
            os.kill(victim.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            victim.wait(10)
            status = wait_done(lambda: Frontier(client), job_id, TAKEOVER_S + 30)
            completed_s = time.monotonic() - killed_at
            declared_down(env, "victim")
            left = drained(client)
            detail = described(client, left, [tmp_path / "steady.log", tmp_path / "victim.log"])
        finally:
            stop_worker(victim)
            stop_gracefully(steady)
    fault_report(fault="download worker SIGKILLed holding fetches (shipped settings)", held=len(held),
                 completed_s_after_kill=round(completed_s, 1))  # fmt: skip
    assert status["state"] == "completed" and status["pages_stored"] == 82 and status["failed"] == {}, status
    assert completed_s < TAKEOVER_S, completed_s
    assert left == {}, detail
    # Only the steady worker took analysis messages, and it stayed alive: none was an orphan.
    assert swept_back(tmp_path / "steady.log", "analysis") == []
    for site in (a, b):
        assert set(fetches(site)) == set(expected[site.base])
