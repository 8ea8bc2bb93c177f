"""Analyzer programs with a real worker: a ``celery worker`` subprocess whose ``VCRAWL_ANALYZER_PROGRAMS``
names small Python scripts, jobs sent by ``vcrawl submit`` (which reads the same file to check the rules),
alerts to the session's webhook receiver.

The programs note every run and every PID they start in files; the module's teardown kills every
PID noted, the worker and its Redis, also when a test fails.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli.local_redis import LocalRedis
from storage import Storage
from storage.records import read_records
from tests.cluster import REPO, cluster_env, start_worker, stop_worker, submit, wait_all
from tests.integration.conftest import AlertSinks
from tests.site import TestSite
from vcrawl.settings import Settings

pytestmark = pytest.mark.slow

HANG_TIMEOUT_S = 1.0

TITLES = """
import json, re, sys
source, target = sys.argv[-2], sys.argv[-1]
body = sys.stdin.buffer.read() if source == "-" else open(source, "rb").read()
title = re.search(rb"<title>(.*?)</title>", body)
result = {"length": len(body), "title": title.group(1).decode() if title else None, "url": os.environ["VCRAWL_URL"]}
if target == "-":
    json.dump(result, sys.stdout)
else:
    with open(target, "w") as out:
        json.dump(result, out)
"""
CRASHES = "raise RuntimeError('the program has a bug')\n"
HANGS = """
import subprocess, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(PIDS, "a") as pid_file:
    pid_file.write(f"{child.pid}\\n")
