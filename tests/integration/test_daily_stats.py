"""Statistics by UTC day against the session's real Redis and worker: a job's days add up to its status, its
hosts' days to the job's, the keys expire after the retention; ``vcrawl stats`` and the API serve them."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import tasks
from cli.local_redis import LocalRedis
from engine.jobs import admit_links, build_runtime, lease_ms
from frontier import BatchRelease, Frontier
from frontier.statistics import stats_day, stats_days
from tests.cluster import REPO, cluster_env
from tests.integration.conftest import api_server, run_job
from tests.integration.test_cycles import ALWAYS_DUE, page, run_cycle
from tests.site import TestSite
from vcrawl import redis_keys
from vcrawl.jobs import JobSpec
from vcrawl.settings import Settings

DAY_S = 86400
IN_CYCLES = {"new": "new", "changed": "changed", "unchanged": "unchanged", "pages_fetched": "fetched",
             "pages_stored": "stored", "bytes": "bytes"}  # fmt: skip
"""A day report's total -> the counter of a scheduled job's cycle summaries."""


def summed(report: dict[str, Any]) -> dict[str, Any]:
    """The report's days added up, in the words of ``vcrawl status --json``."""
    failed: Counter[str] = Counter()
    for day in report["days"]:
        failed.update(day["failed"])
    return {
        "pages_fetched": sum(day["pages_fetched"] for day in report["days"]),
        "pages_stored": sum(day["pages_stored"] for day in report["days"]),
        "bytes": sum(day["bytes"] for day in report["days"]),
        "failed": dict(failed),
    }


def of_status(status: dict[str, Any]) -> dict[str, Any]:
    return {key: status[key] for key in ("pages_fetched", "pages_stored", "bytes", "failed")}


def vcrawl(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], env=cluster_env(settings), cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def get_json(url: str, token: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def serve_site(site: TestSite, pages: int, body: str = "leaf") -> None:
    """``/`` links ``pages`` pages, a 404, a 410 and a page that always answers 500 (retried, then failed)."""
    links = [f"/p{n}" for n in range(pages)] + ["/missing", "/gone", "/broken"]
    site.add_page("/", "<html><body>" + "".join(f'<a href="{p}">{p}</a>' for p in links) + "</body></html>")
    for n in range(pages):
        site.add_page(f"/p{n}", f"<html><body>{body} {n}</body></html>")
    site.add_page("/gone", "gone", status=410)
    site.add_page("/broken", "oops", status=500)


@pytest.mark.usefixtures("worker")
def test_a_jobs_days_add_up_to_its_status_counters(vcrawl_settings: Settings, site: TestSite) -> None:
    serve_site(site, 12)
    status = run_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0, "jitter": 0}})
    job = status["job"]
    assert status["state"] == "completed" and status["pages_stored"] == 13
    assert set(status["failed"]) == {"http_404", "http_410", "http_500"}

    report = tasks.job_daily(job, 2)
    shown = vcrawl(vcrawl_settings, "stats", job, "--by", "day", "--days", "2", "--json")
    table = vcrawl(vcrawl_settings, "stats", job)
    unknown = vcrawl(vcrawl_settings, "stats", f"no-such-job-{uuid.uuid4().hex[:6]}", "--json")

    assert report is not None and summed(report) == of_status(status)
    assert [day["day"] for day in report["days"]] == stats_days(time.time(), 2)
    assert shown.returncode == 0, shown.stderr
    printed = json.loads(shown.stdout.strip().splitlines()[-1])
    assert printed["job"] == job and printed["by"] == "day" and summed(printed) == of_status(status)
    assert printed["totals"]["failed"] == status["failed"]
    assert table.returncode == 0 and f"job {job}, by UTC day (14 days)" in table.stdout
    assert "http_404 1" in table.stdout and "total" in table.stdout
    assert unknown.returncode == 2 and "no job" in unknown.stderr and unknown.stdout == ""

    token = secrets.token_urlsafe(24)
    with api_server(token) as url:
        code, served = get_json(f"{url}/api/jobs/{job}/daily?days=2", token)
        missing, _ = get_json(f"{url}/api/jobs/nope-{uuid.uuid4().hex[:6]}/daily", token)
    assert code == 200 and summed(served) == of_status(status) and served["total_hosts"] == 1
    assert missing == 404


