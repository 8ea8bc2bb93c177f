"""Redis behind Sentinel loses its primary mid-crawl: the replica is promoted and nothing is lost.

Real processes on loopback (tests/sentinel_cluster.py): a Redis primary, one replica and three
Sentinels (quorum 2, down-after 2 s); two `celery worker` processes crawl local sites on distinct
hosts with politeness; the primary is SIGKILLed at ~30 % of the pages. The job must complete by
itself with exactly the pages of an undisturbed run, every page stored, robots.txt obeyed and no
per-host gap below the interval (server-side arrival times). Beat, Flower and the job API must
go on across a failover too. vcrawl runs with its shipped settings (only the data folder and the
Sentinel addresses are set): the timeouts a failover meets are the ones users run.

Each test notes its figures in the fault report (tests/faults/conftest.py): seconds without a
page fetched after the kill, the promotion's seconds, pages fetched twice, pages lost.
"""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
import yaml

from engine.status import job_status
from frontier import Frontier
from storage.naming import job_page_location
from tests.cluster import REPO, cluster_env, stop_worker
from tests.faults.test_faults import page, start_job
from tests.sentinel_cluster import SentinelCluster, start_sentinel_worker
from tests.site import NOT_PAGES, Response, TestSite
from vcrawl.settings import Settings

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


def judge(crawl: Crawl, status: dict[str, Any], kills: list[float], note: Note, failovers: int) -> None:
    """Note the figures of the run, then check it against an undisturbed run."""
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
    gaps = [
        later - earlier
        for site in crawl.sites
        for earlier, later in itertools.pairwise(sorted(s.at for s in site.seen))  # robots.txt and sitemap too
    ]
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
    assert min(gaps) >= INTERVAL_S, sorted(gaps)[:5]
    # Politeness 1 per host: at most one page per host in flight when a primary goes.
    assert twice <= len(crawl.sites) * failovers, {base: c.most_common(2) for base, c in seen.items()}


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
        replaced = crawl.cluster.failover()
        back, failback_s = crawl.cluster.wait_promotion(replaced, PROMOTION_LIMIT_S)
        fault_report(fault="primary SIGKILLed at 30 %, brought back as a replica, then SENTINEL FAILOVER back",
                     promotion_s=round(promotion_s, 2), failback_s=round(failback_s, 2),
                     failback_at_pages=back_at_pages, failed_back_to_old=back == old)  # fmt: skip
        status = finish(crawl, kills)
    judge(crawl, status, kills, fault_report, failovers=2)


# ---- beat, Flower and the job API across a failover ------------------------------------------------

EVERY_S = 2.0
TOKEN = "failover-test-token-0123"
FLOWER_AUTH = ("ops", "failover-pass")
ANSWER_SLACK_S = 3.0  # after the promotion: a poll period, a client timeout and a reconnect


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Prober:
    """Polls HTTP checks in a thread and keeps (asked, answered, ok, detail) per check."""

    def __init__(self, checks: dict[str, Callable[[requests.Session], bool]]) -> None:
        self.checks = checks
        self.results: dict[str, list[tuple[float, float, bool, str]]] = {name: [] for name in checks}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="failover-prober", daemon=True)

    def _run(self) -> None:
        with requests.Session() as http:
            http.trust_env = False  # loopback only
            while not self._stop.is_set():
                for name, check in self.checks.items():
                    asked = time.monotonic()
                    try:
                        ok, detail = check(http), ""
                    except (requests.RequestException, ValueError, KeyError) as error:  # no answer, or a wrong one
                        ok, detail = False, f"{type(error).__name__}: {error}"[:200]
                    self.results[name].append((asked, time.monotonic(), ok, detail))
                self._stop.wait(0.25)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def outage(self, name: str, since: float) -> tuple[float, str]:
        """The longest stretch from ``since`` on without a good answer received (a slow answer counts
        from when it came), and why the last request that failed after ``since`` failed."""
        good = [answered for _, answered, ok, _ in self.results[name] if ok and answered >= since]
        why = [detail for asked, _, ok, detail in self.results[name] if asked >= since and not ok]
        return max((b - a for a, b in itertools.pairwise([since, *good])), default=0.0), (why or [""])[-1]

    def answered_after(self, name: str, at: float) -> bool:
        return any(ok for asked, _, ok, _ in self.results[name] if asked > at)


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, *command], env=env, cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process we started (by PID), SIGKILL after 10 s, and reap it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.2)


