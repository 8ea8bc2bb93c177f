"""Chord or Spark (issue 38): pages/s of ``vcrawl analyze`` on the Celery chord and on Spark ``local[2]``,
over the same stored crawl of at least 20,000 pages, and a check that both wrote the same reports.

Run: ``.venv/bin/python bench/analysis_engines.py [--cache DIR] [--rounds 3]`` (``bench/run.sh engines``).
What it does:

1. The crawl, made once and kept in ``--cache`` (default /tmp/vcrawl-bench-analysis-engines): the kit's
   universe (../shared/bench ``universe.py serve``, 20 hosts, 20,000 pages, no latency, nginx when
   installed, ``--crawl-delay-frac 0``) crawled by ``vcrawl crawl --job`` with ``"warc": true`` on a
   redis-server whose AOF lives in the cache, into a data root in the cache; politeness as
   bench/crawl_universe.py (no delay, 16 per host), the rest vcrawl's defaults. A later run with the same
   universe flags starts that Redis again and crawls nothing. Fewer than ``--min-pages`` stored pages stop it.
2. For each round, each analyzer (site-report, near-duplicates) and each engine, in an order that
   alternates between rounds, one ``vcrawl analyze JOB --analyzer A --json`` run:
   - chord: one analysis worker as docs/cluster.md ships it for 2 cores, ``celery -A tasks worker -Q
     analysis -P prefork -c 2`` (prefork: the analysis queue is CPU-bound; one worker with 2 pool
     processes), started and pinged before the run and stopped after it; its start is reported apart
     (``worker_start_s``), since a cluster's workers run before anyone analyzes.
   - spark: ``--engine spark --master local[2]``, with ``SPARK_LOCAL_IP=127.0.0.1`` (the driver and its
     UI stay on loopback) and the event log on (``SPARK_CONF_DIR`` with a spark-defaults.conf), from
     which the run's phases come: launch (Python, JVM, spark-submit), to the first job, jobs, after.
   Each round also times a bare ``local[2]`` session (import, ``getOrCreate``, a 1-row job, ``stop``).

Per run: wall time of the ``vcrawl analyze`` process, start to exit; pages/s = the job's stored pages /
wall; CPU s of everything the run used (the CLI and all it started, the chord's worker tree, Redis; the
bench is the subreaper of what it starts and samples its process tree, since Spark's processes outlive
the CLI and are not all reaped by their parents);
other work on the machine in cores (each run first waits, at most ``--quiet-wait`` s, for an idle
machine). Reports are compared without their run ids and times (bench/engine_figures.py). Prints a
line per run on stderr, the table of medians, then one JSON line; exits 1 when the reports differ.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_figures as figures
import node_cluster as nc  # process-tree CPU, machine busy, the universe helpers; puts the repo first on sys.path

crawl_universe = nc.crawl_universe
# bench/batch_analysis.py's helpers (run a child, stop a worker group, the chord's phases, wait for quiet).
chord_bench = nc.bench_module("batch_analysis")

CACHE_MARK = ".vcrawl-bench-analysis-engines"
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
UNIVERSE_KEYS = ("hosts", "pages", "port")
BARE_SPARK = """
import json, time
t0 = time.time()
from pyspark.sql import SparkSession
t1 = time.time()
spark = SparkSession.builder.master(MASTER).config("spark.ui.enabled", "false").getOrCreate()
t2 = time.time()
spark.range(1).count()
t3 = time.time()
spark.stop()
t4 = time.time()
print(json.dumps({"import_s": t1 - t0, "session_s": t2 - t1, "first_job_s": t3 - t2, "stop_s": t4 - t3}))
"""


def main() -> int:
    """Crawl once (or reuse the cached crawl), then time every (round, analyzer, engine); print the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "vcrawl-bench-analysis-engines",
                        help="where the crawl (Redis AOF, data root) is kept and reused")  # fmt: skip
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--pages", type=int, default=20000, help="pages of the universe")
    parser.add_argument("--min-pages", type=int, default=20000, help="stored pages the crawl must reach")
    parser.add_argument("--port", type=int, default=18893, help="the universe's port (not the kit's 8800)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per analyzer and engine (interleaved)")
    parser.add_argument("--analyzers", nargs="+", default=["site-report", "near-duplicates"])
    parser.add_argument("--engines", nargs="+", choices=("chord", "spark"), default=["chord", "spark"])
    parser.add_argument("--procs", type=int, default=2, help="pool processes of the chord's analysis worker")
    parser.add_argument("--master", default="local[2]", help="the Spark master of --engine spark")
    parser.add_argument("--quiet-wait", type=float, default=120.0, help="s to wait for an idle machine per run")
    parser.add_argument("--crawl-timeout", type=float, default=1800.0, help="hard stop of the crawl, s")
    parser.add_argument("--timeout", type=float, default=900.0, help="hard stop of one analyze run, s")
    args = parser.parse_args()
    if not 1 <= args.rounds <= 20:
        parser.error("--rounds must be 1..20")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the `finally`s stop what was started
    become_subreaper()
    from cli.local_redis import LocalRedis

    work = Path(tempfile.mkdtemp(prefix="vcrawl-bench-engines-"))
    redis_server = None
    ok = False
    try:
        crawl = cached_crawl(args)
        redis_server = LocalRedis(args.cache / "redis").start()  # the job's state, from the cache's AOF
        env = nc.base_env(redis_server.url, args.cache / "data")
        if crawl is None:
            crawl = crawl_into_cache(args, env)
        print(f">>> crawl: job {crawl['job']}, {crawl['pages_stored']} pages stored ({crawl['note']})",
              file=sys.stderr, flush=True)  # fmt: skip
        if crawl["pages_stored"] < args.min_pages:
            raise SystemExit(f"the crawl stored {crawl['pages_stored']} pages, fewer than --min-pages {args.min_pages}")
        tasks = nc.use_cluster(env)
        settle_leftovers(redis_server.url, env)
        rows, bare, reports = [], [], {}
        for round_ in range(args.rounds):
            if "spark" in args.engines:
                bare.append(bare_spark(args, env, work, {redis_server.pid}))
                print(f">>> bare Spark {args.master}, round {round_ + 1}: {bare[-1]}", file=sys.stderr, flush=True)
            for analyzer in args.analyzers:
                engines = args.engines if round_ % 2 == 0 else list(reversed(args.engines))
                for engine in engines:
                    row, report = measure(engine, analyzer, crawl, args, env, tasks, redis_server, work)
                    row["round"] = round_ + 1
                    print(">>> " + run_line(row), file=sys.stderr, flush=True)
                    rows.append(row)
                    reports.setdefault(analyzer, {}).setdefault(engine, []).append(report)
        checks = {analyzer: figures.compare_reports(by_engine) for analyzer, by_engine in reports.items()}
        summary = figures.summarize(rows)
        print("\n" + figures.table(summary))
        for analyzer, check in checks.items():
            print(f"{analyzer}: reports {'equal' if check['equal'] else 'DIFFER'} across "
                  f"{', '.join(check['digests'])} ({check['digests']}); {check['differences'][:3]}")  # fmt: skip
        print(json.dumps({"bench": "analysis-engines", "crawl": crawl, "cores": os.cpu_count(), "procs": args.procs,
                          "master": args.master, "bare_spark": bare, "medians": summary, "reports": checks,
                          "runs": rows}))  # fmt: skip
        ok = all(check["equal"] for check in checks.values())
        return 0 if ok else 1
    finally:
        if redis_server is not None:
            redis_server.stop()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f">>> logs in {work}", file=sys.stderr)


