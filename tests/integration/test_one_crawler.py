"""One crawler: a single ``crawl.delay`` task and a crawl job share the fetch and analysis steps, so they
obey robots.txt, pace a host and retry a failing analyzer the same way (real worker, real sites, SMTP)."""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

import tasks
from cli.local_redis import LocalRedis
from engine import single
from engine.outcomes import Failed
from engine.single import SingleEnv
from frontier import HostGate
from tasks import deps
from tests.cluster import REPO, cluster_env, start_worker, stop_worker
from tests.conftest import PLUGIN_SITE
from tests.integration.conftest import AlertSinks, forget_origin, run_job, wait_for_end
from tests.site import TestSite
from vcrawl.policies import PolitenessPolicy
from vcrawl.settings import Settings

pytestmark = pytest.mark.usefixtures("worker")

ROBOTS = "User-agent: *\nDisallow: /private/\nCrawl-delay: 1\n"


def _gaps(site: TestSite, paths: set[str]) -> list[float]:
    times = sorted(seen.at for seen in site.seen if seen.path in paths)
    return [round(b - a, 3) for a, b in itertools.pairwise(times)]


def test_a_single_task_to_a_url_robots_txt_disallows_ends_robots_blocked(site: TestSite) -> None:
    site.add_page("/robots.txt", ROBOTS, Content_Type="text/plain")
    url = site.add_page("/private/secret.html", "<html><body>secret</body></html>")

    record = wait_for_end(tasks.crawl.delay({"url": url}).id)

    assert record["state"] == "robots_blocked", record
    assert record["reason"] == "robots_blocked" and "robots.txt disallows" in record["error"]
    assert site.requests_to("/robots.txt") and not site.requests_to("/private/secret.html")
    assert record["attempts"] == 1  # the robots.txt read was not an attempt


def test_two_single_tasks_to_one_host_keep_its_crawl_delay_as_a_job_does(site: TestSite) -> None:
    site.add_page("/robots.txt", ROBOTS, Content_Type="text/plain")
    one = site.add_page("/one.html", "<html><body>one</body></html>")
    two = site.add_page("/two.html", "<html><body>two</body></html>")

    records = [wait_for_end(tasks.crawl.delay({"url": url}).id) for url in (one, two)]

    assert [record["state"] for record in records] == ["analyzed", "analyzed"], records
    single_gaps = _gaps(site, {"/robots.txt", "/one.html", "/two.html"})
    assert len(single_gaps) == 2 and min(single_gaps) >= 1.0, single_gaps  # robots.txt counts as a request

    # The same host's pages in a job (politeness off but for the Crawl-delay): the same pause.
    site.seen.clear()
    site.add_page("/", '<html><body><a href="/one.html">1</a> <a href="/two.html">2</a></body></html>')
    status = run_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0}})
    assert status["state"] == "completed" and status["pages_stored"] == 3, status
    job_gaps = _gaps(site, {"/", "/one.html", "/two.html"})
    assert len(job_gaps) == 2 and min(job_gaps) >= 1.0, job_gaps


def _analyzer_alerts(sinks: AlertSinks, analyzer: str, job_id: str) -> tuple[list[Any], list[Any]]:
    time.sleep(1.0)  # a second alert would have arrived by now
    subject = f"analyzer {analyzer} failing in job {job_id}"
    hooks = [hook for hook in sinks.webhooks if subject in hook["subject"]]
    mails = [mail for mail in sinks.emails if subject in " ".join(str(mail["Subject"]).split())]
    return hooks, mails


def test_a_job_analyzer_that_fails_twice_is_retried_and_succeeds(site: TestSite, alert_sinks: AlertSinks) -> None:
    import vcrawl_test_plugin

    url = site.add_page("/", "<html><body><p>flaky</p></body></html>")

    status = run_job({"seeds": [url], "rules": [{"pattern": ".", "analyzer": "fails_twice"}]})

    assert status["state"] == "completed", status
    assert status["records"] == 1 and status["analysis_failed"] == {} and status["analysed"] == 1, status
    assert vcrawl_test_plugin.FLAKY_CALLS[url] == 3  # two failures, then the retry that worked
    hooks, mails = _analyzer_alerts(alert_sinks, "fails_twice", status["job"])
    assert not hooks and not mails