@pytest.mark.usefixtures("worker")
def test_a_hosts_days_add_up_to_the_jobs_and_to_its_totals(site: TestSite) -> None:
    with TestSite("127.0.0.2") as other:
        serve_site(site, 6)
        serve_site(other, 9, body="other")
        job = {"seeds": [site.url("/"), other.url("/")], "politeness": {"min_interval_s": 0, "jitter": 0}}
        status = run_job(job)
    job_id = status["job"]
    assert status["state"] == "completed" and status["pages_stored"] == 17

    report = tasks.job_daily(job_id, 2)
    one = tasks.job_daily(job_id, 2, host=other.base.split("//", 1)[1])

    assert report is not None and one is not None and len(report["hosts"]) == 2
    for day in report["days"]:
        on_hosts = [entry for entries in report["hosts"].values() for entry in entries if entry["day"] == day["day"]]
        for key in ("pages_fetched", "pages_stored", "bytes"):
            assert sum(entry[key] for entry in on_hosts) == day[key], (day, key)
        assert sum(entry["failed"] for entry in on_hosts) == sum(day["failed"].values())
    totals = tasks.host_stats(job_id)
    for host, entries in report["hosts"].items():
        assert sum(entry["pages_fetched"] for entry in entries) == totals[host]["fetched"]
        assert sum(entry["failed"] for entry in entries) == totals[host]["failed"] == 3
    assert list(one["hosts"]) == [other.base.split("//", 1)[1]] and one["days"] == report["days"]


@pytest.mark.usefixtures("worker")
def test_a_scheduled_jobs_days_count_the_new_and_changed_pages_of_every_cycle(site: TestSite) -> None:
    site.add_versioned("/", page("/a", "/b", title="home"))
    site.add_versioned("/a", page(title="a"), validators="none")
    b = site.add_versioned("/b", page(title="b"), validators="none")
    spec = {"id": f"daily-cycles-{uuid.uuid4().hex[:6]}", "seeds": [site.url("/")], "revisit": ALWAYS_DUE,
            "politeness": {"min_interval_s": 0.0}}  # fmt: skip

    run_cycle(spec)
    b.change(page("/c", title="b, again"))
    site.add_versioned("/c", page(title="c"))
    status = run_cycle(spec)
    report = tasks.job_daily(spec["id"], 2)

    cycles = status["cycles"]
    assert [(c["new"], c["changed"]) for c in cycles] == [(3, 0), (1, 1)]
    assert report is not None
    for key, counter in IN_CYCLES.items():
        assert report["totals"][key] == sum(cycle[counter] for cycle in cycles), key


@pytest.mark.usefixtures("worker")
def test_the_day_keys_expire_after_the_configured_retention(vcrawl_settings: Settings, site: TestSite) -> None:
    serve_site(site, 2)
    status = run_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0, "jitter": 0}})
    client = redis.Redis.from_url(vcrawl_settings.frontier_url or vcrawl_settings.redis_url)  # the frontier's
    day = stats_day(time.time())
    keys = [redis_keys.job_day_stats(status["job"], day), redis_keys.job_day_host_stats(status["job"], day)]

    retention_s = vcrawl_settings.stats_retention_days * DAY_S
    assert vcrawl_settings.stats_retention_days == 90
    left_today_s = DAY_S - time.time() % DAY_S
    for key in keys:  # kept the retention from the end of their day (up to 1.5 s over: the TTL counts
        # from the whole second it was set in, and TTL rounds to the nearest second)
        assert retention_s + left_today_s - 120 <= client.ttl(key) <= retention_s + left_today_s + 2, key


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedis]:
    """A redis-server of its own: the session's worker would pump the job of the next test otherwise."""
    with LocalRedis(tmp_path_factory.mktemp("daily-redis")) as server:
        yield server