def test_beat_flower_and_the_job_api_go_on_across_a_failover(tmp_path: Path, fault_report: Note) -> None:
    with ExitStack() as stack:
        cluster = stack.enter_context(SentinelCluster(tmp_path / "ha"))
        site = stack.enter_context(TestSite(HOSTS[0]))
        site.add_page("/", page("/a"))
        site.add_page("/a", page())
        schedules = tmp_path / "schedules.yaml"
        news = {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0},
                "revisit": {"initial_s": 0, "min_s": 0, "max_s": 0}}  # fmt: skip
        schedules.write_text(yaml.safe_dump({"schedules": [{"name": "news", "every": EVERY_S, "job": news}]}))
        env = cluster_env(sentinel_settings(cluster, tmp_path / "data", schedules_file=str(schedules)))
        worker = start_sentinel_worker(env, "services", tmp_path / "worker.log", concurrency=4)
        stack.callback(stop_worker, worker)
        flower_port, api_port = _free_port(), _free_port()
        flower_env = {**env, "FLOWER_BASIC_AUTH": ":".join(FLOWER_AUTH)}
        beat = _start(["-m", "celery", "-A", "tasks", "beat", "-l", "INFO", "--schedule", str(tmp_path / "beat.db")],
                      env, tmp_path / "beat.log")  # fmt: skip
        for process in (
            beat,
            _start(["-m", "cli", "flower", "--port", str(flower_port)], flower_env, tmp_path / "flower.log"),
            _start(["-m", "cli", "serve", "--port", str(api_port)], {**env, "VCRAWL_API_TOKEN": TOKEN},
                   tmp_path / "api.log"),
        ):  # fmt: skip
            stack.callback(_stop, process)
        flower, api = f"http://127.0.0.1:{flower_port}", f"http://127.0.0.1:{api_port}"

        def flower_lists_the_worker(http: requests.Session) -> bool:
            answer = http.get(f"{flower}/api/workers", params={"refresh": "1"}, auth=FLOWER_AUTH, timeout=3)
            return answer.status_code == 200 and any(name.startswith("services@") for name in answer.json())

        def api_shows_the_job(http: requests.Session) -> bool:
            answer = http.get(f"{api}/api/jobs/news", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=3)
            return answer.status_code == 200 and answer.json()["job"] == "news"

        def flower_reads_the_queues(http: requests.Session) -> bool:  # from the broker, through Sentinel
            answer = http.get(f"{flower}/api/queues/length", auth=FLOWER_AUTH, timeout=3)
            return answer.status_code == 200 and "active_queues" in answer.json()

        probes = {"flower": flower_lists_the_worker, "flower_queues": flower_reads_the_queues, "api": api_shows_the_job}
        with Prober(probes) as prober:

            def cycles() -> list[dict[str, Any]]:
                try:
                    with cluster.master_client() as client:
                        status = job_status(Frontier(client), "news")
                except redis.RedisError:
                    return []
                return [] if status is None else status["cycles"]

            _wait_for("two cycles of the schedule", lambda: len(cycles()) >= 2, 40)
            _wait_for("Flower and the API answer", lambda: all(prober.answered_after(n, 0) for n in prober.checks), 30)
            killed_at = time.monotonic()
            old = cluster.kill_primary()
            _, promotion_s = cluster.wait_promotion(old, PROMOTION_LIMIT_S)
            fault_report(fault="primary SIGKILLed under beat (RedBeat), Flower and the job API",
                         promotion_s=round(promotion_s, 2))  # fmt: skip
            promoted_at = killed_at + promotion_s
            before = len(site.requests_to("/"))
            deadline = time.monotonic() + 6 * EVERY_S + 15
            while len(site.requests_to("/")) < before + 3 and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1.0)  # the answers after the last firing
        beat_exit = beat.poll()
        done = cycles()
        firings = [seen.at for seen in site.requests_to("/")]
        firing_gaps = [b - a for a, b in itertools.pairwise(firings)]
        beat_log = (tmp_path / "beat.log").read_text(errors="replace").splitlines()
        beat_error = next((line for line in reversed(beat_log) if "CRITICAL" in line), "")
        fault_report(firings_before_kill=before, firings_after_kill=len(firings) - before, cycles=len(done),
                     beat_exit_code=beat_exit, beat_error=beat_error[:300],
                     min_firing_gap_s=round(min(firing_gaps, default=0), 2),
                     max_firing_gap_s=round(max(firing_gaps, default=0), 2),
                     **{f"{n}_unanswered_s": round(prober.outage(n, killed_at)[0], 2) for n in probes})  # fmt: skip
    numbers = [cycle["cycle"] for cycle in done]
    checks = {  # every verdict at once: one failing part does not hide another
        # Beat goes on: the same beat process fires at least three times after the failover ...
        f"beat exited ({beat_exit}) across the failover: {beat_error}": beat_exit is None,
        f"{len(firings) - before} firings after the failover, not 3": len(firings) - before >= 3,
        f"a firing lost: gaps {firing_gaps}": max(firing_gaps) <= promotion_s + 2 * EVERY_S + 3,
        # ... exactly once: each firing one cycle (the page "/" fetched once per cycle), none twice.
        f"a cycle number twice: {numbers}": len(numbers) == len(set(numbers)),
        f"a firing sent twice: gaps {firing_gaps}": min(firing_gaps) >= EVERY_S / 2,
        f"{len(firings)} firings but {len(done)} cycles": len(firings) == len(done),
    }
    for name in prober.checks:  # Flower and the API answer again once the failover is done
        out, why = prober.outage(name, killed_at)
        checks[f"{name} unanswered {out:.1f}s after the kill (promotion {promotion_s:.1f}s): {why}"] = (
            prober.answered_after(name, promoted_at) and out <= promotion_s + ANSWER_SLACK_S
        )
    assert all(checks.values()), [problem for problem, ok in checks.items() if not ok]
