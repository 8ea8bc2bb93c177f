"""Batch analysis on a real Spark (``vcrawl analyze --engine spark``): the same reports as the chord path.

Real processes: the session's Redis and worker crawl a two-host site (WARC on) and run the chord;
``vcrawl analyze --engine spark`` runs as a subprocess, its driver starting Spark's JVM with local
executors (pyspark, Java 17); one test also starts a standalone master and worker on loopback
(``spark-class``, tests/spark.py) and submits to it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import tasks
from cli.local_redis import LocalRedis
from tests.cluster import cluster_env, start_worker, stop_worker
from tests.conftest import PLUGIN_SITE
from tests.integration.test_batch_analysis import build_sites, crawl, vcrawl
from tests.integration.test_job_outputs import build_site, job_file, submit_and_wait
from tests.site import TestSite
from tests.spark import SPARK_MISSING, StandaloneSpark
from tests.webhdfs_server import WebHdfsTestServer
from vcrawl.settings import Settings

pytestmark = [pytest.mark.usefixtures("worker", "spark_installed"), pytest.mark.spark]

VOLATILE = ("run", "generated_at")


@pytest.fixture
def spark_installed() -> None:
    """`make setup` installs PySpark and Java: a suite that skipped for want of them would prove nothing."""
    if SPARK_MISSING:
        pytest.fail(SPARK_MISSING)


@pytest.fixture
def other_site() -> Iterator[TestSite]:
    with TestSite() as running:
        yield running


def same(result: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key not in VOLATILE}


def spark_env(settings: Settings) -> dict[str, str]:
    # The plug-in site on the path of the driver and of its local executors (they inherit it).
    return {**cluster_env(settings), "PYTHONPATH": os.pathsep.join((str(Path.cwd()), str(PLUGIN_SITE))),
            "VCRAWL_TEST_ANALYSIS_SLEEP_S": "0", "SPARK_LOCAL_IP": "127.0.0.1"}  # fmt: skip


def on_spark(settings: Settings, job: str, analyzer: str, *more: str) -> dict[str, Any]:
    done = vcrawl(spark_env(settings), "analyze", job, "--analyzer", analyzer, "--engine", "spark", "--json", *more)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(done.stdout.splitlines()[-1])
    assert run["engine"] == "spark" and run["state"] == "done", run
    return run


def test_spark_gives_the_chords_reports_reading_the_pages_from_the_jobs_warc_files(
    site: TestSite, other_site: TestSite, vcrawl_settings: Settings
) -> None:
    build_sites(site, other_site)
    status = crawl(site, other_site, warc=True)
    job = status["job"]
    chord = {name: json.loads(Path(tasks.analyze_job(job, name, chunk=3, timeout_s=60)).read_text())
             for name in ("site-report", "near-duplicates", "slow-site-report")}  # fmt: skip
    tasks.deps.close_warc()  # ships this process's WARC files and their indexes (a worker does it on its own)
    pages = Path(vcrawl_settings.data) / "jobs" / job / "pages"
    removed = [path for path in pages.rglob("*") if path.is_file()]
    for path in removed:
        path.unlink()  # only the WARC files hold the pages now

    for name, expected in chord.items():
        run = on_spark(vcrawl_settings, job, name, "--master", "local[2]")
        assert (run["urls"], run["pages"]) == (10, 7), run
        assert run["result"] == str(Path(vcrawl_settings.data) / "jobs" / job / "results" / f"{name}.json")
        assert same(json.loads(Path(run["result"]).read_text())) == same(expected), name
    assert len(removed) == status["pages_stored"] == 7
    assert len(chord["near-duplicates"]["clusters"]) == 1


def test_spark_reads_page_files_when_a_job_keeps_no_warc_and_reports_over_several_jobs(
    site: TestSite, other_site: TestSite, vcrawl_settings: Settings
) -> None:
    build_sites(site, other_site)
    since = datetime.now(UTC).isoformat()
    first = crawl(site, other_site)["job"]
    site.add_page("/late.html", "<html><body><a href='/missing.html'>m</a></body></html>")
    second = crawl(site, other_site)["job"]
    one = json.loads(Path(tasks.analyze_job(first, "site-report", timeout_s=60)).read_text())

    alone = on_spark(vcrawl_settings, first, "site-report")
    both = on_spark(vcrawl_settings, "", "site-report", "--jobs", f"{first},{second}")

    assert same(json.loads(Path(alone["result"]).read_text())) == same(one)
    together = json.loads(Path(both["result"]).read_text())
    assert Path(both["result"]).parent.parent == Path(vcrawl_settings.data) / "analyses"
    assert together["jobs"] == [first, second] and "job" not in together
    assert together["urls"] == one["urls"]  # the same URLs, each counted once: its latest line over both jobs
    assert together["totals"]["pages"] == one["totals"]["pages"]
    spanned = on_spark(vcrawl_settings, "", "site-report", "--since", since)  # no job named: every job in storage
    over_span = json.loads(Path(spanned["result"]).read_text())
    assert {first, second} <= set(over_span["jobs"]) and over_span["since"] is not None
    assert same(over_span) == {**same(together), "jobs": over_span["jobs"], "since": over_span["since"], "until": None}


def test_a_scheduled_jobs_cycles_read_from_warc_captures_give_the_chords_reports(
    site: TestSite, vcrawl_settings: Settings
) -> None:
    """Two cycles: /b changed in the second, / and /a were unchanged (revisit records). Each stored line's
    page is its own cycle's capture; the view across cycles takes an unchanged page's last stored version."""
    from tests.integration.test_cycles import ALWAYS_DUE, run_cycle
    from tests.integration.test_cycles import job as scheduled_job
    from tests.integration.test_cycles import page as cycle_page

    site.add_versioned("/", cycle_page("/a", "/b", "/gone", title="home"))
    site.add_versioned("/a", cycle_page(title="a"))
    b = site.add_versioned("/b", cycle_page(title="b"))
    spec = scheduled_job(site, "spark-cycles", revisit=ALWAYS_DUE, warc=True)
    run_cycle(spec)
    b.change(cycle_page("/a", title="b, second edition"))
    run_cycle(spec)
    chord = {cycle: json.loads(Path(tasks.analyze_job("spark-cycles", "site-report", cycle=cycle,
                                                      timeout_s=60)).read_text())
             for cycle in (None, 1, 2)}  # fmt: skip
    tasks.deps.close_warc()
    folder = Path(vcrawl_settings.data) / "jobs" / "spark-cycles"
    for path in [*folder.glob("pages/**/*"), *folder.glob("cycle-*/pages/**/*")]:
        if path.is_file():
            path.unlink()  # only the WARC files hold the pages now

    for cycle, expected in chord.items():
        more = () if cycle is None else ("--cycle", str(cycle))
        run = on_spark(vcrawl_settings, "spark-cycles", "site-report", "--master", "local[2]", *more)
        assert same(json.loads(Path(run["result"]).read_text())) == same(expected), cycle
    assert chord[2]["totals"]["pages"] == 1 and chord[None]["totals"]["pages"] == 3


def test_a_standalone_spark_master_and_worker_on_loopback_run_the_analysis(
    site: TestSite, other_site: TestSite, vcrawl_settings: Settings, tmp_path: Path
) -> None:
    build_sites(site, other_site)
    job = crawl(site, other_site, warc=True)["job"]
    expected = json.loads(Path(tasks.analyze_job(job, "site-report", timeout_s=60)).read_text())
    tasks.deps.close_warc()

    with StandaloneSpark(tmp_path / "spark") as spark:
        run = on_spark(vcrawl_settings, job, "site-report", "--master", spark.master_url)
        ran_there = spark.executor_ran()

    assert same(json.loads(Path(run["result"]).read_text())) == same(expected)
    assert ran_there, "the standalone worker never started an executor for the run"


def test_the_command_line_refuses_what_spark_cannot_do_with_the_field_named(
    site: TestSite, other_site: TestSite, vcrawl_settings: Settings
) -> None:
    env = spark_env(vcrawl_settings)
    build_sites(site, other_site)
    job = crawl(site, other_site)["job"]
    for args, message in (
        ((job, "--analyzer", "site-report", "--jobs", "a,b"), "name one job, or several with --jobs"),
        (("", "--analyzer", "site-report"), "name one job, or several with --jobs"),
        ((job, "--analyzer", "site-report", "--master", "local[2]"), "need --engine spark"),
        ((job, "--analyzer", "fields", "--engine", "spark"), "no batch analyzer 'fields'"),
        (("no-such-job", "--analyzer", "site-report", "--engine", "spark"), "job no-such-job has no crawled URLs"),
        ((job, "--analyzer", "site-report", "--engine", "spark", "--since", "soon"), "since: expected a date"),
        ((job, "--analyzer", "site-report", "--engine", "spark", "--spark-conf", "x"), "expected KEY=VALUE"),
    ):
        refused = vcrawl(env, "analyze", *[arg for arg in args if arg])
        assert refused.returncode == 2 and message in refused.stderr, (args, refused.stderr[-500:])
    after = vcrawl(env, "analyze", job, "--analyzer", "site-report", "--engine", "spark", "--since", "2999-01-01")
    assert after.returncode == 2 and "no crawled URLs in the span asked" in after.stderr, after.stderr[-500:]


def test_executors_read_a_job_kept_on_hdfs_through_webhdfs(tmp_path: Path) -> None:
    """The data root on the WebHDFS test server (a protocol-level stand-in for a NameNode and DataNode;
    the client is the real ``hdfs`` package): the crawl, the chord and the executors all go through it."""
    with LocalRedis(tmp_path / "redis") as server, WebHdfsTestServer() as hdfs, TestSite() as site:
        build_site(site)
        settings = Settings(redis_url=server.url, data=f"hdfs://{hdfs.namenode}/crawl", hdfs_user="vcrawl")
        env = cluster_env(settings)
        worker = start_worker(env, "spark-hdfs", tmp_path / "worker.log", concurrency=4)
        try:
            done, _ = submit_and_wait(env, job_file(tmp_path, site, "spark-hdfs"))
            assert done.returncode == 0, done.stderr
            chord = vcrawl(env, "analyze", "spark-hdfs", "--analyzer", "site-report", "--json")
            assert chord.returncode == 0, chord.stderr
            expected = json.loads(hdfs.read("/crawl/jobs/spark-hdfs/results/site-report.json") or b"{}")
        finally:
            stop_worker(worker)
        before = len(hdfs.requests)
        run = on_spark(settings, "spark-hdfs", "site-report", "--master", "local[2]")
        reads = [request.path for request in hdfs.requests[before:] if request.role == "datanode"]
        result = json.loads(hdfs.read("/crawl/jobs/spark-hdfs/results/site-report.json") or b"{}")

    assert run["result"] == f"hdfs://{hdfs.namenode}/crawl/jobs/spark-hdfs/results/site-report.json"
    assert same(result) == same(expected) and result["totals"]["pages"] == run["pages"] > 0
    assert any(path.endswith(".warc.gz") for path in reads), reads  # the pages came out of the WARC file
