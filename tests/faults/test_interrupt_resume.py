"""Ctrl-C / SIGTERM of `vcrawl crawl` mid-job, then `vcrawl resume JOB --data DIR`: nothing lost.

Each test runs the real command line as a subprocess (its private redis-server kept in the data
root, its `celery worker` processes) against two slow loopback sites, signals it while fetches
are in flight, and resumes the job with a second process. The job must complete with exactly
the pages of an undisturbed run, every URL fetched, and at most the in-flight fetches repeated.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.jobs import paced_batch_size
from tests.cluster import REPO
from tests.site import NOT_PAGES, Response, TestSite
from vcrawl.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.faults]

PAGES_PER_HOST = 24
# Every response waits this long: a signal finds fetches in flight. It is also the time the test
# has to see a new request and send its signal (0.25 s failed once on a loaded machine).
PAGE_DELAY_S = 0.5
INTERVAL_S = 0.1  # politeness: one fetch at a time per host, so one URL per host in flight
LOOPBACK = "127.0.0.0/8,::1/128"


class CliRun:
    """A `vcrawl` subprocess whose output is read as it comes; it knows the PIDs it started."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli", *args], env=env, cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: object, lines: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    def child_pids(self) -> list[int]:
        """The redis-server and worker PIDs the command printed."""
        text = self.stderr
        pids = [int(pid) for pid in re.findall(r"private redis-server \(pid (\d+)\)", text)]
        for listing in re.findall(r"worker processes \(pids \[([\d, ]*)\]\)", text):
            pids += [int(pid) for pid in re.findall(r"\d+", listing)]
        return pids

    def wait(self, timeout_s: float) -> int:
        code = self.process.wait(timeout_s)
        for reader in self._readers:
            reader.join(5)
        return code

    def kill_all(self) -> None:
        """SIGKILL the command and the children it printed, by PID, if they still run."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        for pid in self.child_pids():
            if _is_ours(pid):
                os.kill(pid, signal.SIGKILL)


def _is_ours(pid: int) -> bool:
    """True while ``pid`` is still a redis-server or celery worker (not a reused PID)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"redis-server" in cmdline or b"celery" in cmdline


@pytest.fixture
def runs() -> Iterator[list[CliRun]]:
    """Every `vcrawl` run of the test; all of them and their children are killed at the end."""
    started: list[CliRun] = []
    yield started
    for run in started:
        run.kill_all()


@pytest.fixture
def sites() -> Iterator[tuple[TestSite, TestSite]]:
    """Two slow loopback hosts with PAGES_PER_HOST pages each, linked from their index."""
    with TestSite("127.0.0.1") as a, TestSite("127.0.0.2") as b:
        for site in (a, b):
            paths = [f"/p{n}" for n in range(PAGES_PER_HOST)]
            site.add_response("/", _page(*paths))
            for path in paths:
                site.add_response(path, _page("/"))
        yield a, b


def _page(*links: str) -> Response:
    body = "<html><body>" + "".join(f'<a href="{href}">{href}</a>' for href in links) + "</body></html>"
    return Response(body.encode(), delay_s=PAGE_DELAY_S)


def _env(loopback_allowed: bool = True) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")}  # no cluster: the embedded default
    networks = {"VCRAWL_ALLOWED_NETWORKS": LOOPBACK} if loopback_allowed else {}
    return {**base, "PYTHONPATH": str(REPO), **networks}


def _fetches(*sites: TestSite) -> Counter[str]:
    return Counter(site.base + seen.path for site in sites for seen in site.seen if seen.path not in NOT_PAGES)


def _wait_for_fetch_in_flight(run: CliRun, sites: tuple[TestSite, TestSite], after: int, timeout_s: float) -> float:
    """Wait until ``after`` pages were requested, then for a new request; return its arrival time."""
    deadline = time.monotonic() + timeout_s
    while sum(_fetches(*sites).values()) < after and time.monotonic() < deadline and run.process.poll() is None:
        time.sleep(0.02)
    count = sum(_fetches(*sites).values())
    assert count >= after, f"only {count} pages requested in {timeout_s}s: {run.stderr}"
    while sum(_fetches(*sites).values()) == count and time.monotonic() < deadline:
        time.sleep(0.005)
    return max(seen.at for site in sites for seen in site.seen)


def _crawl(runs: list[CliRun], sites: tuple[TestSite, TestSite], data: Path, *more: str, **env: bool) -> CliRun:
    run = CliRun("crawl", sites[0].url("/"), sites[1].url("/"), "--delay", str(INTERVAL_S), "--workers", "1",
                 "--data", str(data), "--json", *more, env=_env(**env))  # fmt: skip
    runs.append(run)
    return run


