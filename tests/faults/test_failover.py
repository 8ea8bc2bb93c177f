"""Redis behind Sentinel loses its primary mid-crawl: the replica is promoted and nothing is lost.

Real processes on loopback (tests/sentinel_cluster.py): a Redis primary, one replica and three
Sentinels (quorum 2, down-after 2 s); two `celery worker` processes crawl local sites on distinct
hosts with politeness; the primary is SIGKILLed at ~30 % of the pages. The job must complete by
itself with exactly the pages of an undisturbed run, every page stored, robots.txt obeyed and no
per-host gap below the interval (server-side arrival times). Beat goes on firing across a
failover; after it, the old primary comes back as a replica and a failover by hand
(``SENTINEL FAILOVER``, the primary still up) moves it back. vcrawl runs with its shipped settings
(only the data folder and the Sentinel addresses are set): the timeouts a failover meets are the
ones users run.

Each test notes its figures in the fault report (tests/faults/conftest.py): seconds without a
page fetched after the kill, the promotion's seconds, pages fetched twice, pages lost.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from frontier import Frontier
from storage.naming import job_page_location
from tests.cluster import REPO, cluster_env, stop_worker
from tests.faults.test_faults import page, start_job, stop_gracefully
from tests.sentinel_cluster import SentinelCluster, start_sentinel_worker
from tests.site import NOT_PAGES, Response, TestSite
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = [pytest.mark.slow, pytest.mark.faults]

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
INTERVAL_S = 0.05
POLITENESS = {"min_interval_s": INTERVAL_S, "jitter": 0, "per_host": 1}
ROBOTS = "User-agent: *\nDisallow: /private\n"
KILL_SHARE = 0.3
PROMOTION_LIMIT_S = 30.0
DONE_LIMIT_S = 120.0  # after the last failover; an undisturbed run of these jobs takes 7-50 s
Note = Callable[..., None]  # the fault_report fixture (tests/faults/conftest.py)
STUCK_KEYS = ("state", "admitted", "queued", "pending", "in_flight_batches", "pages_stored", "lease_expired")


def sentinel_settings(cluster: SentinelCluster, data: Path, **overrides: Any) -> Settings:
    """vcrawl's shipped defaults, pointed at the Sentinels."""
    return Settings(redis_url=cluster.url, redis_sentinel_master=cluster.master_name, data=str(data), **overrides)


def serve_site(site: TestSite, count: int, delay_s: float = 0.0) -> list[str]:
    """``count`` pages linked from ``/``, plus ``/private``: linked too, but disallowed by robots.txt.

    Returns the paths an undisturbed run fetches.
    """
    paths = [f"/p{n}" for n in range(count)]
    site.add_page("/robots.txt", ROBOTS)
    site.add_response("/", Response(page(*paths, "/private").encode(), delay_s=delay_s))
    for path in paths:
        site.add_response(path, Response(page("/").encode(), delay_s=delay_s))
    site.add_page("/private", page())
    return ["/", *paths]


