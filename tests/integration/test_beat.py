"""Real ``celery beat`` processes (RedBeat) firing scheduled jobs on a real worker process.

One scenario, in order, on a private Redis: a schedules file loaded into beat; pages that
change between cycles (only the changes are analysed; revisits are conditional and 304s are
not stored); a schedule added, listed and removed at run time; a second beat started by
mistake (still one firing per tick); the first beat killed (the second takes over).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from cli.local_redis import LocalRedis
from frontier import Frontier
from tests.brokers import BROKERS, broker_overrides
from tests.cluster import REPO, cluster_env, start_worker, stop_worker
from tests.site import TestSite
from tests.waiting import wait_until
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = pytest.mark.slow

EVERY_S = 2.0
LOCK_TIMEOUT_S = 6.0


def page(*links: str, title: str = "") -> str:
    anchors = "".join(f'<a href="{href}">{href}</a> ' for href in links)
    return f"<html><body><h1>{title}</h1>{anchors}</body></html>"


def job(site: TestSite, path: str = "/") -> dict[str, Any]:
    return {
        "seeds": [site.url(path)],
        "politeness": {"min_interval_s": 0.0},
        "rules": [{"pattern": "", "analyzer": "fields", "fields": {"title": "h1"}}],
        "revisit": {"initial_s": 0, "min_s": 0, "max_s": 0},
    }


@pytest.fixture(params=BROKERS)
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A private Redis, a local site, a schedules file and one worker process; Celery's messages on
    Redis or on a private RabbitMQ (beat's schedules and lock stay in Redis either way)."""
    site = TestSite()
    processes: list[subprocess.Popen[bytes]] = []
    with LocalRedis(tmp_path / "redis") as server, site, broker_overrides(request.param, tmp_path) as broker:
        site.add_versioned("/", page("/a", "/b", title="home"))
        site.add_versioned("/a", page(title="a"))
        site.add_versioned("/b", page(title="b"), validators="last-modified")
        schedules = tmp_path / "schedules.yaml"
        schedules.write_text(yaml.safe_dump({"schedules": [{"name": "news", "every": EVERY_S, "job": job(site)}]}))
        settings = Settings(
            redis_url=server.url,
            data=str(tmp_path / "data"),
            schedules_file=str(schedules),
            beat_lock_timeout_s=LOCK_TIMEOUT_S,
            **broker,
        )
        env = cluster_env(settings)
        client = redis.Redis.from_url(server.url)
        processes.append(start_worker(env, "beat-test-worker", tmp_path / "worker.log", concurrency=4))
        try:
            yield {
                "env": env,
                "site": site,
                "tmp": tmp_path,
                "frontier": Frontier(client),
                "processes": processes,
            }
        finally:
            for process in processes:
                stop_worker(process)