def test_a_release_and_a_reclaim_count_into_the_day_with_the_frontiers_retention(private_redis: LocalRedis) -> None:
    client = redis.Redis.from_url(private_redis.url, decode_responses=True)
    frontier = Frontier(client, day_stats_ttl_s=7 * DAY_S)
    spec = JobSpec.from_dict({"id": f"t-{uuid.uuid4().hex[:8]}", "seeds": ["http://a.test/"]})
    assert frontier.jobs.create(spec.id, spec.to_json(), time.time())
    runtime = build_runtime(spec, Settings(), session=None, client=client)
    urls = [(f"http://a.test/{n}", 0, 5) for n in range(4)]
    admit_links(runtime, frontier, urls, done=0, token="seeds", counters=Counter(), seeds=True)
    pump = {"max_batches": 1, "per_host": 1, "interval_ms": 0, "cap": 8}
    [batch] = frontier.queue.pump(spec.id, batch_size=2, lease_ms=60_000, **pump).batches
    counters = {"fetched": 2, "stored": 1, "bytes": 512, "failed:http_404": 1, "status:200": 1, "retries": 4}
    frontier.queue.release(spec.id, batch, BatchRelease(pause_ms=0, done=2, counters=counters))
    minutes = Counter[str]()  # the last two: the release's minute may just have ended
    for _, minute in frontier.stats.stats(spec.id, 2, time.time()):
        minutes.update(minute)
    assert minutes == counters  # every counter in the minute's bucket too
    [late] = frontier.queue.pump(spec.id, batch_size=2, lease_ms=1, **pump).batches
    time.sleep(0.01)
    assert len(late.entries) == 2 and frontier.queue.reclaim_expired(spec.id, 0, interval_ms=0) == (0, 2)

    day = stats_day(time.time())
    [(_, counts, hosts)] = frontier.stats.daily(spec.id, 1, time.time())
    assert counts == {"fetched": 2, "stored": 1, "bytes": 512, "failed:http_404": 1, "failed:lease_expired": 2}
    assert hosts == {"a.test": {"fetched": 2, "stored": 1, "bytes": 512, "failed": 3}}
    state = frontier.jobs.raw_state(spec.id)
    assert {name: int(state[name]) for name in counts} == counts  # the day's and the job's counters agree
    for key in (redis_keys.job_day_stats(spec.id, day), redis_keys.job_day_host_stats(spec.id, day)):
        assert 7 * DAY_S + DAY_S - time.time() % DAY_S - 60 <= client.ttl(key) <= 8 * DAY_S


def test_a_reclaim_at_the_shipped_lease_counts_into_the_day(private_redis: LocalRedis) -> None:
    """The twin of the reclaim above (a 1 ms lease) at the shipped lease length (``engine.jobs.lease_ms``,
    9 minutes for a paced batch): a lease inside it is not reclaimed; once its deadline has passed
    (written into the past here: this test does not wait 9 minutes), its URLs fail into the day."""
    client = redis.Redis.from_url(private_redis.url, decode_responses=True)
    frontier = Frontier(client, day_stats_ttl_s=7 * DAY_S)
    spec = JobSpec.from_dict({"id": f"t-{uuid.uuid4().hex[:8]}", "seeds": ["http://a.test/"]})
    assert frontier.jobs.create(spec.id, spec.to_json(), time.time())
    runtime = build_runtime(spec, Settings(), session=None, client=client)
    admit_links(runtime, frontier, [(f"http://a.test/{n}", 0, 5) for n in range(2)], done=0, token="seeds",
                counters=Counter(), seeds=True)  # fmt: skip
    shipped_ms = lease_ms(runtime)
    assert shipped_ms >= 60_000
    [batch] = frontier.queue.pump(spec.id, batch_size=2, lease_ms=shipped_ms, max_batches=1, per_host=1,
                                  interval_ms=0, cap=8).batches  # fmt: skip
    assert frontier.queue.reclaim_expired(spec.id, 0, interval_ms=0) == (0, 0)  # inside its lease
    leases = redis_keys.job_leases(spec.id)
    lease = json.loads(client.hget(leases, batch.batch_id))
    client.hset(leases, batch.batch_id, json.dumps({**lease, "t": lease["t"] - shipped_ms - 1}))  # its time is up
    assert frontier.queue.reclaim_expired(spec.id, 0, interval_ms=0) == (0, len(batch.entries))
    [(_, counts, hosts)] = frontier.stats.daily(spec.id, 1, time.time())
    assert counts == {"failed:lease_expired": len(batch.entries)}
    assert hosts == {"a.test": {"fetched": 0, "stored": 0, "bytes": 0, "failed": len(batch.entries)}}