@dataclass
class Crawl:
    """A running job on a cluster behind Sentinel, and what the test needs to judge it."""

    cluster: SentinelCluster
    sites: list[TestSite]
    expected: dict[str, list[str]]  # site base -> paths of an undisturbed run
    env: dict[str, str]
    data: Path
    logs: list[Path]
    note: Note
    job_id: str = ""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None  # when the job was seen done, or given up on

    @property
    def total(self) -> int:
        return sum(map(len, self.expected.values()))

    def pages_fetched(self) -> int:
        """Page requests the sites have received (robots.txt and sitemaps aside)."""
        return sum(1 for site in self.sites for seen in list(site.seen) if seen.path not in NOT_PAGES)

    def wait_pages(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.pages_fetched() < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {self.pages_fetched()} of {count} pages in {timeout_s}s:\n{self.errors()}")
            time.sleep(0.02)

    def status(self) -> dict[str, Any] | None:
        """The job's status read through the Sentinels (None while Redis does not answer)."""
        try:
            with self.cluster.master_client() as client:
                return job_status(Frontier(client), self.job_id)
        except redis.RedisError:
            return None

    def wait_done(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        status = None
        while time.monotonic() < deadline:
            status = self.status() or status
            if status is not None and status["state"] != "running":
                self.ended = time.monotonic()
                return status
            time.sleep(0.2)
        self.ended = time.monotonic()
        stuck = {key: status[key] for key in STUCK_KEYS if key in status} if status else {}
        self.note(stuck_after_s=timeout_s, stuck_status=stuck, stuck_unacked=self.unacked(),
                  pages_fetched_by_sites=self.pages_fetched())  # fmt: skip
        raise AssertionError(
            f"job {self.job_id} not done within {timeout_s}s; {self.pages_fetched()} of {self.total} pages "
            f"fetched; messages in kombu's unacked hash: {self.unacked()}; last status: {status}\n{self.errors()}"
        )

    def unacked(self) -> int | None:
        """Messages delivered but not acknowledged (kombu's ``unacked`` hash), for a stuck job's report."""
        try:
            with self.cluster.master_client() as client:
                return int(client.hlen("unacked"))
        except redis.RedisError:
            return None

    def errors(self) -> str:
        """The workers' error lines (for a failure message: what was stuck)."""
        lines = []
        for log in self.logs:
            text = log.read_text(errors="replace").splitlines() if log.exists() else []
            bad = [line for line in text if any(word in line for word in ("ERROR", "Error", "Traceback", "CRITICAL"))]
            lines += [f"{log.name}: {line}" for line in bad[-8:]]
        return "\n".join(lines) or "(no error lines in the worker logs)"

    def failover_lines(self) -> str:
        """What the workers did about a failover (fence steps, messages put back, lost fetches), with
        their clocks: a short gap or a page fetched twice is told by these."""
        words = ("Sentinel failover of", "primary changed", "put back", "was lost")
        lines = []
        for log in self.logs:
            text = log.read_text(errors="replace").splitlines() if log.exists() else []
            lines += [f"{log.name}: {line}" for line in text if any(word in line for word in words)]
        return "\n".join(lines[-20:]) or "(no failover lines in the worker logs)"


@contextmanager
def crawl_behind_sentinel(tmp_path: Path, note: Note, pages_per_host: int, delay_s: float = 0.0) -> Iterator[Crawl]:
    """Sentinel cluster, sites, two workers and a started job; everything stopped afterwards."""
    with ExitStack() as stack:
        cluster = stack.enter_context(SentinelCluster(tmp_path / "ha"))
        sites = [stack.enter_context(TestSite(host)) for host in HOSTS]
        expected = {site.base: serve_site(site, pages_per_host, delay_s) for site in sites}
        env = cluster_env(sentinel_settings(cluster, tmp_path / "data"))
        crawl = Crawl(cluster, sites, expected, env, tmp_path / "data", [], note)
        for name in ("w1", "w2"):  # stopped first (the stack unwinds backwards), while Redis is there
            crawl.logs.append(tmp_path / f"{name}.log")
            worker = start_sentinel_worker(env, name, crawl.logs[-1], concurrency=4)
            stack.callback(stop_worker, worker)
        crawl.started = time.monotonic()
        crawl.job_id = start_job(env, {"seeds": [site.url("/") for site in sites], "politeness": POLITENESS})
        yield crawl


def no_progress(crawl: Crawl, kills: list[float]) -> list[float]:
    """The longest stretch without a page fetched (server side), from each fault until the next one
    or until the job was seen done (or given up on)."""
    arrivals = sorted(s.at for site in crawl.sites for s in site.seen if s.path not in NOT_PAGES)
    ends = [*kills[1:], crawl.ended if crawl.ended is not None else max(arrivals, default=0.0)]
    stalls = []
    for killed_at, end in zip(kills, ends, strict=True):  # each fault until the next one
        between = [at for at in arrivals if killed_at <= at < end]
        stalls.append(max((b - a for a, b in itertools.pairwise([killed_at, *between, end])), default=0.0))
    return stalls


def finish(crawl: Crawl, kills: list[float]) -> dict[str, Any]:
    """Wait for the job's end; a stuck job still reports its stalls."""
    try:
        return crawl.wait_done(DONE_LIMIT_S)
    except AssertionError:
        seen = [Counter(s.path for s in site.seen if s.path not in NOT_PAGES) for site in crawl.sites]
        crawl.note(no_progress_s=[round(s, 2) for s in no_progress(crawl, kills)],
                   fetched_twice=sum(sum(counts.values()) - len(counts) for counts in seen),
                   pages_never_fetched=sum(len(set(paths) - set(counts)) for paths, counts in
                                           zip(crawl.expected.values(), seen, strict=True)))  # fmt: skip
        raise


def judge(crawl: Crawl, status: dict[str, Any], kills: list[float], note: Note, failovers: int,
          twice_limit: int | None = None) -> None:  # fmt: skip
    """Note the figures of the run, then check it against an undisturbed run.

    At most one page per host is fetched twice per failover (politeness 1 per host: one in flight
    when a primary goes), unless ``twice_limit`` says otherwise.
    """
    seen = {site.base: Counter(s.path for s in site.seen if s.path not in NOT_PAGES) for site in crawl.sites}
    fetched = {base: set(counts) - {"/private"} for base, counts in seen.items()}
    lost = sum(len(set(crawl.expected[base]) - fetched[base]) for base in seen)
    twice = sum(sum(counts.values()) - len(counts) for counts in seen.values())
    robots_violations = sum(counts["/private"] for counts in seen.values())
    unstored = [
        url
        for site in crawl.sites
        for path in crawl.expected[site.base]
        if not (crawl.data / job_page_location(crawl.job_id, 0, (url := site.url(path)))).exists()
    ]
    pairs = [
        (later.at - earlier.at, site.base, earlier, later)
        for site in crawl.sites
        for earlier, later in itertools.pairwise(sorted(site.seen, key=lambda s: s.at))  # robots.txt and sitemap too
    ]
    gaps = [gap for gap, *_ in pairs]
    stalls = no_progress(crawl, kills)
    note(state=status["state"], pages_expected=crawl.total, pages_stored=status["pages_stored"],
         pages_lost=lost, pages_unstored=len(unstored), fetched_twice=twice, robots_violations=robots_violations,
         min_host_gap_s=round(min(gaps, default=0), 3), no_progress_s=[round(s, 2) for s in stalls],
         wall_s=round(time.monotonic() - crawl.started, 1))  # fmt: skip
    assert status["state"] == "completed", status
    assert lost == 0 and status["failed"] == {}, (lost, status)
    assert {base: fetched[base] for base in seen} == {base: set(paths) for base, paths in crawl.expected.items()}
    assert unstored == [] and status["pages_stored"] == crawl.total, (unstored[:5], status)
    assert robots_violations == 0
    short = [(round(gap, 4), base, [(s.path, round(s.at - kills[0], 3), s.client_port) for s in pair])
             for gap, base, *pair in pairs if gap < INTERVAL_S]  # fmt: skip
    assert not short, (
        f"gaps below the interval (paths, seconds after the first kill, client port): {short}\n"
        f"first kill at {kills[0]:.3f} (monotonic), {time.time() - time.monotonic() + kills[0]:.3f} (epoch)\n"
        f"{crawl.failover_lines()}"
    )
    limit = len(crawl.sites) * failovers if twice_limit is None else twice_limit
    assert twice <= limit, {base: c.most_common(2) for base, c in seen.items()}


def test_primary_sigkilled_mid_job_the_replica_takes_over_and_no_page_is_lost(
    tmp_path: Path, fault_report: Note
) -> None:
    with crawl_behind_sentinel(tmp_path, fault_report, pages_per_host=100) as crawl:
        crawl.wait_pages(int(crawl.total * KILL_SHARE), 60)
        killed_at = time.monotonic()
        at_pages = crawl.pages_fetched()
        old = crawl.cluster.kill_primary()
        _, promotion_s = crawl.cluster.wait_promotion(old, PROMOTION_LIMIT_S)
        fault_report(fault="Redis primary SIGKILLed at 30 % of a job; Sentinel promotes the replica",
                     killed_at_pages=at_pages, promotion_s=round(promotion_s, 2))  # fmt: skip
        status = finish(crawl, [killed_at])
    judge(crawl, status, [killed_at], fault_report, failovers=1)


def test_a_replica_behind_when_the_primary_dies_costs_refetches_never_pages(tmp_path: Path, fault_report: Note) -> None:
    """Asynchronous replication's loss, made to happen: the replica stalls (SIGSTOP, a frozen
    machine) for 1.5 s, so the writes of the primary's last second never reach it, then the primary
    is SIGKILLed. Replication keeps order, so the replica holds a prefix: any acknowledgement it
    lacks, it lacks with the task's writes, and that task's message is still in its ``unacked``
    hash, put back at once by the primary watch (tasks/broker/primary_watch.py): the work is done again,
    never lost. What the stall costs is pages fetched twice, at most those fetched in it."""
    with crawl_behind_sentinel(tmp_path, fault_report, pages_per_host=100) as crawl:
        crawl.wait_pages(int(crawl.total * KILL_SHARE), 60)
        primary = crawl.cluster.primary_port()
        [replica_pid] = [pid for port, pid in crawl.cluster.pids().items() if port != primary]
        stalled_at_pages = crawl.pages_fetched()
        os.kill(replica_pid, signal.SIGSTOP)
        try:
            time.sleep(1.0)  # the primary takes writes the replica does not get
            killed_at = time.monotonic()
            in_stall = crawl.pages_fetched() - stalled_at_pages
            old = crawl.cluster.kill_primary()
            time.sleep(0.5)
        finally:
            os.kill(replica_pid, signal.SIGCONT)
        _, promotion_s = crawl.cluster.wait_promotion(old, PROMOTION_LIMIT_S)
        fault_report(fault="replica frozen 1.5 s, primary SIGKILLed 1 s into it (its last writes lost)",
                     killed_at_pages=stalled_at_pages + in_stall, pages_in_stall=in_stall,
                     promotion_s=round(promotion_s, 2))  # fmt: skip
        status = finish(crawl, [killed_at])
    judge(crawl, status, [killed_at], fault_report, failovers=1, twice_limit=in_stall + len(crawl.sites))


def test_old_primary_back_as_replica_and_a_failover_back_mid_job_lose_nothing(
    tmp_path: Path, fault_report: Note
) -> None:
    # Slower pages (0.1 s each): the job must still run when the old primary is back (~10-18 s).
    with crawl_behind_sentinel(tmp_path, fault_report, pages_per_host=300, delay_s=0.1) as crawl:
        crawl.wait_pages(int(crawl.total * KILL_SHARE), 90)
        kills = [time.monotonic()]
        old = crawl.cluster.kill_primary()
        _, promotion_s = crawl.cluster.wait_promotion(old, PROMOTION_LIMIT_S)
        crawl.cluster.restart_old_primary()
        back_at_pages = crawl.pages_fetched()
        assert back_at_pages < crawl.total * 0.9, "the job ran out before the failback: make it longer"
        kills.append(time.monotonic())
        replaced = crawl.cluster.failover()  # by hand, the old primary still up: the workers fence it
        back, failback_s = crawl.cluster.wait_promotion(replaced, PROMOTION_LIMIT_S)
        fault_report(fault="primary SIGKILLed at 30 %, brought back as a replica, then SENTINEL FAILOVER back",
                     promotion_s=round(promotion_s, 2), failback_s=round(failback_s, 2),
                     failback_at_pages=back_at_pages, failed_back_to_old=back == old)  # fmt: skip
        status = finish(crawl, kills)
    judge(crawl, status, kills, fault_report, failovers=2)


EVERY_S = 2.0


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, *command], env=env, cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip


def _sent(log: Path) -> list[float]:
    """When beat sent each firing (its log's clock, seconds of the day)."""
    times = []
    for line in log.read_text(errors="replace").splitlines():
        if "Sending due task news" in line:
            clock = line.split(",", 1)[0].rsplit(" ", 1)[-1]
            hours, minutes, seconds = (float(part) for part in clock.split(":"))
            times.append(hours * 3600 + minutes * 60 + seconds)
    return times


def test_beat_goes_on_firing_across_a_failover(tmp_path: Path, fault_report: Note) -> None:
    """RedBeat extends its lock at every tick; the failover's connection error used to leave Celery's
    beat loop and end beat for good (tasks/beat.py). Beat, at its shipped settings, keeps firing."""
    with ExitStack() as stack:
        cluster = stack.enter_context(SentinelCluster(tmp_path / "ha"))
        site = stack.enter_context(TestSite(HOSTS[0]))
        site.add_page("/", page())
        schedules = tmp_path / "schedules.yaml"
        news = {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0}, "sitemaps": False}
        schedules.write_text(yaml.safe_dump({"schedules": [{"name": "news", "every": EVERY_S, "job": news}]}))
        env = cluster_env(sentinel_settings(cluster, tmp_path / "data", schedules_file=str(schedules)))
        beat_log = tmp_path / "beat.log"
        beat = _start(["-m", "celery", "-A", "tasks", "beat", "-l", "INFO", "--schedule", str(tmp_path / "beat.db")],
                      env, beat_log)  # fmt: skip
        stack.callback(stop_gracefully, beat)
        deadline = time.monotonic() + 40
        while len(_sent(beat_log)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_sent(beat_log)) >= 2, beat_log.read_text()[-2000:]
        before = len(_sent(beat_log))
        old = cluster.kill_primary()
        _, promotion_s = cluster.wait_promotion(old, PROMOTION_LIMIT_S)
        deadline = time.monotonic() + promotion_s + 4 * EVERY_S + 20
        while len(_sent(beat_log)) < before + 3 and time.monotonic() < deadline and beat.poll() is None:
            time.sleep(0.2)
        sent = _sent(beat_log)
        gaps = [later - earlier for earlier, later in itertools.pairwise(sent)]
        fault_report(fault="primary SIGKILLed under beat (RedBeat)", promotion_s=round(promotion_s, 2),
                     firings_after=len(sent) - before, longest_gap_s=round(max(gaps), 2))  # fmt: skip
        assert beat.poll() is None, f"beat exited ({beat.returncode}): {beat_log.read_text()[-3000:]}"
        assert len(sent) - before >= 3, beat_log.read_text()[-3000:]
        assert max(gaps) <= promotion_s + 2 * EVERY_S + 3  # no firing lost beyond the failover
        assert min(gaps) >= EVERY_S / 2  # none sent twice
        # It did meet the failover: a call that failed ("Redis unreachable"), or one that waited it
        # out (a firing gap over two periods); seen both ways, by where the kill falls in a tick.
        met = "Redis unreachable" in beat_log.read_text() or max(gaps) > 2 * EVERY_S
        assert met, beat_log.read_text()[-3000:]
