"""Soak: many concurrent crawl jobs over the shared synthetic web for a fixed time (issue 8, "Load").

This file sets up the cluster and runs the soak; the job loop is in soak_jobs.py, the sampling
over time and its verdicts in soak_sampling.py, the table and the report in soak_report.py.

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
import shutil
import signal
import socket
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.append(str(HERE))  # after the project: bench/storage.py must not shadow storage/

import node_cluster as nc  # noqa: E402  (LOOPBACK and the kit's scoring, shared with the other benches)
from crawl_universe import start_universe, stop_universe  # noqa: E402
from soak_jobs import Soak  # noqa: E402
from soak_report import print_report  # noqa: E402
from soak_sampling import is_alive, redis_key_groups  # noqa: E402

import tasks  # noqa: E402
from cli.cluster import LocalWorkers  # noqa: E402
from cli.local_redis import LocalRedis  # noqa: E402
from vcrawl.settings import Settings  # noqa: E402

_ASSUMED_PAGES_PER_S = 100.0  # only to size the universe (--pages auto); the run measures the real rate


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
        with ExitStack() as stack:
            local = stack.enter_context(LocalRedis(work / "redis"))
            # VCRAWL_ALLOWED_NETWORKS: the cluster-wide SSRF guard lets workers reach the loopback universe.
            soak_env = {"VCRAWL_REDIS_URL": local.url, "VCRAWL_DATA": str(data), "VCRAWL_ALLOWED_NETWORKS": nc.LOOPBACK}
            settings = Settings.from_env(soak_env)
            tasks.configure(settings)
            env = {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")} | settings.to_env() | soak_env
            workers = stack.enter_context(
                LocalWorkers(args.workers, args.threads, env, work / "logs", tasks.ping_workers)
            )
            soak = Soak(args, state, data, workers.pids)
            report = soak.run()
            report["samples"], report["jobs"] = soak.samples, soak.job_rows()
            report["redis_key_groups_end"] = redis_key_groups(tasks.deps.redis_client())
        report["server_check"] = soak.server_check()
        return print_report(args, report, work)
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
    if pid is None or not is_alive(pid):
        return
    try:
        if b"nginx" in Path(f"/proc/{pid}/cmdline").read_bytes():  # not a reused PID
            os.kill(pid, signal.SIGQUIT)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