def universe_flags(args: argparse.Namespace) -> dict[str, Any]:
    """What makes a cached crawl fit these options."""
    return {key: getattr(args, key) for key in UNIVERSE_KEYS}


def cached_crawl(args: argparse.Namespace) -> dict[str, Any] | None:
    """The crawl kept in ``--cache`` when it fits the options; None (and an empty cache) otherwise.

    Raises:
        SystemExit: ``--cache`` holds something this script did not write, or a crawl of other flags.
    """
    cache: Path = args.cache
    summary = cache / "crawl.json"
    if summary.is_file():
        crawl = json.loads(summary.read_text())
        if crawl.get("universe") != universe_flags(args):
            raise SystemExit(f"{cache} holds a crawl of {crawl.get('universe')}, not {universe_flags(args)}: "
                             "give another --cache or delete it")  # fmt: skip
        return crawl
    if cache.exists() and any(cache.iterdir()):
        if not (cache / CACHE_MARK).exists():
            raise SystemExit(f"{cache} is not empty and not a cache of this script; give another --cache")
        print(f">>> {cache}: an unfinished crawl; starting again", file=sys.stderr)
        shutil.rmtree(cache)
    cache.mkdir(parents=True, exist_ok=True)
    (cache / CACHE_MARK).write_text("bench/analysis_engines.py: a stored crawl, reused by later runs\n")
    return None


