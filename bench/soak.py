"""Soak: many concurrent crawl jobs over the shared synthetic web for a fixed time (issue 8, "Load").

One script past ~500 lines on purpose: a benchmark is read and run as one file (cluster set-up,
the job loop, sampling and the report); nothing of it is imported elsewhere.

Run: ``.venv/bin/python bench/soak.py [--duration 600] [--jobs 20] [--workers 2] [--threads 16]``
(``make soak`` runs it with the defaults). Loopback only, bounded in time, and it stops only
what it started (by PID).

What it does:
- Serves a universe (../shared/bench/universe.py, nginx) on its own port (default 8871, so a
  ``make bench`` on 8800 is not disturbed), starts a private redis-server (LocalRedis) and
  ``--workers`` worker processes x ``--threads`` threads (LocalWorkers), as ``vcrawl crawl`` does.
- Keeps ``--jobs`` jobs running at once. Every job crawls the whole universe under its own id
  (politeness ``--delay`` per host, kept per job; one try plus one retry), so every job has the
  manifest's reachable pages as its ground truth. The first jobs start over a short ramp (at
  most 30 s); after that, each job that ends is replaced at once until ``--duration`` is used up;
  then the running jobs drain (bounded by ``--timeout``). The universe is sized (``--pages``
  auto) so one job lasts about a sixth of the duration under full load: the load is steady and
  the soak also churns through many job starts and ends.
- Every ``--sample-s``: pages fetched per second (sum of the jobs' counters in Redis), requests
  per second the server logged, RSS of each worker's process tree (/proc VmRSS, children
  included), Redis ``used_memory`` / ``used_memory_rss`` / keys / AOF size, the download queue.
- When a job ends: its state, and its recall checked on its own storage: for every URL of the
  manifest's ``reachable_pages``, the file at ``jobs/<job>/pages/...`` must exist with the size of
  the universe's file. Then its pages are deleted (tmpfs stays bounded; ``--keep-pages`` keeps them).
- At the end: the server-side check over all jobs (``universe.py evaluate``: robots violations,
  and 200 page fetches = jobs x reachable pages when every job is complete), the Redis key groups
  left behind, and the RSS verdict: median RSS of the first and the last window (60 s, or a
  quarter of a shorter run) per worker; growth beyond ``--rss-bound-pct`` or ``--rss-bound-mib``
  is flagged (printed, not asserted). A table over time on stdout, the time series as JSON
  (path printed), and one JSON line last. Exit 1 if a job did not complete with full recall.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.append(str(HERE))  # after the project: bench/storage.py must not shadow storage/

from crawl_universe import BENCH_PY, SHARED, start_universe, stop_universe  # noqa: E402

import tasks  # noqa: E402
from celeryconfig import DOWNLOAD_QUEUE, queue_lists  # noqa: E402
from cli.cluster import LocalWorkers  # noqa: E402
from cli.local_redis import LocalRedis  # noqa: E402
from storage import page_location  # noqa: E402
from vcrawl.settings import Settings  # noqa: E402

LOOPBACK = "127.0.0.0/8"
_ASSUMED_PAGES_PER_S = 100.0  # only to size the universe (--pages auto); the run measures the real rate
_POLL_S = 1.0
_MIB = 1024 * 1024


@dataclass
class JobRun:
    """One job of the soak: when it started and ended (seconds since the soak began), what it did."""

    id: str
    started_s: float
    ended_s: float | None = None
    status: dict[str, Any] = field(default_factory=dict)
    check: dict[str, Any] = field(default_factory=dict)


def main() -> int:
    """Serve the universe, run the soak, print the table and the JSON line."""
    args = _parse_args()
    signal.signal(signal.SIGTERM, _interrupt)  # a SIGTERM stops everything we started, as Ctrl-C does
    if _is_listening("127.0.1.1", args.port):
        raise SystemExit(f"something already listens on 127.0.1.1:{args.port}; pick another --port")
    work = Path(tempfile.mkdtemp(prefix="vcrawl-soak-"))
    data = Path("/dev/shm") / f"vcrawl-soak-{os.getpid()}"
    state = work / "state.json"
    args.latency_ms = args.jitter_ms = 0.0
    server = start_universe(args, state, work, extra=["--port", str(args.port), "--engine", "nginx"])
    try:
        served = json.loads(state.read_text())
        with ExitStack() as stack:
            local = stack.enter_context(LocalRedis(work / "redis"))
            # VCRAWL_ALLOWED_NETWORKS: the cluster-wide SSRF guard lets workers reach the loopback universe.
            soak_env = {"VCRAWL_REDIS_URL": local.url, "VCRAWL_DATA": str(data), "VCRAWL_ALLOWED_NETWORKS": LOOPBACK}
            settings = Settings.from_env(soak_env)
            tasks.configure(settings)
            env = {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")} | settings.to_env() | soak_env
            workers = stack.enter_context(
                LocalWorkers(args.workers, args.threads, env, work / "logs", tasks.ping_workers)
            )
            soak = Soak(args, served, data, workers.pids)
            report = soak.run()
            report["samples"], report["jobs"] = soak.samples, soak.job_rows()
            report["redis_key_groups_end"] = _redis_key_groups(tasks.deps.redis_client())
        report["server_check"] = soak.server_check()
        return _report(args, report, work)
    finally:
        stop_universe(server)
        _kill_if_alive(json.loads(state.read_text()).get("nginx_pid") if state.exists() else None)
        shutil.rmtree(work / "redis", ignore_errors=True)  # its AOF; the worker logs stay in work/
        if not args.keep_pages:
            shutil.rmtree(data, ignore_errors=True)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds during which jobs are started")
    parser.add_argument("--jobs", type=int, default=20, help="jobs running at once")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--threads", type=int, default=16, help="threads per worker process")
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--pages", type=int, default=0, help="universe pages (0: sized from --duration and --jobs)")
    parser.add_argument("--port", type=int, default=8871, help="universe port (not the kit's 8800)")
    parser.add_argument("--delay", type=float, default=0.05, help="per-host interval of each job (0: politeness off)")
    parser.add_argument("--per-host", type=int, default=8, help="parallel fetches per host when --delay is 0")
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=0.0, help="hard stop (0: 2 x duration + 120 s)")
    parser.add_argument("--rss-bound-pct", type=float, default=25.0, help="flag RSS growth beyond this percentage")
    parser.add_argument("--rss-bound-mib", type=float, default=100.0, help="flag RSS growth beyond this many MiB")
    parser.add_argument("--keep-pages", action="store_true", help="keep every job's pages in /dev/shm")
    parser.add_argument("--out", type=Path, help="time series JSON (default /tmp/vcrawl-soak-<time>.json)")
    args = parser.parse_args()
    if args.pages <= 0:
        per_job = _ASSUMED_PAGES_PER_S * args.duration / (6 * args.jobs)
        args.pages = int(min(6000, max(200, round(per_job, -2))))
    args.timeout = args.timeout or 2 * args.duration + 120
    args.out = args.out or Path(f"/tmp/vcrawl-soak-{time.strftime('%Y%m%d-%H%M%S')}.json")
    return args


class Soak:
    """Keeps ``jobs`` jobs running until the duration is used up, sampling as it goes."""

    def __init__(self, args: argparse.Namespace, served: dict[str, Any], data: Path, worker_pids: list[int]) -> None:
        self.args, self.data, self.worker_pids = args, data, worker_pids
        self.manifest = json.loads(Path(served["manifest"]).read_text())
        self.manifest_path, self.log_path = served["manifest"], Path(served["log"])
        self.expected = _expected_files(self.manifest["reachable_pages"], Path(served["dir"]) / "site")
        self.redis = tasks.deps.redis_client()
        self.jobs: list[JobRun] = []
        self.samples: list[dict[str, Any]] = []
        self.log_offset = 0
        self.began = 0.0
        self.timed_out = False
        self._last: tuple[float, int, int] = (0.0, 0, 0)  # time, pages fetched, log size

    def run(self) -> dict[str, Any]:
        """Start, replace and drain jobs; return the run's summary."""
        args = self.args
        self.log_offset = self.log_path.stat().st_size
        self.began = time.monotonic()
        self._last = (0.0, 0, self.log_offset)
        self._sample()  # idle baseline: workers up, no job yet
        ramp_step_s = min(30.0, args.duration / 10) / args.jobs
        next_sample = args.sample_s
        for _ in range(int(args.timeout / _POLL_S) + args.jobs + 10):  # each round sleeps (ramp: shorter)
            now = self._now()
            if now > args.timeout:
                self._cancel_running()
                break
            self._poll()
            running = sum(job.ended_s is None for job in self.jobs)
            for _ in range(args.jobs - running if now < args.duration else 0):
                if len(self.jobs) < args.jobs and now < len(self.jobs) * ramp_step_s:
                    break  # the first jobs start one by one over the ramp
                self._start_job()
                running += 1
            if not running and now >= args.duration:
                break
            in_ramp = len(self.jobs) < args.jobs
            if now >= next_sample:
                self._sample()
                next_sample += args.sample_s
            time.sleep(_POLL_S if not in_ramp else min(_POLL_S, ramp_step_s))
        if any(job.ended_s is None for job in self.jobs):
            self._cancel_running()
        self._sample()
        return self._summary()

    def _now(self) -> float:
        return time.monotonic() - self.began

    def _start_job(self) -> None:
        job_id = f"soak-{os.getpid()}-{len(self.jobs):03d}"
        tasks.start_job(_job_spec(self.manifest, job_id, self.args))
        self.jobs.append(JobRun(job_id, self._now()))

    def _poll(self) -> None:
        """Refresh running jobs; check and clean up the ones that ended."""
        for job in self.jobs:
            if job.ended_s is not None:
                continue
            job.status = tasks.job_status(job.id) or {}
            if job.status.get("state") not in ("running", "paused"):
                job.ended_s = self._now()
                job.check = _check_storage(self.data, job.id, self.expected)
                if not self.args.keep_pages:
                    shutil.rmtree(self.data / "jobs" / job.id, ignore_errors=True)

    def _cancel_running(self) -> None:
        self.timed_out = True
        running = [job for job in self.jobs if job.ended_s is None]
        for job in running:
            tasks.cancel_job(job.id)
        deadline = time.monotonic() + 15
        while any(job.ended_s is None for job in running) and time.monotonic() < deadline:
            self._poll()
            time.sleep(0.5)

    def _sample(self) -> None:
        now = self._now()
        fetched = sum(job.status.get("pages_fetched", 0) for job in self.jobs)
        log_size = self.log_path.stat().st_size
        last_t, last_fetched, last_log = self._last
        dt = max(now - last_t, 1e-6)
        kids = _children_map()
        memory, persistence = self.redis.info("memory"), self.redis.info("persistence")
        sample = {
            "t_s": round(now, 1),
            "running": sum(job.ended_s is None for job in self.jobs),
            "ended": sum(job.ended_s is not None for job in self.jobs),
            "pages_fetched": fetched,
            "pages_per_s": round((fetched - last_fetched) / dt, 1) if now > 0 else 0.0,
            "requests_per_s": round(_count_lines(self.log_path, last_log, log_size) / dt, 1) if now > 0 else 0.0,
            "worker_rss_mib": [round(_tree_rss_kib(pid, kids) / 1024, 1) for pid in self.worker_pids],
            "workers_alive": sum(_is_alive(pid) for pid in self.worker_pids),
            "redis_used_mib": round(memory["used_memory"] / _MIB, 2),
            "redis_rss_mib": round(memory["used_memory_rss"] / _MIB, 2),
            "redis_keys": self.redis.dbsize(),
            "aof_mib": round(persistence.get("aof_current_size", 0) / _MIB, 2),
            "download_queue": sum(self.redis.llen(key) for key in queue_lists(DOWNLOAD_QUEUE)),
            "load1": float(Path("/proc/loadavg").read_text().split()[0]),
        }
        self.samples.append(sample)
        self._last = (now, fetched, log_size)
        _print_row(sample, header=len(self.samples) == 1)

    def _summary(self) -> dict[str, Any]:
        loaded = [s for s in self.samples if 0 < s["t_s"] and s["running"]]
        rates = sorted(s["pages_per_s"] for s in loaded)
        wall = self.samples[-1]["t_s"]
        completed = [j for j in self.jobs if j.status.get("state") == "completed"]
        full = [j for j in completed if j.check.get("recall") == 1.0 and not j.check.get("size_mismatch")]
        job_walls = [j.ended_s - j.started_s for j in self.jobs if j.ended_s is not None]
        return {
            "wall_s": wall,
            "jobs_started": len(self.jobs),
            "jobs_completed": len(completed),
            "jobs_complete_with_full_recall": len(full),
            "timed_out": self.timed_out,
            "recall_min": min((j.check.get("recall", 0.0) for j in self.jobs), default=None),
            "job_wall_s_median": round(statistics.median(job_walls), 1) if job_walls else None,
            "pages_fetched": self.samples[-1]["pages_fetched"],
            "pages_per_s_overall": round(self.samples[-1]["pages_fetched"] / max(wall, 1e-6), 1),
            "pages_per_s_samples": _quantiles(rates),
            "rss": _rss_verdict(self.samples, self.args.rss_bound_pct, self.args.rss_bound_mib),
            "redis": _redis_summary(self.samples, max(1, len(self.jobs))),
            "reachable_pages": len(self.expected),
        }

    def server_check(self) -> dict[str, Any]:
        """Score the whole soak from the server's access log (after its 1 s flush)."""
        time.sleep(1.3)
        command = [
            BENCH_PY,
            str(SHARED / "universe.py"),
            "evaluate",
            "--manifest",
            self.manifest_path,
            "--log",
            str(self.log_path),
            "--offset",
            str(self.log_offset),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
        scored = json.loads(done.stdout.strip().splitlines()[-1])
        fetches = scored["reachable_fetched"] + scored["duplicate_page_fetches"] + scored["js_only_fetched"]
        complete = sum(j.status.get("state") == "completed" for j in self.jobs)
        return {
            "requests": scored["requests"],
            "robots_violations": scored["robots_violations"],
            "page_fetches_200": fetches,
            "expected_if_each_job_fetches_each_page_once": complete * scored["reachable_pages"],
            "distinct_reachable_fetched": scored["reachable_fetched"],
            "status_counts": scored["status_counts"],
        }

    def job_rows(self) -> list[dict[str, Any]]:
        """Per job: state, timing, counters and the storage check."""
        keys = ("state", "pages_fetched", "pages_stored", "failed", "robots_blocked", "retries", "admitted")
        return [
            {
                "job": j.id,
                "started_s": round(j.started_s, 1),
                "ended_s": j.ended_s and round(j.ended_s, 1),
                **{k: j.status.get(k) for k in keys},
                **j.check,
            }
            for j in self.jobs
        ]


def _job_spec(manifest: dict[str, Any], job_id: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "id": job_id,
        "seeds": manifest["seeds"],
        "max_depth": 1000,
        "max_pages": 10 * len(manifest["reachable_pages"]) + 1000,
        "politeness": {
            "min_interval_s": args.delay,
            "jitter": 0.0,
            "per_host": args.per_host if args.delay == 0 else 1,
        },
        "limits": {"retries": 1},  # the universe's 429/503 traps never recover
        "allowed_networks": [LOOPBACK],  # and never leave loopback
    }


def _expected_files(urls: list[str], site: Path) -> list[tuple[str, int]]:
    """(storage location under a job, size of the universe's file) per reachable URL."""
    expected = []
    for url in urls:
        parts = urlsplit(url)
        path = parts.path.lstrip("/")
        if not path or path.endswith("/"):
            path += "index.html"
        expected.append((page_location(url), (site / (parts.hostname or "") / path).stat().st_size))
    return expected


def _check_storage(data: Path, job_id: str, expected: list[tuple[str, int]]) -> dict[str, Any]:
    """The job's recall from what it stored: files present, with the served file's size."""
    root = data / "jobs" / job_id
    found = mismatched = 0
    for location, size in expected:
        try:
            stored = (root / location).stat().st_size
        except OSError:
            continue
        found += 1
        mismatched += stored != size
    files = sum(len(names) for _, _, names in os.walk(root / "pages"))
    return {
        "recall": round(found / len(expected), 4),
        "missing": len(expected) - found,
        "size_mismatch": mismatched,
        "files": files,
    }


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    return kids


def _tree_rss_kib(root: int, kids: dict[int, list[int]]) -> int:
    """VmRSS of ``root`` and all its descendants, in KiB."""
    total, todo, seen = 0, [root], set()
    while todo and len(seen) < 1000:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo += kids.get(pid, [])
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        total += int(match.group(1)) if match else 0
    return total


def _is_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _count_lines(path: Path, start: int, end: int) -> int:
    with open(path, "rb") as log:
        log.seek(start)
        return log.read(max(0, end - start)).count(b"\n")


def _quantiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    at = [values[min(len(values) - 1, int(q * len(values)))] for q in (0.1, 0.5, 0.9)]
    return {"p10": at[0], "p50": at[1], "p90": at[2], "max": values[-1]}


def _windows(samples: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """The first and the last window of the samples after the idle baseline (60 s, or a quarter of the run)."""
    loaded = [s for s in samples if s["t_s"] > 0]
    end = loaded[-1]["t_s"] if loaded else 0.0
    window = min(60.0, end / 4)
    return [s for s in loaded if s["t_s"] <= window], [s for s in loaded if s["t_s"] >= end - window], window


def _rss_verdict(samples: list[dict[str, Any]], bound_pct: float, bound_mib: float) -> dict[str, Any]:
    first, last, window = _windows(samples)
    if not first or not last:
        return {"verdict": "not enough samples"}
    workers = []
    for index in range(len(samples[0]["worker_rss_mib"])):
        before = statistics.median(s["worker_rss_mib"][index] for s in first)
        after = statistics.median(s["worker_rss_mib"][index] for s in last)
        growth = after - before
        flagged = growth > bound_mib or growth > before * bound_pct / 100
        workers.append(
            {
                "first_mib": before,
                "last_mib": after,
                "growth_mib": round(growth, 1),
                "growth_pct": round(100 * growth / max(before, 1e-6), 1),
                "flagged": flagged,
            }
        )
    totals = [(s["t_s"] / 60, sum(s["worker_rss_mib"])) for s in samples if s["t_s"] > window]
    flagged = [i for i, w in enumerate(workers) if w["flagged"]]
    text = (
        f"GROWTH beyond +{bound_pct:g} % or +{bound_mib:g} MiB in worker(s) {flagged}"
        if flagged
        else f"OK: no worker grew beyond +{bound_pct:g} % or +{bound_mib:g} MiB"
    )
    return {
        "verdict": text,
        "window_s": round(window, 1),
        "workers": workers,
        "idle_mib": samples[0]["worker_rss_mib"],
        "max_total_mib": max(sum(s["worker_rss_mib"]) for s in samples),
        "slope_mib_per_min_after_first_window": _slope(totals),
    }


def _slope(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    var = sum((x - mean_x) ** 2 for x, _ in points)
    return round(sum((x - mean_x) * (y - mean_y) for x, y in points) / var, 2) if var else None


def _redis_summary(samples: list[dict[str, Any]], jobs: int) -> dict[str, Any]:
    start, end = samples[0], samples[-1]
    return {
        "used_mib_start": start["redis_used_mib"],
        "used_mib_end": end["redis_used_mib"],
        "used_mib_max": max(s["redis_used_mib"] for s in samples),
        "rss_mib_max": max(s["redis_rss_mib"] for s in samples),
        "used_kib_left_per_job": round((end["redis_used_mib"] - start["redis_used_mib"]) * 1024 / jobs, 1),
        "keys_end": end["redis_keys"],
        "aof_mib_end": end["aof_mib"],
    }


def _redis_key_groups(client: Any, limit: int = 200_000) -> dict[str, list[int]]:
    """Key pattern -> [keys, bytes (MEMORY USAGE)], job ids and per-host parts folded."""
    groups: dict[str, list[int]] = {}
    batch: list[str] = []

    def flush() -> None:
        pipe = client.pipeline(transaction=False)
        for key in batch:
            pipe.memory_usage(key, samples=0)
        for key, used in zip(batch, pipe.execute(), strict=True):
            pattern = re.sub(r"\{[^}]*\}", "{job}", key)
            pattern = re.sub(r":(q|stats|bloom|robots|task|gate|free|busy):.*", r":\1:*", pattern)
            pattern = re.sub(r"^(celery-task-meta-|_kombu\.binding\.).*", r"\1*", pattern)
            group = groups.setdefault(pattern, [0, 0])
            group[0] += 1
            group[1] += int(used or 0)
        batch.clear()

    for count, key in enumerate(client.scan_iter(count=1000)):
        if count >= limit:
            break
        batch.append(key)
        if len(batch) >= 500:
            flush()
    if batch:
        flush()
    return dict(sorted(groups.items(), key=lambda item: -item[1][1]))


_COLUMNS = (
    ("t_s", "t s", 6),
    ("running", "run", 4),
    ("ended", "ended", 5),
    ("pages_per_s", "pages/s", 8),
    ("requests_per_s", "req/s", 7),
    ("worker_rss_mib", "worker RSS MiB", 16),
    ("redis_used_mib", "redis MiB", 9),
    ("redis_rss_mib", "redis RSS", 9),
    ("redis_keys", "keys", 6),
    ("download_queue", "queue", 6),
    ("load1", "load1", 5),
)


def _print_row(sample: dict[str, Any], header: bool) -> None:
    if header:
        print(" ".join(f"{title:>{width}}" for _, title, width in _COLUMNS), flush=True)
    cells = []
    for key, _, width in _COLUMNS:
        value = sample[key]
        text = "/".join(f"{v:.0f}" for v in value) if isinstance(value, list) else f"{value:g}"
        cells.append(f"{text:>{width}}")
    print(" ".join(cells), flush=True)


def _report(args: argparse.Namespace, report: dict[str, Any], work: Path) -> int:
    soak_args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    server = report["server_check"]
    print(f"\n{'job':>22} {'start s':>7} {'end s':>7} {'state':>9} {'stored':>6} {'recall':>6} {'missing':>7} failed")
    for job in report["jobs"]:
        failed = ",".join(f"{reason}:{n}" for reason, n in sorted((job["failed"] or {}).items())) or "-"
        print(
            f"{job['job']:>22} {job['started_s']:>7} {job['ended_s']!s:>7} {job['state']!s:>9} "
            f"{job['pages_stored']!s:>6} {job.get('recall', '-')!s:>6} {job.get('missing', '-')!s:>7} {failed}"
        )
    print(f"\nRSS: {report['rss']['verdict']}")
    for index, worker in enumerate(report["rss"].get("workers", [])):
        print(
            f"  worker {index}: {worker['first_mib']} -> {worker['last_mib']} MiB "
            f"({worker['growth_mib']:+} MiB, {worker['growth_pct']:+} %)"
        )
    print(
        f"jobs: {report['jobs_started']} started, {report['jobs_completed']} completed, "
        f"{report['jobs_complete_with_full_recall']} complete with full recall (min recall {report['recall_min']}); "
        f"server: {server['page_fetches_200']} page fetches (expected "
        f"{server['expected_if_each_job_fetches_each_page_once']}), robots violations {server['robots_violations']}"
    )
    print(
        "Redis at the end, largest key groups: "
        + "; ".join(
            f"{pattern} x{count} = {used / _MIB:.1f} MiB"
            for pattern, (count, used) in list(report["redis_key_groups_end"].items())[:4]
        )
    )
    print(f"worker logs: {work / 'logs'}")
    args.out.write_text(json.dumps({"args": soak_args, **report}, indent=1))
    print(f"time series: {args.out}")
    final = {
        "label": "soak",
        **{k: soak_args[k] for k in ("duration", "jobs", "workers", "threads", "hosts", "pages", "delay")},
        **{k: v for k, v in report.items() if k not in ("samples", "jobs", "redis_key_groups_end")},
        "series_file": str(args.out),
    }
    print(json.dumps(final), flush=True)
    ok = report["jobs_complete_with_full_recall"] == report["jobs_started"] and not report["timed_out"]
    return 0 if ok else 1


def _is_listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
    except OSError:
        return False
    return True


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _kill_if_alive(pid: int | None) -> None:
    """The universe's nginx dies with its server; make sure, by its PID."""
    if pid is None or not _is_alive(pid):
        return
    try:
        if b"nginx" in Path(f"/proc/{pid}/cmdline").read_bytes():  # not a reused PID
            os.kill(pid, signal.SIGQUIT)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
