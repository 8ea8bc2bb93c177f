"""A dead worker, a restarted Redis (issue 22): seconds from the disturbance to the job's completion.

Run: ``.venv/bin/python bench/dead_worker.py [--scenarios kill-restart download analysis redis pump]
[--runs 2] [--seed 1] [--give-up-s 420]`` (``bench/run.sh dead-worker ...``). It measures the checkout
it lives in, so the same command gives the figures before and after a change.

Each run is a cluster as a user runs one, with the shipped settings (nothing about visibility set): a
fresh ``redis-server`` with AOF on a free loopback port, two download workers (every queue but
``analysis``) and one analysis worker, each a plain ``celery -A tasks worker -P threads -c 8
--without-mingle --without-gossip``, and one job submitted with ``vcrawl submit``: the kit's universe
(10 hosts, 2,000 pages, ``--special-frac 0 --crawl-delay-frac 0``), politeness 0.05 s, 2 per host (the
job of the acceptance check 21-dead-worker). Undisturbed it takes about 20 s. A seeded random delay
after the submission (``--seed``, ``--min-delay-s``..``--max-delay-s``) puts the disturbance at a
different moment of the job in each run:

  kill-restart  a download worker (one of the two, at random) SIGKILLed, no replacement; Redis restarted
                2-6 s later (at random). The issue's "SIGKILL one worker mid-job, then restart Redis":
                without a replacement only a sweep of what the dead worker held can free it.
  download      a download worker SIGKILLed, a replacement (a new node name) started at once.
  analysis      the analysis worker SIGKILLed while it holds analysis messages in kombu's ``unacked``
                hash, a replacement started at once, Redis restarted 4 s later.
  redis         Redis restarted alone (SIGTERM: AOF written; 1 s down), every worker alive.
  pump          the worker whose frontier pump dispatched the newest fetch batch SIGKILLed (every worker
                pumps; the fetch message's ``origin`` header names the publishing process), a
                replacement of its role started at once.
  none          nothing (not run by default): the job's time on this machine now, for comparison.

A run counts as "not completed" when the job is not ``completed`` ``--give-up-s`` seconds after the
disturbance. Per run it prints one JSON line (seconds from the disturbance to completion, in all,
recall, pages fetched twice and robots violations from the kit's ``universe.evaluate``, the load
average); at the end a summary line per scenario. ``--out FILE`` appends the JSON lines to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))  # the project itself: its local Redis and the tasks façade
import crawl_universe  # noqa: E402  (universe start/stop, shared with the other benches)
import node_cluster as nc  # noqa: E402  (job file, scoring, the tasks façade on a cluster)

from celeryconfig import ANALYSIS_QUEUE, DOWNLOAD_QUEUE, queue_lists  # noqa: E402
from cli.local_redis import LocalRedis  # noqa: E402

SCENARIOS = ("kill-restart", "download", "analysis", "redis", "pump", "none")
DEFAULT_SCENARIOS = SCENARIOS[:-1]
CELERY = REPO / ".venv" / "bin" / "celery"
UNIVERSE = ["--special-frac", "0", "--crawl-delay-frac", "0"]  # no Retry-After or Crawl-delay tail
DELAY_S, PER_HOST = 0.05, 2  # the acceptance check's job_file delay=0.05 per_host=2
THREADS = 8
REDIS_DOWN_S = 1.0  # between the old server's exit and the new one's start, as in the acceptance check
ANALYSIS_RESTART_AFTER_S = 4.0
SLOW_S = 60.0  # the bound: complete within 60 s of the disturbance


POOL = ["-P", "threads", "-c", str(THREADS), "--without-mingle", "--without-gossip"]


class Worker:
    """One plain ``celery -A tasks worker`` in a session (process group) of its own; ``options``: its pool
    and start-up (this bench's threads by default; ``[]``: Celery's own defaults, as a user runs it)."""

    def __init__(self, name: str, queues: str, env: dict[str, str], logs: Path, options: Sequence[str] = POOL,
                 level: str = "warning") -> None:  # fmt: skip
        self.name, self.queues = name, queues
        self.node = f"{name}@{socket.gethostname()}"
        self.log = logs / f"worker-{name}.log"
        command = [str(CELERY), "-A", "tasks", "worker", "-Q", queues, *options, "-l", level, "-n", f"{name}@%h"]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.process.pid

    def sigkill(self) -> None:
        """SIGKILL the whole group at once (a worker that dies: no warm or cold shutdown)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the group, SIGKILL what is left after ``grace_s`` (the run is over)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
                self.process.wait(grace_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            pass


class Cluster:
    """Redis with AOF and the three workers of one run; the disturbances act on them."""

    def __init__(self, logs: Path, data: Path) -> None:
        self.logs = logs
        self.redis = LocalRedis(logs / "redis").start()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")}
        # Only what a user must give: where Redis and the data are, and that loopback sites are allowed.
        self.env.update(VCRAWL_REDIS_URL=self.redis.url, VCRAWL_DATA=str(data), VCRAWL_ALLOWED_NETWORKS=nc.LOOPBACK)
        self.tasks = nc.use_cluster(self.env)
        app = self.tasks.crawl.app
        queues = {q.name for q in app.conf.task_queues or []} | {app.conf.task_default_queue}
        self.download_queues = ",".join(sorted(queues - {ANALYSIS_QUEUE}))
        self.workers: dict[str, Worker] = {}
        self.client = redis.Redis.from_url(self.redis.url, socket_timeout=5)

    def start_worker(self, name: str, role: str, **options: Any) -> Worker:
        """Start ``name`` on the analysis queue (``role`` "analysis") or every other; ``options`` as ``Worker``'s."""
        queues = ANALYSIS_QUEUE if role == "analysis" else self.download_queues
        self.workers[name] = Worker(name, queues, self.env, self.logs, **options)
        return self.workers[name]

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Until every worker answers a ping (``-n`` names)."""
        waiting = {worker.node for worker in self.workers.values()}
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            if dead := [w.name for w in self.workers.values() if w.process.poll() is not None]:
                raise SystemExit(f"worker(s) {dead} exited at start; see {self.logs}")
            waiting -= self.tasks.ping_workers(sorted(waiting))
        if waiting:
            raise SystemExit(f"workers {sorted(waiting)} did not answer in {timeout_s:g} s; see {self.logs}")

    def restart_redis(self) -> None:
        """SIGTERM Redis (it writes its AOF), 1 s down, start it again on its port and directory."""
        port = self.redis.port
        self.redis.stop()
        time.sleep(REDIS_DOWN_S)
        self.redis = LocalRedis(self.logs / "redis", port=port).start()

    def held_analyses(self) -> int:
        """Analysis messages in kombu's ``unacked`` hash (only the analysis worker takes them)."""
        try:
            return sum(1 for raw in self.client.hvals("unacked") if json.loads(raw)[-1] == ANALYSIS_QUEUE)
        except redis.RedisError:
            return 0

    def newest_dispatcher(self) -> Worker | None:
        """The worker whose pump published the newest fetch message (its ``origin`` header: gen<pid>@host).

        Delivered messages wait in ``unacked`` (``unacked_index`` holds their delivery times); those
        not yet taken are in the download lists, newest first (kombu LPUSHes and BRPOPs).
        """
        by_pid = {worker.pid: worker for worker in self.workers.values() if worker.process.poll() is None}
        raws = [self.client.lindex(name, 0) for name in queue_lists(DOWNLOAD_QUEUE)]
        for tag in self.client.zrevrange("unacked_index", 0, 50):
            raws.append(self.client.hget("unacked", tag))
        for raw in raws:
            if raw is None:
                continue
            message = json.loads(raw)
            if isinstance(message, list):  # an unacked entry: [message, exchange, routing key]
                message = message[0]
            headers = message.get("headers") or {}
            if headers.get("task") != "vcrawl.fetch_batch":
                continue
            origin = str(headers.get("origin", ""))
            pid = origin.split("@", 1)[0].removeprefix("gen")
            if pid.isdigit() and int(pid) in by_pid:
                return by_pid[int(pid)]
        return None

    def stop(self) -> None:
        for worker in reversed(list(self.workers.values())):
            worker.stop()
        self.client.close()
        self.redis.stop()


class Run:
    """One job on a fresh cluster and one disturbance; ``measure`` returns its JSON row."""

    def __init__(self, scenario: str, index: int, delay_s: float, rng: random.Random, args: argparse.Namespace) -> None:
        self.scenario, self.index, self.delay_s, self.rng, self.args = scenario, index, delay_s, rng, args
        self.notes: list[str] = []

    def measure(self, state: Path, job_file: Path, work: Path) -> dict[str, Any]:
        logs = work / f"{self.scenario}-{self.index}"
        logs.mkdir(parents=True)
        data = logs / "data"
        cluster = Cluster(logs, data)
        try:
            for name, role in (("d1", "download"), ("d2", "download"), ("a1", "analysis")):
                cluster.start_worker(name, role)
            cluster.wait_ready()
            offset = nc.log_offset(state)
            t0 = time.monotonic()
            job_id = nc.vcrawl(cluster.env, "submit", str(job_file)).strip().splitlines()[-1]
            early = self._wait(cluster, job_id, t0 + self.delay_s)
            tk = time.monotonic()
            if early is None:
                self._disturb(cluster)
            else:
                self.notes.append(f"job {early} before the disturbance")
            t1, status, stall_s = self._follow(cluster, job_id, tk)
            time.sleep(1.5)  # the universe flushes its access log every second
            score = nc.evaluate(state, offset, None)
            done = status.get("state") == "completed"
            return {
                "bench": "dead_worker", "scenario": self.scenario, "run": self.index,
                "commit": _commit(), "delay_s": round(self.delay_s, 2), "job": job_id,
                "state": status.get("state"), "completed": done,
                "after_disturbance_s": round(t1 - tk, 1) if done else None,
                "total_s": round(t1 - t0, 1) if done else None, "give_up_s": self.args.give_up_s,
                "longest_stall_s": round(stall_s, 1), "pending": status.get("pending"),
                "in_flight_batches": status.get("in_flight_batches"),
                "recall": score["recall"], "fetched_twice": score["duplicate_page_fetches"],
                "robots_violations": score["robots_violations"], "requests": score["requests"],
                "loadavg": [round(x, 2) for x in os.getloadavg()], "notes": self.notes,
                "logs": str(logs),
            }  # fmt: skip
        finally:
            cluster.stop()
            shutil.rmtree(data, ignore_errors=True)
            shutil.rmtree(logs / "redis" / "appendonlydir", ignore_errors=True)  # 30 MB a run; redis.log stays

    def _wait(self, cluster: Cluster, job_id: str, until: float) -> str | None:
        """Sleep until ``until``; the job's state if it ended before (nothing left to disturb)."""
        while (left := until - time.monotonic()) > 0:
            state = _job_state(cluster, job_id)
            if state not in (None, "running"):
                return state
            time.sleep(min(0.2, left))
        return None

    def _disturb(self, cluster: Cluster) -> None:
        workers = cluster.workers
        if self.scenario == "kill-restart":
            victim = workers[self.rng.choice(("d1", "d2"))]
            gap_s = self.rng.uniform(2.0, 6.0)
            victim.sigkill()
            self.notes.append(f"SIGKILL {victim.name}, no replacement; Redis restarted {gap_s:.1f} s later")
            time.sleep(gap_s)
            cluster.restart_redis()
        elif self.scenario == "download":
            victim = workers[self.rng.choice(("d1", "d2"))]
            victim.sigkill()
            cluster.start_worker("d3", "download")
            self.notes.append(f"SIGKILL {victim.name}, d3 started")
        elif self.scenario == "analysis":
            held = _bounded(cluster.held_analyses, 30.0, 0.02)
            if not held:
                self.notes.append("the analysis worker held no analysis message for 30 s; killed anyway")
            workers["a1"].sigkill()
            cluster.start_worker("a2", "analysis")
            self.notes.append(
                f"SIGKILL a1 holding {held or 0} analysis message(s), a2 started; Redis restarted 4 s later"
            )
            time.sleep(ANALYSIS_RESTART_AFTER_S)
            cluster.restart_redis()
        elif self.scenario == "redis":
            cluster.restart_redis()
            self.notes.append("Redis restarted, every worker alive")
        elif self.scenario == "none":
            self.notes.append("undisturbed: the time is counted from the moment a disturbance would come")
        elif self.scenario == "pump":
            victim = _bounded(cluster.newest_dispatcher, 10.0, 0.02)
            if victim is None:
                victim = workers["d1"]
                self.notes.append("no fetch message seen for 10 s; killed d1")
            role = "analysis" if victim.queues == ANALYSIS_QUEUE else "download"
            victim.sigkill()
            cluster.start_worker(f"{victim.name}r", role)
            self.notes.append(
                f"SIGKILL {victim.name} (its pump dispatched the newest fetch batch), {victim.name}r started"
            )

    def _follow(self, cluster: Cluster, job_id: str, tk: float) -> tuple[float, dict[str, Any], float]:
        """``follow_job``: on a loaded machine the time to completion is mostly the rest of the job; the
        stall is what the disturbance itself held up."""
        return follow_job(lambda: _job_status(cluster, job_id), tk, self.args.give_up_s, poll_s=0.5)


def follow_job(
    status_of: Callable[[], dict[str, Any] | None], since: float, give_up_s: float, poll_s: float
) -> tuple[float, dict[str, Any], float]:
    """Poll a job's status until it is no longer running or ``give_up_s`` after ``since`` (monotonic).

    Returns (time, status, longest stall): a stall is a stretch after ``since`` in which no page was
    stored and no analysis finished.
    """
    progress: tuple[Any, ...] | None = None
    last_change, stall_s = since, 0.0
    status: dict[str, Any] | None = None
    while time.monotonic() - since < give_up_s:
        status = status_of()
        now = time.monotonic()
        if status is not None:
            seen = (status.get("pages_stored"), status.get("analysed"))
            if seen != progress:
                stall_s = max(stall_s, now - last_change)
                progress, last_change = seen, now
            if status.get("state") != "running":
                break
        time.sleep(poll_s)
    t1 = time.monotonic()
    return t1, status or {"state": "unknown (no status)"}, max(stall_s, t1 - last_change)


def _job_state(cluster: Cluster, job_id: str) -> str | None:
    try:
        return cluster.tasks.job_state(job_id)
    except Exception:  # Redis restarting: ask again on the next poll
        return None


def _job_status(cluster: Cluster, job_id: str) -> dict[str, Any] | None:
    try:
        return cluster.tasks.job_status(job_id)
    except Exception:  # Redis restarting: ask again on the next poll
        return None


def _bounded(probe: Any, timeout_s: float, every_s: float) -> Any:
    """``probe()`` until it answers something true, for at most ``timeout_s``; its last answer."""
    deadline = time.monotonic() + timeout_s
    answer = probe()
    while not answer and time.monotonic() < deadline:
        time.sleep(every_s)
        answer = probe()
    return answer


def _commit() -> str:
    done = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return done.stdout.strip()


def summary(rows: list[dict[str, Any]], scenario: str) -> str:
    """One line: completion times after the disturbance (min/median/max), how many over 60 s or never."""
    mine = [row for row in rows if row["scenario"] == scenario]
    times = sorted(row["after_disturbance_s"] for row in mine if row["completed"])
    failed = len(mine) - len(times)
    slow = sum(1 for t in times if t > SLOW_S) + failed
    spread = (
        f"min {times[0]} / median {statistics.median(times):.1f} / max {times[-1]} s" if times else "none completed"
    )
    give_up = max((row["give_up_s"] for row in mine), default=0)
    recall = min(row["recall"] for row in mine)
    twice = max(row["fetched_twice"] for row in mine)
    robots = sum(row["robots_violations"] for row in mine)
    stalls = [row["longest_stall_s"] for row in mine if row.get("longest_stall_s") is not None]
    stall = f"; longest stall max {max(stalls)} s" if stalls else ""
    return (
        f"{scenario}: {len(mine)} runs, completed after the disturbance: {spread}; over {SLOW_S:g} s: {slow}"
        f" (not within {give_up:g} s: {failed}); recall min {recall}, fetched twice max {twice}, "
        f"robots violations {robots}{stall}"
    )


def main() -> int:
    """Start the universe, run each scenario ``--runs`` times (interleaved), print rows and a summary."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(DEFAULT_SCENARIOS))
    parser.add_argument("--runs", type=int, default=2, help="runs of each scenario")
    parser.add_argument("--seed", type=int, default=1, help="seed of the disturbance moments")
    parser.add_argument("--give-up-s", type=float, default=420.0, help="a run not completed this long after the "
                        "disturbance counts as not completed")  # fmt: skip
    parser.add_argument("--min-delay-s", type=float, default=3.0, help="earliest disturbance after the submission")
    parser.add_argument("--max-delay-s", type=float, default=13.0, help="latest disturbance after the submission")
    parser.add_argument(
        "--port", type=int, default=18823, help="the universe's port (its files are generated once per port)"
    )
    parser.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (worker and Redis logs)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vcrawl-dead-worker-"))
    state = work / "state.json"
    site = SimpleNamespace(hosts=10, pages=2000, latency_ms=0.0, jitter_ms=0.0)
    server = crawl_universe.start_universe(site, state, work, [*UNIVERSE, "--port", str(args.port)])  # type: ignore[arg-type]
    rows: list[dict[str, Any]] = []
    try:
        manifest = json.loads(Path(json.loads(state.read_text())["manifest"]).read_text())
        job_file = work / "job.json"
        job_file.write_text(json.dumps(nc.job_for(manifest, DELAY_S, PER_HOST)))
        rng = random.Random(args.seed)
        for index in range(args.runs):  # interleaved, so each scenario meets the machine at several moments
            for scenario in args.scenarios:
                delay_s = rng.uniform(args.min_delay_s, args.max_delay_s)
                row = Run(scenario, index, delay_s, rng, args).measure(state, job_file, work)
                line = json.dumps(row)
                rows.append(row)
                print(line, flush=True)
                if args.out is not None:
                    with open(args.out, "a") as out:
                        out.write(line + "\n")
        for scenario in args.scenarios:
            print(summary(rows, scenario), flush=True)
        return 0
    finally:
        crawl_universe.stop_universe(server)
        # The logs of a run that did not complete are what its diagnosis needs.
        if args.keep or not rows or not all(row["completed"] for row in rows):
            print(f"logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