def _resume_to_the_end(runs: list[CliRun], command: list[str], **env: bool) -> dict[str, object]:
    """Run ``command`` (``vcrawl resume ...`` as the interrupted run printed it) with one worker."""
    import json

    assert command[:2] == ["vcrawl", "resume"], command
    run = CliRun(*command[1:], "--workers", "1", "--json", env=_env(**env))
    runs.append(run)
    assert run.wait(60) == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def _check_complete(summary: dict[str, object], sites: tuple[TestSite, TestSite], data: Path, repeats: int) -> None:
    expected = {site.url(path) for site in sites for path in ["/", *(f"/p{n}" for n in range(PAGES_PER_HOST))]}
    fetched = _fetches(*sites)
    assert summary["state"] == "completed", summary
    assert set(fetched) == expected  # every URL fetched: recall 100 %, nothing lost
    assert summary["pages_stored"] == len(expected) and summary["failed"] == {}
    stored = list((data / "jobs" / str(summary["job"]) / "pages").rglob("*.html"))
    assert len(stored) == len(expected)  # the same pages on disk as an undisturbed run
    duplicates = sum(fetched.values()) - len(fetched)
    assert duplicates <= repeats, fetched.most_common(3)  # only what was in flight, at most


def _assert_gone(pids: list[int]) -> None:
    for pid in pids:
        assert not _is_ours(pid), f"process {pid} still runs"


@pytest.mark.parametrize(
    ("signum", "by_flag"),
    [(signal.SIGINT, False), (signal.SIGTERM, True)],
    ids=["ctrl-c", "sigterm-allow-network-flag"],
)
def test_interrupted_crawl_pauses_and_resume_completes_it_with_nothing_lost(
    runs: list[CliRun], sites: tuple[TestSite, TestSite], tmp_path: Path, signum: int, by_flag: bool
) -> None:
    data = tmp_path / "data"
    # Loopback allowed by the environment, or by this run's --allow-network (which the resume hint repeats).
    flags = ["--allow-network", "127.0.0.0/8"] if by_flag else []
    crawl = _crawl(runs, sites, data, *flags, loopback_allowed=not by_flag)
    arrived = _wait_for_fetch_in_flight(crawl, sites, after=10, timeout_s=30)
    crawl.process.send_signal(signum)
    sent = time.monotonic()
    assert sent - arrived < PAGE_DELAY_S  # that request was still waiting for its response

    assert crawl.wait(20) == 130, crawl.stderr
    assert time.monotonic() - sent < 10  # the grace time (4 s) and a clean stop
    hint = re.search(r"resume it with: (vcrawl resume .*)", crawl.stderr)
    assert hint is not None, crawl.stderr
    command = shlex.split(hint.group(1))
    assert command[3:5] == ["--data", str(data.resolve())]
    assert ("--allow-network" in command) is by_flag
    assert "nothing was in flight" in crawl.stderr  # in-flight fetches finished within the grace time
    _assert_gone(crawl.child_pids())
    before = sum(_fetches(*sites).values())
    assert before < 2 * (PAGES_PER_HOST + 1)  # the job really was interrupted mid-way

    summary = _resume_to_the_end(runs, command, loopback_allowed=not by_flag)

    _check_complete(summary, sites, data, repeats=0)  # a pause lets in-flight fetches finish
    _assert_gone(runs[-1].child_pids())
    assert not (data / ".vcrawl-redis" / "appendonlydir").exists()  # done: the saved state goes


def test_a_second_ctrl_c_stops_at_once_and_resume_redelivers_what_was_cut(
    runs: list[CliRun], sites: tuple[TestSite, TestSite], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    for site in sites:  # responses slower than the grace time: the second Ctrl-C cuts them
        for n in range(6, PAGES_PER_HOST):
            site.add_response(f"/p{n}", Response(_page("/").body, delay_s=8.0))
    crawl = _crawl(runs, sites, data)
    deadline = time.monotonic() + 30
    while not any(seen.path == "/p6" for site in sites for seen in site.seen) and time.monotonic() < deadline:
        time.sleep(0.02)
    crawl.process.send_signal(signal.SIGINT)
    time.sleep(0.5)
    crawl.process.send_signal(signal.SIGINT)
    sent = time.monotonic()

    assert crawl.wait(20) == 130, crawl.stderr
    assert time.monotonic() - sent < 6  # workers killed at once, Redis stopped cleanly
    assert "redelivered when resumed" in crawl.stderr
    _assert_gone(crawl.child_pids())
    for site in sites:  # fast again: the resumed run re-fetches the cut pages
        for n in range(6, PAGES_PER_HOST):
            site.add_response(f"/p{n}", _page("/"))

    command = re.search(r"resume it with: (vcrawl resume .*)", crawl.stderr).group(1)  # type: ignore[union-attr]
    summary = _resume_to_the_end(runs, shlex.split(command))

    assert "put back on their queues" in runs[-1].stderr  # the killed worker's messages, at once
    # One batch per host was cut mid-fetch: what it fetched before is fetched again. A paced batch
    # holds up to 2 s of its host's URLs (engine.jobs.paced_batch_size), as an unpaced one holds 32.
    _check_complete(summary, sites, data, repeats=len(sites) * paced_batch_size(INTERVAL_S, Settings().frontier_batch))