def test_a_job_analyzer_that_always_fails_is_retried_three_times_and_alerts_once(
    site: TestSite, alert_sinks: AlertSinks
) -> None:
    import vcrawl_test_plugin

    url = site.add_page("/", '<html><body><a href="/next.html">next</a></body></html>')
    site.add_page("/next.html", "<html><body>next</body></html>")
    calls_before = len(vcrawl_test_plugin.CALLS)

    status = run_job({"seeds": [url], "max_depth": 1, "rules": [{"pattern": "/$", "analyzer": "always_fails"}]})

    assert status["state"] == "completed", status
    assert status["analysis_failed"] == {"error": 1} and status["records"] == 0, status
    assert status["pages_stored"] == 2  # the failing page's links were still followed
    calls = [called for called in vcrawl_test_plugin.CALLS[calls_before:] if called == url]
    assert len(calls) == 4  # the first attempt and 3 retries
    hooks, mails = _analyzer_alerts(alert_sinks, "always_fails", status["job"])
    assert len(hooks) == 1 and len(mails) == 1, (hooks, mails)
    assert hooks[0]["details"]["attempts"] == 4 and "analyzer bug" in hooks[0]["details"]["error"]


def test_a_failing_analyzer_in_batches_analysed_together_is_retried_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundle sends the analyses of batches released together as one task (engine.fetch_bundle);
    a batch whose analyzer fails leaves it and is retried on its own, the others admitted at once."""
    import vcrawl_test_plugin

    from engine import analyze_batch

    gathered: list[tuple[int, int]] = []  # (batches, of which retried alone), per gathered analysis
    real = analyze_batch.run_analyze_batches

    def spy(env: Any, batches: Any, retry: Any = None) -> Any:
        outcome = real(env, batches, retry)
        gathered.append((len(batches), len(outcome.retries)))
        return outcome

    monkeypatch.setattr(analyze_batch, "run_analyze_batches", spy)
    sites = [TestSite(host).__enter__() for host in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")]
    try:
        urls = [site.add_page("/", "<html><body><p>flaky</p></body></html>") for site in sites]
        for site in sites:
            forget_origin(site.base)
        status = run_job({"seeds": urls, "politeness": {"min_interval_s": 0.2, "jitter": 0},
                          "rules": [{"pattern": ".", "analyzer": "fails_twice"}]}, timeout_s=60)  # fmt: skip
    finally:
        for site in sites:
            site.__exit__(None, None, None)
    assert status["state"] == "completed", status
    assert status["records"] == 4 and status["analysis_failed"] == {} and status["analysed"] == 4, status
    assert all(vcrawl_test_plugin.FLAKY_CALLS[url] == 3 for url in urls)  # two failures, then the retry
    assert any(batches > 1 and retried == batches for batches, retried in gathered), gathered


@pytest.mark.slow
def test_with_the_shipped_defaults_batches_analysed_together_retry_a_failing_analyzer_alone(tmp_path: Path) -> None:
    # The twin of the test above at the defaults users run (the session worker's backoff is 0.05 s):
    # a plain `celery worker` (its shipped pool), the job sent by `vcrawl submit`.
    hosts = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    with LocalRedis(tmp_path / "redis") as server:
        sites = [TestSite(host).__enter__() for host in hosts]
        try:
            urls = [site.add_page("/", "<html><body><p>always fails</p></body></html>") for site in sites]
            env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data")))
            env["PYTHONPATH"] = os.pathsep.join((str(REPO), str(PLUGIN_SITE)))  # the analyzer plugin's entry point
            job = tmp_path / "job.json"
            job.write_text(json.dumps({"seeds": urls, "max_depth": 0, "politeness": {"min_interval_s": 0.2},
                                       "rules": [{"pattern": ".", "analyzer": "always_fails"}]}))  # fmt: skip
            worker = start_worker(env, "defaults", tmp_path / "worker.log", loglevel="INFO")
            try:
                done = subprocess.run([sys.executable, "-m", "cli", "submit", str(job), "--wait", "--json"], env=env,
                                      cwd=REPO, capture_output=True, text=True, timeout=150)  # fmt: skip
            finally:
                stop_worker(worker)
        finally:
            for site in sites:
                site.__exit__(None, None, None)
        log = (tmp_path / "worker.log").read_text()

    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["state"] == "completed" and summary["analysis_failed"] == {"error": 3}, summary
    assert "Task vcrawl.analyze_batches[" in log, "no batches analysed together"
    # each batch left its group and was retried alone, 3 times at the shipped backoff, then given up
    assert all(log.count(f"failed (attempt {n}), retrying") == 3 for n in (1, 2, 3)), log
    assert "(attempt 4), retrying" not in log, log
    assert log.count("ALERT analyzer always_fails failing") == 1, log


def test_a_single_task_to_a_refused_origin_fails_at_once_under_a_pacing_gate(
    vcrawl_settings: Settings, redis_server: LocalRedis
) -> None:
    # The cluster's interval is on (the default path): the gate must not hold a URL the network
    # policy refuses, as it would when robots.txt cannot be read and nothing is cached.
    with TestSite("127.0.0.2") as refused:
        forget_origin(refused.base)
        url = refused.add_page("/page.html", "<p>never</p>")
        cluster = deps.single_context()
        ctx = replace(cluster, policy=replace(cluster.policy, networks=(ipaddress.ip_network("127.0.0.1/32"),)))
        pacing = PolitenessPolicy(1.0, 0.0)
        env = SingleEnv(ctx, HostGate(redis.Redis.from_url(redis_server.url), pacing), deps.trail(), pacing)
        task = single.validate({"url": url}, deps.fetchers(), deps.storage())

        outcome = single.run_single_fetch(env, task, f"refused-{time.time()}", None)

    assert isinstance(outcome, Failed) and outcome.reason == "blocked_address", outcome
    assert not refused.seen  # no connection: not for robots.txt, not for the page


@pytest.mark.slow
def test_with_the_shipped_backoff_a_failing_job_analyzer_is_retried_three_times_then_alerts_once(
    tmp_path: Path,
) -> None:
    # The twin of the test above at the defaults users run (the session worker's backoff is 0.05 s):
    # a plain `celery worker` with only its Redis and data root set, the job sent by `vcrawl submit`.
    with LocalRedis(tmp_path / "redis") as server, TestSite() as site:
        site.add_page("/", "<html><body><p>always fails</p></body></html>")
        env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data")))
        env["PYTHONPATH"] = os.pathsep.join((str(REPO), str(PLUGIN_SITE)))  # the analyzer plugin's entry point
        job = tmp_path / "job.json"
        job.write_text(json.dumps({"seeds": [site.url("/")], "max_depth": 0,
                                   "rules": [{"pattern": ".", "analyzer": "always_fails"}]}))  # fmt: skip
        worker = start_worker(env, "defaults", tmp_path / "worker.log", loglevel="WARNING")
        try:
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "cli", "submit", str(job), "--wait", "--json"], env=env,
                                  cwd=REPO, capture_output=True, text=True, timeout=150)  # fmt: skip
            took_s = time.monotonic() - started
        finally:
            stop_worker(worker)
        log = (tmp_path / "worker.log").read_text()

    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["state"] == "completed" and summary["analysis_failed"] == {"error": 1} and summary["records"] == 0
    assert all(f"(attempt {n}), retrying" in log for n in (1, 2, 3)) and "(attempt 4), retrying" not in log, log
    assert log.count("ALERT analyzer always_fails failing") == 1, log
    assert took_s >= 3.5  # the shipped backoff waited 1, 2 and 4 s (each at least half that, with jitter)
