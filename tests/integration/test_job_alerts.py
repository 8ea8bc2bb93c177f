"""Alerts on jobs failing wholesale, de-duplicated per cause, to a real SMTP server and webhook."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

import tasks
from cli.local_redis import LocalRedis
from engine.jobs import lease_s, start
from engine.pump import FrontierPump
from engine.runtime_cache import RuntimeCache
from frontier import Frontier
from telemetry.alerts import Alert
from tests.integration.conftest import AlertSinks
from tests.site import Response, TestSite
from vcrawl import redis_keys
from vcrawl.settings import Settings

pytestmark = pytest.mark.usefixtures("worker")


def page(*links: str) -> str:
    return "<html><body>" + "".join(f'<a href="{href}">{href}</a>' for href in links) + "</body></html>"


def run(job: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    job_id = tasks.start_job(job)
    deadline = time.monotonic() + timeout_s
    while (status := tasks.job_status(job_id))["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    return status


def alerts_about(sinks: AlertSinks, words: str, timeout_s: float = 5.0) -> tuple[list[dict[str, Any]], list[Any]]:
    """Webhook posts and emails whose subject contains ``words`` (waits briefly for late ones)."""
    return sinks.received(
        lambda hook: words in hook["subject"],
        lambda mail: words in " ".join(str(mail["Subject"]).split()),  # long subjects fold
        timeout_s,
    )


def test_a_host_whose_urls_mostly_fail_raises_one_alert(site: TestSite, alert_sinks: AlertSinks) -> None:
    broken = [f"/broken/{n}" for n in range(30)]
    site.add_page("/", page(*broken))
    for path in broken:
        site.add_response(path, Response(b"down", 500))
    status = run({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0}, "limits": {"retries": 0}})
    assert status["failed"] == {"http_500": 30}

    host = site.base.split("//")[1]
    hooks, mails = alerts_about(alert_sinks, f"host {host} failing in job {status['job']}")
    assert len(hooks) == 1 and len(mails) == 1  # 30 failures, one alert per channel
    assert hooks[0]["details"]["failed"] >= 20 and set(hooks[0]["details"]["reasons"]) == {"http_500"}


def test_a_host_with_a_few_failures_raises_none(site: TestSite, alert_sinks: AlertSinks) -> None:
    good, bad = [f"/ok/{n}" for n in range(25)], [f"/bad/{n}" for n in range(5)]
    site.add_page("/", page(*good, *bad))
    for path in good:
        site.add_page(path, page())
    for path in bad:
        site.add_response(path, Response(b"down", 500))
    status = run({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0}, "limits": {"retries": 0}})
    assert status["failed"] == {"http_500": 5} and status["pages_stored"] == 26
    hooks, mails = alerts_about(alert_sinks, f"failing in job {status['job']}", timeout_s=1.0)
    assert hooks == [] and mails == []


def test_an_unreachable_robots_txt_raises_one_alert(site: TestSite, alert_sinks: AlertSinks) -> None:
    site.add_response("/robots.txt", Response(b"overloaded", 503))
    site.add_page("/", page())
    status = run({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0}, "limits": {"retries": 2}})
    assert status["robots_blocked"] == 1 and status["robots_fetched"] >= 2  # read again after each error

    hooks, mails = alerts_about(alert_sinks, f"robots.txt of {site.base} unreachable in job {status['job']}")
    assert len(hooks) == 1 and len(mails) == 1
    assert hooks[0]["details"]["status"] == 503


def test_a_job_without_progress_is_reported_stuck_once(tmp_path: Path, vcrawl_settings: Settings) -> None:
    # A job on a private Redis with no worker: the pump leases its seed, nobody fetches it.
    sent: list[tuple[str, Alert]] = []
    with LocalRedis(tmp_path / "redis") as server, TestSite() as site:
        client = redis.Redis.from_url(server.url)
        frontier = Frontier(client)
        settings = replace(vcrawl_settings, redis_url=server.url, alert_stuck_s=1.0)
        runtimes = RuntimeCache(frontier, settings, tasks.deps.session(), client)
        job = tasks.JobSpec.from_dict({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0}})
        job_id = start(job, frontier, runtimes, tasks.deps.fetchers())
        gate: set[str] = set()

        def alert(cause: str, message: Alert) -> None:
            if cause not in gate:  # what deps.alert does with Redis: once per cause and window
                gate.add(cause)
                sent.append((cause, message))

        clock = [time.time()]
        pump = FrontierPump(frontier, runtimes, lambda *_: None, settings, clock=lambda: clock[0], alert=alert)
        pump.pump_once()
        assert sent == []
        for step in (6.0, 12.0):  # the stuck check runs with lease reclaim, every 5 s of pump time
            clock[0] += step
            pump.pump_once()
    assert [cause for cause, _ in sent] == [f"{job_id}:stuck"]
    assert sent[0][1].details["job"] == job_id and sent[0][1].details["stalled_s"] >= 1


def test_a_batch_whose_message_is_lost_comes_back_after_one_lease(tmp_path: Path, vcrawl_settings: Settings) -> None:
    # The pump leases a batch and its message never arrives (Redis lost it, or the pump died before
    # sending it): the lease, not an operator, must bring the URLs back, within lease_s.
    with LocalRedis(tmp_path / "redis") as server, TestSite() as site:
        client = redis.Redis.from_url(server.url)
        frontier = Frontier(client)
        settings = replace(vcrawl_settings, redis_url=server.url)
        runtimes = RuntimeCache(frontier, settings, tasks.deps.session(), client)
        job = tasks.JobSpec.from_dict({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0}})
        job_id = start(job, frontier, runtimes, tasks.deps.fetchers())
        lost: list[Any] = []
        FrontierPump(frontier, runtimes, lambda _job, batches, _producer: lost.extend(batches), settings).pump_once()
        seconds, micros = client.time()
        leases = client.hgetall(redis_keys.job_leases(job_id))
    assert len(lost) == 1 and len(leases) == 1
    expires_in_s = json.loads(next(iter(leases.values())))["t"] / 1000 - (seconds + micros / 1e6)
    assert expires_in_s == pytest.approx(lease_s(runtimes.get(job_id, 0)), abs=2.0)