def start_beat(cluster: dict[str, Any], name: str) -> subprocess.Popen[bytes]:
    log = cluster["tmp"] / f"{name}.log"
    command = [sys.executable, "-m", "celery", "-A", "tasks", "beat", "-l", "INFO", "--schedule", str(log) + ".db"]
    with open(log, "ab") as out:
        process = subprocess.Popen(command, env=cluster["env"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    cluster["processes"].append(process)
    return process


def vcrawl(cluster: dict[str, Any], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "cli", *args],
        env=cluster["env"], cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def firings(frontier: Frontier, name: str) -> int:
    """Firings the worker has handled: cycles started plus firings skipped."""
    status = job_status(frontier, name)
    return 0 if status is None else status["cycle"] + status["skipped_firings"]


def sent(cluster: dict[str, Any], name: str) -> int:
    """Firings beat has sent for the schedule ``name``."""
    rows = json.loads(vcrawl(cluster, "schedule", "list", "--json"))
    return next(row["total_run_count"] for row in rows if row["name"] == name)


def completed_cycles(frontier: Frontier, name: str) -> list[dict[str, Any]]:
    status = job_status(frontier, name)
    return [] if status is None else [c for c in status["cycles"] if c["state"] == "completed"]


def test_beat_fires_cycles_only_changes_are_analysed_and_one_beat_fires(cluster: dict[str, Any]) -> None:
    frontier, site = cluster["frontier"], cluster["site"]
    beat = start_beat(cluster, "beat-1")

    # The schedules file is in the beat schedule: cycles start on their own.
    first = wait_until(lambda: completed_cycles(frontier, "news"), 30, "the first cycle completes")[0]
    assert (first["new"], first["analysed"]) == (3, 3)
    wait_until(lambda: len(completed_cycles(frontier, "news")) >= 2, 15, "a second cycle completes")

    # A page changes and links a new page: the next cycle analyses just those two.
    before = len(completed_cycles(frontier, "news"))
    site._versioned["/a"].change(page("/c", title="a, edited"))
    site.add_versioned("/c", page(title="c"))
    wait_until(lambda: len(completed_cycles(frontier, "news")) >= before + 2, 20, "two more cycles complete")
    cycles = completed_cycles(frontier, "news")
    later = cycles[1:]
    assert sum(c["changed"] for c in later) == 1 and sum(c["new"] for c in later) == 1
    for cycle in later:
        assert cycle["analysed"] == cycle["changed"] + cycle["new"], cycles
        assert cycle["stored"] == cycle["changed"] + cycle["new"], cycles  # a 304 stores nothing
    revisits_of_b = site.requests_to("/b")[1:]
    assert revisits_of_b and all("If-Modified-Since" in seen.headers for seen in revisits_of_b)
    assert all(c["not_modified"] >= 2 for c in later)  # / and /b (and /a once unchanged) answered 304

    # A schedule added at run time fires without restarting beat; list and remove work.
    other_job = cluster["tmp"] / "other.json"
    other_job.write_text(json.dumps(job(site, "/b")))
    assert "schedule other: every 2s" in vcrawl(cluster, "schedule", "add", "other", "--job", str(other_job),
                                                 "--every", "2")  # fmt: skip
    listed = json.loads(vcrawl(cluster, "schedule", "list", "--json"))
    assert sorted(row["name"] for row in listed) == ["news", "other"]
    wait_until(lambda: completed_cycles(frontier, "other"), 20, "the added schedule's first cycle completes")
    vcrawl(cluster, "schedule", "remove", "other")
    time.sleep(2 * EVERY_S)  # a firing already sent may still land
    after_removal = firings(frontier, "other")
    time.sleep(2 * EVERY_S)
    assert firings(frontier, "other") == after_removal
    assert [row["name"] for row in json.loads(vcrawl(cluster, "schedule", "list", "--json"))] == ["news"]

    # A second beat started by mistake waits on the lock: still one firing per tick. Firings
    # are counted where beat counts them (RedBeat's run count), not where workers handle them.
    second = start_beat(cluster, "beat-2")
    time.sleep(1.0)
    start, began = sent(cluster, "news"), time.monotonic()
    time.sleep(5 * EVERY_S)
    fired = sent(cluster, "news") - start
    elapsed = time.monotonic() - began
    assert 1 <= fired <= elapsed / EVERY_S + 1, (fired, elapsed)
    assert "Sending due task" not in (cluster["tmp"] / "beat-2.log").read_text()

    # The first beat dies: the second takes over once the lock times out.
    beat.kill()
    beat.wait(10)
    now = firings(frontier, "news")
    wait_until(lambda: firings(frontier, "news") > now + 1, LOCK_TIMEOUT_S + 4 * EVERY_S + 5, "beat-2 fires")
    assert "Sending due task" in (cluster["tmp"] / "beat-2.log").read_text()
    assert second.poll() is None


CRON_FIRES_IN_S = 8.0  # after beat's start: time for it to load the schedule into Redis before the boundary


@pytest.mark.parametrize("clock", ["shifted", pytest.param("real", marks=pytest.mark.long)])
def test_a_cron_schedule_fires_a_cycle_through_beat_at_its_minute(cluster: dict[str, Any], clock: str) -> None:
    """``cron: "* * * * *"`` fires at the next minute of beat's clock, sends vcrawl.start_cycle, and the
    worker runs the cycle. "shifted": beat's clock is set ahead so that minute is 8 s away
    (tests/shifted_clock_beat.py); "real": the shipped clock, waiting up to a minute (and a bit)."""
    frontier, site = cluster["frontier"], cluster["site"]
    schedules = cluster["tmp"] / "cron.yaml"
    schedules.write_text(yaml.safe_dump({"schedules": [{"name": "minutely", "cron": "* * * * *", "job": job(site)}]}))
    env = {**cluster["env"], "VCRAWL_SCHEDULES_FILE": str(schedules)}
    now = datetime.now(UTC)
    into_minute = now.second + now.microsecond / 1e6
    shift_s = (60 - CRON_FIRES_IN_S - into_minute) % 60 if clock == "shifted" else 0.0
    log = cluster["tmp"] / "cron-beat.log"
    command = [sys.executable, "-m", "tests.shifted_clock_beat", f"{shift_s:.6f}", "-l", "INFO",
               "--schedule", str(log) + ".db"]  # fmt: skip
    with open(log, "ab") as out:
        cluster["processes"].append(subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT))

    fires_within_s = CRON_FIRES_IN_S + 15 if clock == "shifted" else 60 + CRON_FIRES_IN_S + 15
    first = wait_until(lambda: completed_cycles(frontier, "minutely"), fires_within_s, "the cron cycle completes")[0]
    assert (first["new"], first["analysed"]) == (3, 3), first
    status = job_status(frontier, "minutely")
    assert status is not None and status["cycle"] == 1  # one firing: the next minute is a minute away
    started_on_beats_clock = float(first["started"]) + shift_s
    assert started_on_beats_clock % 60 < 3.0, (first["started"], shift_s)  # right after beat's clock read :00
    rows = json.loads(vcrawl(cluster, "schedule", "list", "--json"))
    assert [(row["name"], row["when"], row["total_run_count"]) for row in rows] == [("minutely", "cron * * * * *", 1)]
    assert "Sending due task minutely (vcrawl.start_cycle)" in log.read_text()