time.sleep(600)
"""


@dataclass
class Cluster:
    """The worker's environment and the files its programs write."""

    env: dict[str, str]
    work: Path
    runs: Path  # one line per program run: "<analyzer> <url>"
    pids: Path  # every PID a program started

    def submit(self, job: dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
        """``vcrawl submit --wait --json``: the job's summary once it ended."""
        path = self.work / f"job-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(job))
        done = subprocess.run([sys.executable, "-m", "cli", "submit", str(path), "--wait", "--json"], env=self.env,
                              cwd=REPO, capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def runs_of(self, analyzer: str) -> list[str]:
        return [line.split(" ", 1)[1] for line in self.runs.read_text().splitlines() if line.startswith(analyzer + " ")]

    def records(self, job_id: str, count: int, timeout_s: float = 15.0) -> list[dict[str, Any]]:
        """The job's records, once ``count`` of them were shipped (parts ship every second here)."""
        store = Storage(self.env["VCRAWL_DATA"])
        deadline = time.monotonic() + timeout_s
        while len(found := list(read_records(store, f"jobs/{job_id}/records"))) < count:
            assert time.monotonic() < deadline, f"{len(found)} of {count} records after {timeout_s}s"
            time.sleep(0.2)
        return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, alert_sinks: AlertSinks) -> Iterator[Cluster]:
    """A Redis, and a worker with four analyzer programs: titles, titles_stream, crashes, hangs."""
    work = tmp_path_factory.mktemp("programs")
    runs, pids = work / "runs", work / "pids"
    runs.touch()
    pids.touch()
    programs = {
        "titles": {"command": [_script(work, "titles.py", TITLES, runs, pids)]},
        "titles_stream": {"command": [_script(work, "titles.py", TITLES, runs, pids)], "io": "stream"},
        "crashes": {"command": [_script(work, "crashes.py", CRASHES, runs, pids)]},
        "hangs": {"command": [_script(work, "hangs.py", HANGS, runs, pids)], "timeout_s": HANG_TIMEOUT_S},
    }
    (work / "programs.json").write_text(json.dumps(programs))
    with LocalRedis(work / "redis") as server:
        settings = Settings(
            redis_url=server.url,
            data=str(work / "data"),
            analyzer_programs=str(work / "programs.json"),
            analysis_backoff_s=0.05,  # the shipped backoff is tested with a plugin (test_one_crawler.py)
            records_flush_s=1.0,
            min_interval_s=0.0,
            alert_webhook_url=alert_sinks.webhook_url,
        )
        env = cluster_env(settings)
        worker = start_worker(env, "programs", work / "worker.log", concurrency=2, loglevel="WARNING")
        try:
            yield Cluster(env, work, runs, pids)
        finally:
            stop_worker(worker)
            for pid in map(int, pids.read_text().split()):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _script(work: Path, name: str, body: str, runs: Path, pids: Path) -> str:
    """An executable Python script that notes its run and its PID, then runs `body`."""
    path = work / name
    prologue = (
        "import os, sys\n"
        "with open(RUNS, 'a') as runs: runs.write(f\"{os.environ['VCRAWL_ANALYZER']} {os.environ['VCRAWL_URL']}\\n\")\n"
        "with open(PIDS, 'a') as pid_file: pid_file.write(f'{os.getpid()}\\n')\n"
    )
    text = f"#!{sys.executable}\n{prologue}{body}".replace("RUNS", repr(str(runs))).replace("PIDS", repr(str(pids)))
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _alerts(sinks: AlertSinks, analyzer: str, job_id: str) -> list[dict[str, Any]]:
    time.sleep(1.0)  # a second alert would have arrived by now
    subject = f"analyzer {analyzer} failing in job {job_id}"
    return [hook for hook in sinks.webhooks if subject in hook["subject"]]


def _is_gone(pid: int) -> bool:
    """True if `pid` has exited (a zombie counts: nobody here reaps the program's orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_job_whose_rules_name_programs_gets_their_records(cluster: Cluster, alert_sinks: AlertSinks) -> None:
    with TestSite() as site:
        first = site.add_page("/a.html", '<html><head><title>First</title></head><a href="/b.html">b</a></html>')
        second = site.add_page("/b.html", "<html><head><title>Second</title></head><p>b</p></html>")
        files = {"pattern": "/a[.]html$", "analyzer": "titles"}
        stream = {"pattern": "/b[.]html$", "analyzer": "titles_stream"}
        job = {"seeds": [first], "max_depth": 1, "rules": [files, stream]}

        summary = cluster.submit(job)

    assert summary["state"] == "completed" and summary["records"] == 2, summary
    assert summary["analysis_failed"] == {}, summary
    records = {record["url"]: record for record in cluster.records(summary["job"], 2)}
    assert records[first]["analyzer"] == "titles" and records[first]["data"]["title"] == "First"
    assert records[second]["analyzer"] == "titles_stream" and records[second]["data"]["title"] == "Second"
    assert records[first]["data"]["url"] == first and records[first]["data"]["length"] > 0
    assert not _alerts(alert_sinks, "titles", summary["job"])


def test_a_crashing_program_is_retried_then_alerted_and_its_page_counts_as_analysis_failed(
    cluster: Cluster, alert_sinks: AlertSinks
) -> None:
    with TestSite() as site:
        url = site.add_page("/", '<html><body><a href="/next.html">next</a></body></html>')
        site.add_page("/next.html", "<html><body>next</body></html>")

        summary = cluster.submit({"seeds": [url], "max_depth": 1, "rules": [{"pattern": "/$", "analyzer": "crashes"}]})

    assert summary["state"] == "completed", summary
    assert summary["analysis_failed"] == {"error": 1} and summary["records"] == 0, summary
    assert summary["pages_stored"] == 2  # the failing page's links were still followed
    assert cluster.runs_of("crashes").count(url) == 4  # the first run and 3 retries
    hooks = _alerts(alert_sinks, "crashes", summary["job"])
    assert len(hooks) == 1, hooks
    assert hooks[0]["details"]["attempts"] == 4
    assert "ProgramFailed" in hooks[0]["details"]["error"] and "exited with status 1" in hooks[0]["details"]["error"]
    assert "RuntimeError: the program has a bug" in hooks[0]["details"]["error"]  # the tail of its stderr


def test_a_hanging_program_is_killed_at_its_timeout_and_fails_without_wedging_the_worker(
    cluster: Cluster, alert_sinks: AlertSinks
) -> None:
    with TestSite() as site:
        url = site.add_page("/", "<html><head><title>Hang</title></head></html>")
        started = time.monotonic()
        summary = cluster.submit({"seeds": [url], "max_depth": 0, "rules": [{"pattern": ".", "analyzer": "hangs"}]})
        took_s = time.monotonic() - started
        # The same worker (two threads) still analyses: nothing of the hanging runs holds it.
        after = cluster.submit({"seeds": [site.add_page("/ok.html", "<title>Fine</title>")], "max_depth": 0,
                                "rules": [{"pattern": ".", "analyzer": "titles"}]})  # fmt: skip

    assert summary["state"] == "completed" and summary["analysis_failed"] == {"error": 1}, summary
    assert cluster.runs_of("hangs").count(url) == 4
    assert took_s < 4 * HANG_TIMEOUT_S + 20  # four killed runs, backoff and two process starts
    hooks = _alerts(alert_sinks, "hangs", summary["job"])
    assert len(hooks) == 1 and f"timed out after {HANG_TIMEOUT_S:g}s" in hooks[0]["details"]["error"], hooks
    noted = [int(pid) for pid in cluster.pids.read_text().split()]
    assert noted and all(_is_gone(pid) for pid in noted)  # every program and the children they started
    assert after["state"] == "completed" and after["records"] == 1, after


def test_a_single_task_naming_programs_is_analysed_or_ends_analysis_failed_after_its_retries(cluster: Cluster) -> None:
    with TestSite() as site:
        works = site.add_page("/works.html", "<title>Single</title>")
        crashes = site.add_page("/crashes.html", "<title>Crash</title>")
        ok_id, failed_id = submit(cluster.env, [{"url": works, "analyzer": "titles"},
                                                {"url": crashes, "analyzer": "crashes"}])  # fmt: skip
        records = wait_all(cluster.env, [ok_id, failed_id], {"analyzed", "analysis_failed"}, timeout_s=60)

    assert records[ok_id]["state"] == "analyzed", records[ok_id]
    assert json.loads(Path(records[ok_id]["result_path"]).read_text())["title"] == "Single"
    assert records[failed_id]["state"] == "analysis_failed", records[failed_id]
    assert "exited with status 1" in records[failed_id]["error"]
    assert cluster.runs_of("crashes").count(crashes) == 4  # the first run and 3 retries


@pytest.mark.parametrize(
    ("programs", "message"),
    [
        pytest.param({"titles": {"command": ["titles.py"]}}, "not an absolute path to an executable", id="relative"),
        pytest.param({"links": {"command": ["/bin/true"]}}, "uses the name of a built-in analyzer", id="name-taken"),
    ],
)
def test_a_worker_with_a_bad_programs_file_exits_naming_the_variable(
    cluster: Cluster, tmp_path: Path, programs: dict[str, Any], message: str
) -> None:
    path = tmp_path / "programs.json"
    path.write_text(json.dumps(programs))
    env = {**cluster.env, "VCRAWL_ANALYZER_PROGRAMS": str(path)}
    command = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "analysis", "-P", "threads", "-c", "1",
               "-n", "refused@localhost", "--without-mingle", "--without-gossip"]  # fmt: skip

    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=30)

    assert done.returncode == 1, done.stderr[-2000:]
    refusal = [line for line in done.stderr.splitlines() if "vcrawl: configuration error:" in line]
    assert refusal and "VCRAWL_ANALYZER_PROGRAMS" in refusal[-1] and message in refusal[-1], done.stderr[-2000:]