def crawl_into_cache(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """Serve the universe, crawl it with WARC on into the cache, stop the universe; the crawl's summary
    (written last, as ``crawl.json``: its presence says the cache is whole)."""
    cache: Path = args.cache
    uni = argparse.Namespace(hosts=args.hosts, pages=args.pages, latency_ms=0.0, jitter_ms=0.0)
    state = cache / "universe-state.json"
    server = crawl_universe.start_universe(uni, state, cache, ["--port", str(args.port), "--crawl-delay-frac", "0"])
    try:
        site = crawl_universe.universe_row("engines", state)
        manifest = json.loads(Path(json.loads(state.read_text())["manifest"]).read_text())
        job = {
            "seeds": manifest["seeds"], "max_depth": 1000, "max_pages": 10 * len(manifest["reachable_pages"]) + 1000,
            "politeness": {"min_interval_s": 0.0, "jitter": 0.0, "per_host": 16},  # as bench/crawl_universe.py
            "warc": True,
        }  # fmt: skip
        (cache / "job.json").write_text(json.dumps(job))
        command = [str(crawl_universe.VCRAWL), "crawl", "--job", str(cache / "job.json"), "--data",
                   env["VCRAWL_DATA"], "--json", "--log-dir", str(cache / "crawl-logs"),
                   "--allow-network", nc.LOOPBACK]  # fmt: skip
        print(f">>> crawling {site['note']} into {cache}", file=sys.stderr, flush=True)
        started = time.monotonic()
        rc, out = chord_bench.run_child(command, env, args.crawl_timeout, cache / "crawl.err")
        if rc != 0:
            raise SystemExit(f"vcrawl crawl exited {rc}; see {cache / 'crawl.err'}")
        done = json.loads(out.strip().splitlines()[-1])
        if done.get("state") != "completed":
            raise SystemExit(f"the crawl ended {done.get('state')}: {done}")
    finally:
        crawl_universe.stop_universe(server)
    crawl = {key: done.get(key) for key in ("job", "state", "pages_stored", "pages_fetched", "failed", "elapsed_s")}
    crawl.update(universe=universe_flags(args), note=site["note"], wall_s=round(time.monotonic() - started, 1),
                 warc_bytes=sum(f.stat().st_size for f in (cache / "data").rglob("*.warc.gz")))  # fmt: skip
    partial = cache / "crawl.json.tmp"
    partial.write_text(json.dumps(crawl))
    partial.rename(cache / "crawl.json")
    return crawl


def measure(
    engine: str, analyzer: str, crawl: dict[str, Any], args: argparse.Namespace, env: dict[str, str], tasks: Any,
    redis_server: Any, work: Path,
) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """One run of ``engine``: the chord with its worker started before and stopped after; its row and report."""
    if engine == "spark":
        return one_run(engine, analyzer, crawl, args, spark_env(env, work), None, redis_server, work)
    name = f"analysis-engines@{socket.gethostname()}"
    log = work / "chord-worker.log"
    command = [str(nc.CELERY), "-A", "tasks", "worker", "-Q", "analysis", "-P", "prefork", "-c", str(args.procs),
               "-n", name, "-l", "warning"]  # fmt: skip
    started = time.monotonic()
    with open(log, "ab") as out:
        worker = subprocess.Popen(command, env=env, cwd=nc.REPO, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not tasks.ping_workers([name]):  # each ping waits up to 0.5 s
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"analysis worker did not start; see {log}")
        worker_start_s = round(time.monotonic() - started, 2)
        time.sleep(1.0)  # start-up work (pump, ring keeper, spool recovery) out of the measured part
        if leftover := queued_analysis(redis_server.url):
            raise SystemExit(f"{leftover} analysis message(s) queued or unacknowledged before a chord run")
        row, report = one_run(engine, analyzer, crawl, args, env, worker.pid, redis_server, work)
        row["worker_start_s"] = worker_start_s
        return row, report
    finally:
        chord_bench.stop_group(worker)


def settle_leftovers(redis_url: str, env: dict[str, str]) -> None:
    """Fail the analysis runs an interrupted earlier bench left unfinished in the cached Redis, and purge
    their queued map messages: else the next chord worker maps them too (seen: 69 s of worker CPU in a
    17 s site-report run) and the workers' watchdog sends them again. The Redis is this bench's own."""
    from batch_analysis.runs import AnalysisRuns
    from vcrawl import redis_keys

    with redis.Redis.from_url(redis_url) as client:
        left = [member.decode().split("\t", 1) for member in client.smembers(redis_keys.analyses_running())]
        for job_id, run_id in left:
            AnalysisRuns(client).fail(job_id, run_id, "left unfinished by an interrupted benchmark", time.time())
    done = subprocess.run([str(nc.CELERY), "-A", "tasks", "purge", "-f", "-Q", "analysis"], env=env, cwd=nc.REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"celery purge of the analysis queue failed: {done.stderr[-1000:]}")
    if left or "No messages purged" not in done.stdout:
        print(f">>> left by an earlier run: {len(left)} unfinished analysis run(s) failed; {done.stdout.strip()}",
              file=sys.stderr)  # fmt: skip


def queued_analysis(redis_url: str) -> int:
    """Messages waiting on the analysis queue or unacknowledged (kombu's Redis layout: a list named as the
    queue, a hash ``unacked``): a chord run must start with none."""
    with redis.Redis.from_url(redis_url) as client:
        return int(client.llen("analysis")) + int(client.hlen("unacked"))


def spark_env(env: dict[str, str], work: Path) -> dict[str, str]:
    """``env`` for a Spark run: driver on loopback, its event log into a fresh folder under ``work``."""
    conf = Path(tempfile.mkdtemp(prefix="spark-conf-", dir=work))
    (conf / "events").mkdir()
    (conf / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir {(conf / 'events').as_uri()}\nspark.eventLog.compress false\n"
    )
    return {**env, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONF_DIR": str(conf)}


def one_run(
    engine: str, analyzer: str, crawl: dict[str, Any], args: argparse.Namespace, env: dict[str, str],
    worker_pid: int | None, redis_server: Any, work: Path,
) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """One ``vcrawl analyze`` run, measured; its row and its report."""
    client = redis.Redis.from_url(redis_server.url)

    def snapshot() -> tuple[float, ...]:
        info = client.info("cpu")
        children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the CLI and what it started, once reaped
        worker = nc.cpu_s([worker_pid]) if worker_pid is not None else 0.0
        return (worker, info["used_cpu_user"] + info["used_cpu_sys"], children.ru_utime + children.ru_stime,
                *nc.machine_busy_s(), nc.cpu_s([os.getpid()], descendants=False))  # fmt: skip

    command = [str(crawl_universe.VCRAWL), "analyze", crawl["job"], "--analyzer", analyzer, "--json"]
    command += ["--engine", "spark", "--master", args.master] if engine == "spark" else []
    err = work / f"analyze-{engine}-{analyzer}.err"
    chord_bench.wait_for_quiet(args.quiet_wait)
    w0, r0, c0, busy0, total0, me0 = snapshot()
    t0, epoch0 = time.monotonic(), time.time()
    keep = {pid for pid in (worker_pid, redis_server.pid) if pid is not None}
    with SampledCpu(keep, args.timeout + 120) as sampled:
        rc, out = chord_bench.run_child(command, env, args.timeout, err)
        wall = time.monotonic() - t0
        orphans, orphan_wait_s = reap_orphans(keep)
    w1, r1, c1, busy1, total1, me1 = snapshot()  # after the reaping: the orphans' CPU is ours now
    span = time.monotonic() - t0
    client.close()
    if rc != 0:
        raise SystemExit(f"vcrawl analyze ({engine}) exited {rc}; see {err}")
    run = json.loads(out.strip().splitlines()[-1])
    report = json.loads(Path(run["result"]).read_text())
    (work / f"report-{engine}-{analyzer}-{len(list(work.glob('report-*')))}.json").write_text(json.dumps(report))
    cli_cpu = max(c1 - c0, sampled.cpu_s)  # the CLI and all it started: reaped, or seen running
    cpu = (w1 - w0) + cli_cpu + (r1 - r0)
    busy = busy1 - busy0
    pages = crawl["pages_stored"]
    if engine == "spark":
        phases = figures.spark_phases(figures.read_events(Path(env["SPARK_CONF_DIR"]) / "events"), epoch0,
                                      epoch0 + wall, spark_cores(args.master))  # fmt: skip
    else:
        folder = Path(env["VCRAWL_DATA"]) / "jobs" / crawl["job"] / "analysis" / run["run"]
        phases = chord_bench.phases(run, report, folder, epoch0, epoch0 + wall)
    return {
        "engine": engine, "analyzer": analyzer, "pages": pages, "run_pages": run.get("pages"),
        "wall_s": round(wall, 2), "elapsed_s": run.get("elapsed_s"), "pages_per_s": round(pages / wall, 1),
        "cpu_s": round(cpu, 2), "cores_used": round(cpu / wall, 2), "cli_cpu_s": round(cli_cpu, 2),
        "cli_cpu_reaped_s": round(c1 - c0, 2), "cli_cpu_sampled_s": round(sampled.cpu_s, 2),
        "worker_cpu_s": round(w1 - w0, 2), "redis_cpu_s": round(r1 - r0, 2),
        "other_cores": round((busy - cpu - (me1 - me0)) / span, 2),
        "machine_busy": round(busy / max(1e-9, total1 - total0), 3),
        "orphans": orphans, "orphan_wait_s": orphan_wait_s,
        "report_digest": figures.report_digest(report), "result_check": chord_bench.result_check(analyzer, report),
        "phases_s": phases,
    }, report  # fmt: skip


def spark_cores(master: str) -> int:
    """Task slots of a ``local[N]`` / ``local[*]`` / ``local`` master (this machine's cores for ``*``)."""
    inside = master[len("local[") : -1] if master.startswith("local[") and master.endswith("]") else "1"
    if inside == "*":
        return os.cpu_count() or 1
    return int(inside.split(",")[0]) if inside.split(",")[0].isdigit() else 1


def bare_spark(args: argparse.Namespace, env: dict[str, str], work: Path, keep: set[int]) -> dict[str, float]:
    """Seconds of a bare ``--master`` session (web UI off, as vcrawl's): import pyspark, ``getOrCreate``, a
    1-row job, ``stop``, the whole process and its CPU: the fixed cost every Spark run pays around its work."""
    script = BARE_SPARK.replace("MASTER", json.dumps(args.master))
    chord_bench.wait_for_quiet(args.quiet_wait)
    started = time.monotonic()
    python = str(nc.REPO / ".venv" / "bin" / "python")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with SampledCpu(keep, 420.0) as sampled:
        rc, out = chord_bench.run_child([python, "-c", script], spark_env(env, work), 300.0, work / "bare-spark.err")
        orphans, orphan_wait_s = reap_orphans(keep)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if rc != 0:
        raise SystemExit(f"a bare Spark session exited {rc}; see {work / 'bare-spark.err'}")
    times = {key: round(value, 2) for key, value in json.loads(out.strip().splitlines()[-1]).items()}
    times["process_s"] = round(time.monotonic() - started, 2)
    times.update(cpu_s=round(max(reaped, sampled.cpu_s), 2), orphans=orphans, orphan_wait_s=orphan_wait_s)
    return times


def become_subreaper() -> None:
    """Make this process the subreaper of what it starts: Spark's JVM outlives ``vcrawl analyze`` (it exits
    when the driver's pipe closes), and only a process someone reaps has its CPU in RUSAGE_CHILDREN.

    Raises:
        OSError: prctl refused.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def own_children() -> set[int]:
    """This process's children now, orphans of a finished run included (/proc/self/task/*/children)."""
    children: set[int] = set()
    for task in Path("/proc/self/task").glob("*"):
        try:
            children |= {int(pid) for pid in (task / "children").read_text().split()}
        except OSError:
            continue
    return children


def reap_orphans(keep: set[int], limit_s: float = 60.0) -> tuple[int, float]:
    """Wait for every child but ``keep`` (what a run left behind), SIGKILL what is left after ``limit_s``;
    (how many, seconds waited)."""
    started = time.monotonic()
    reaped, killed = 0, False
    while children := own_children() - keep:
        for pid in children:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            reaped += 1 if done else 0
        if time.monotonic() - started > limit_s and not killed:
            print(f">>> SIGKILL of processes a run left behind: {sorted(children)}", file=sys.stderr)
            for pid in children:
                os.kill(pid, signal.SIGKILL)
            killed = True
        elif time.monotonic() - started > limit_s + 10:
            raise SystemExit(f"processes a run left behind do not go: {sorted(children)}")
        time.sleep(0.05)
    return reaped, round(time.monotonic() - started, 2)


class SampledCpu:
    """CPU seconds of this process's children but ``keep``, and of their descendants, sampled from /proc
    every ``interval_s`` (the last value seen per process): a cross-check of RUSAGE_CHILDREN, which misses
    a process whose parent died before it could reap it. A process's last ``interval_s`` can be missed."""

    def __init__(self, keep: set[int], limit_s: float, interval_s: float = 0.2) -> None:
        self.keep, self.limit_s, self.interval_s = keep, limit_s, interval_s
        self.seen: dict[tuple[int, int], float] = {}  # (pid, start time in ticks) -> utime + stime, s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for child in own_children() - self.keep:
            for pid in nc.tree_pids(child):
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                self.seen[(pid, int(fields[19]))] = (int(fields[11]) + int(fields[12])) / nc.CLK_TCK

    def _run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            self._sample()
            self._stop.wait(self.interval_s)

    @property
    def cpu_s(self) -> float:
        return sum(self.seen.values())

    def __enter__(self) -> SampledCpu:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


def run_line(row: dict[str, Any]) -> str:
    """One run, one line (stderr)."""
    start = f", worker start {row['worker_start_s']} s (not counted)" if "worker_start_s" in row else ""
    return (f"{row['analyzer']} on {row['engine']}, round {row['round']}: {row['pages']} pages in {row['wall_s']} s "
            f"= {row['pages_per_s']} pages/s; CPU {row['cpu_s']} s ({row['cores_used']} cores: CLI "
            f"{row['cli_cpu_s']} [reaped {row['cli_cpu_reaped_s']}, sampled {row['cli_cpu_sampled_s']}], worker "
            f"{row['worker_cpu_s']}, Redis {row['redis_cpu_s']}), other work "
            f"{row['other_cores']} cores{start}; {row['result_check']}; report {row['report_digest']}; "
            f"phases {row['phases_s']}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
