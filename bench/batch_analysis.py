"""Batch analysis throughput (issue 18): pages/s of ``vcrawl analyze`` over a stored 6,000-page job.

Run: ``.venv/bin/python bench/batch_analysis.py [--procs 1 2] [--runs 3]`` (``make bench-analysis``;
about 7 minutes on 2 cores). What it does:

1. Starts the kit's universe (../shared/bench ``universe.py serve``: ``--hosts`` 10, ``--pages``
   6000, no latency, so nginx when installed; ``--crawl-delay-frac 0``) and a private redis-server,
   and crawls it once with ``vcrawl crawl --job`` against that Redis (``VCRAWL_REDIS_URL``: the
   job's state stays there for ``vcrawl analyze``). The crawl is vcrawl's defaults (one worker
   process per core, 16 threads, retries, ``retry_after``) except what a benchmark needs: the
   politeness of bench/crawl_universe.py (no delay, no jitter, 16 per host), loopback allowed,
   and depth and page limits that cover the whole universe. Pages go to tmpfs (``--data-root``),
   so disk noise does not blur the CPU figures. ``vcrawl crawl`` stops its workers at the end.
2. Stops the universe; then, for each round and each N of ``--procs``, starts one analysis worker
   as docs/cluster.md ships it, ``celery -A tasks worker -Q analysis -P prefork -c N -n
   analysisN@%h`` (prefork: the docs' pool for CPU-bound analysis; one worker with N pool
   processes, as the docs' ``-c 2``), waits for its ping, runs ``vcrawl analyze JOB --analyzer
   site-report --json`` (default ``--chunk``) and stops the worker. In the first round it also
   runs ``near-duplicates`` on the same worker (one figure per setting).

Measured per run: wall time of the ``vcrawl analyze`` process, start to exit (imports, planning,
the chord, waiting), and where it went (``phases_s``); pages/s = stored pages / wall; CPU seconds
(utime+stime, /proc) of the worker's process tree, of the ``vcrawl analyze`` process (it reads the
fetch log and plans) and of Redis; the machine's busy share (/proc/stat: other work on the machine
shows as ``other_cores``; each run first waits, at most ``--quiet-wait`` s, for an idle machine).
Prints a line per run on stderr, then a markdown table with the medians (one row per setting) and
one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import node_cluster as nc  # process-tree CPU, machine busy, the universe helpers

crawl_universe = nc.crawl_universe


def main() -> int:
    """Crawl once, then measure every (setting, analyzer) run; print the lines and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--pages", type=int, default=6000)
    parser.add_argument("--port", type=int, default=18891, help="the universe's port (not the kit's 8800)")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2], help="analysis pool processes")
    parser.add_argument("--runs", type=int, default=3, help="site-report runs per setting (median)")
    parser.add_argument("--chunk", type=int, help="--chunk of vcrawl analyze (default: vcrawl's)")
    parser.add_argument("--no-near-duplicates", action="store_true", help="skip the near-duplicates figure")
    parser.add_argument("--data-root", default="/dev/shm", help="where the job's temporary data dir goes")
    parser.add_argument("--quiet-wait", type=float, default=300.0, help="s to wait for an idle machine per run")
    parser.add_argument("--timeout", type=float, default=900.0, help="hard stop of the crawl and of one run, s")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the `finally`s stop what was started
    from cli.local_redis import LocalRedis

    work = Path(tempfile.mkdtemp(prefix="vcrawl-bench-analysis-"))
    data = Path(tempfile.mkdtemp(prefix="vcrawl-bench-analysis-", dir=args.data_root))
    state = work / "state.json"
    uni = argparse.Namespace(hosts=args.hosts, pages=args.pages, latency_ms=0.0, jitter_ms=0.0)
    server = crawl_universe.start_universe(uni, state, work, ["--port", str(args.port), "--crawl-delay-frac", "0"])
    redis_server = None
    ok = False
    try:
        site = crawl_universe.universe_row("analysis", state)
        redis_server = LocalRedis(work / "redis").start()
        env = nc.base_env(redis_server.url, data)
        crawl = crawl_once(args, state, env, work)
        print(f">>> crawl: job {crawl['job']} {crawl['state']}, {crawl['pages_stored']} pages stored of "
              f"{crawl['pages_fetched']} fetched in {crawl['elapsed_s']} s", file=sys.stderr, flush=True)  # fmt: skip
        crawl_universe.stop_universe(server)  # analysis fetches nothing: the site's CPU stays out of it
        tasks = nc.use_cluster(env)
        rows = []
        for round_ in range(args.runs):
            for procs in args.procs:
                analyzers = ["site-report"] + ([] if round_ or args.no_near_duplicates else ["near-duplicates"])
                for row in measure(procs, analyzers, crawl["job"], args, env, tasks, redis_server, work):
                    row["round"] = round_ + 1
                    print(">>> " + run_line(row), file=sys.stderr, flush=True)
                    rows.append(row)
        summary = summarize(rows)
        print_table(summary)  # one row per setting
        print(json.dumps({"bench": "batch-analysis", "site": site["note"], "crawl": crawl,
                          "cores": os.cpu_count(), "medians": summary, "runs": rows}))  # fmt: skip
        ok = True
        return 0
    finally:
        crawl_universe.stop_universe(server)
        if redis_server is not None:
            redis_server.stop()
        shutil.rmtree(data, ignore_errors=True)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f">>> logs in {work}", file=sys.stderr)


def crawl_once(args: argparse.Namespace, state: Path, env: dict[str, str], work: Path) -> dict[str, Any]:
    """Crawl the whole universe with ``vcrawl crawl --job`` on our Redis; its ``--json`` summary."""
    manifest = json.loads(Path(json.loads(state.read_text())["manifest"]).read_text())
    job = {
        "seeds": manifest["seeds"],
        "max_depth": 1000,
        "max_pages": 10 * len(manifest["reachable_pages"]) + 1000,
        "politeness": {"min_interval_s": 0.0, "jitter": 0.0, "per_host": 16},  # as bench/crawl_universe.py
    }
    job_file = work / "job.json"
    job_file.write_text(json.dumps(job))
    command = [str(crawl_universe.VCRAWL), "crawl", "--job", str(job_file), "--data", env["VCRAWL_DATA"],
               "--json", "--log-dir", str(work / "crawl-logs"), "--allow-network", nc.LOOPBACK]  # fmt: skip
    rc, out = run_child(command, env, args.timeout, work / "crawl.err")
    if rc != 0:
        raise SystemExit(f"vcrawl crawl exited {rc}; see {work / 'crawl.err'}")
    summary = json.loads(out.strip().splitlines()[-1])
    if summary.get("state") != "completed":
        raise SystemExit(f"the crawl ended {summary.get('state')}: {summary}")
    return {key: summary.get(key) for key in ("job", "state", "pages_stored", "pages_fetched", "failed", "elapsed_s")}


def measure(
    procs: int, analyzers: list[str], job_id: str, args: argparse.Namespace, env: dict[str, str], tasks: Any,
    redis_server: Any, work: Path,
) -> list[dict[str, Any]]:  # fmt: skip
    """Start the analysis worker with ``procs`` pool processes, run each analyzer once, stop it."""
    name = f"analysis{procs}@{socket.gethostname()}"
    log = work / f"worker-{procs}.log"
    command = [str(nc.CELERY), "-A", "tasks", "worker", "-Q", "analysis", "-P", "prefork", "-c", str(procs),
               "-n", name, "-l", "warning"]  # fmt: skip
    with open(log, "ab") as out:
        worker = subprocess.Popen(command, env=env, cwd=nc.REPO, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not tasks.ping_workers([name]):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"analysis worker did not start; see {log}")
        time.sleep(1.0)  # start-up work (pump, ring keeper, spool recovery) out of the measured part
        return [one_run(procs, analyzer, job_id, args, env, worker.pid, redis_server, work) for analyzer in analyzers]
    finally:
        stop_group(worker)


def one_run(
    procs: int, analyzer: str, job_id: str, args: argparse.Namespace, env: dict[str, str], worker_pid: int,
    redis_server: Any, work: Path,
) -> dict[str, Any]:  # fmt: skip
    """One ``vcrawl analyze`` run, measured."""
    client = redis.Redis.from_url(redis_server.url)

    def snapshot() -> tuple[float, ...]:
        info = client.info("cpu")
        children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the analyze process, once reaped
        return (nc.cpu_s([worker_pid]), info["used_cpu_user"] + info["used_cpu_sys"],
                children.ru_utime + children.ru_stime, *nc.machine_busy_s(),
                nc.cpu_s([os.getpid()], descendants=False))  # fmt: skip

    command = [str(crawl_universe.VCRAWL), "analyze", job_id, "--analyzer", analyzer, "--json"]
    command += ["--chunk", str(args.chunk)] if args.chunk else []
    wait_for_quiet(args.quiet_wait)
    w0, r0, c0, busy0, total0, me0 = snapshot()
    t0, epoch0 = time.monotonic(), time.time()
    rc, out = run_child(command, env, args.timeout, work / f"analyze-{procs}-{analyzer}.err")
    wall = time.monotonic() - t0
    w1, r1, c1, busy1, total1, me1 = snapshot()
    if rc != 0:
        raise SystemExit(f"vcrawl analyze exited {rc}; see {work}/analyze-{procs}-{analyzer}.err")
    run = json.loads(out.strip().splitlines()[-1])
    result = json.loads(Path(run["result"]).read_text())
    worker_cpu, cli_cpu, redis_cpu = w1 - w0, c1 - c0, r1 - r0
    busy = busy1 - busy0
    return {
        "analyzer": analyzer, "procs": procs, "urls": run["urls"], "pages": run["pages"], "chunks": run["chunks"],
        "wall_s": round(wall, 2), "elapsed_s": run["elapsed_s"], "pages_per_s": round(run["pages"] / wall, 1),
        "worker_cpu_s": round(worker_cpu, 2), "worker_cpu_ms_per_page": round(1000 * worker_cpu / run["pages"], 2),
        "worker_cores": round(worker_cpu / wall, 2), "cli_cpu_s": round(cli_cpu, 2), "redis_cpu_s": round(redis_cpu, 2),
        "machine_busy": round(busy / max(1e-9, total1 - total0), 3),
        "other_cores": round((busy - worker_cpu - cli_cpu - redis_cpu - (me1 - me0)) / wall, 2),
        "result_check": result_check(analyzer, result),
        "phases_s": phases(run, result, Path(env["VCRAWL_DATA"]) / "jobs" / job_id / "analysis" / run["run"],
                           epoch0, epoch0 + wall),
    }  # fmt: skip


def phases(run: dict[str, Any], result: dict[str, Any], folder: Path, start: float, end: float) -> dict[str, float]:
    """Where a run's wall time went, from its timestamps and its files' times (tmpfs, ns): ``startup``
    (the CLI's imports and its check for unshipped fetch log parts), ``plan`` (read the fetch log, write
    the chunks), ``maps`` (plan written to the last partial written), ``reduce`` (to the result's
    ``generated_at``), ``exit`` (the CLI's next poll, print and exit)."""
    planned = (folder / "plan.json").stat().st_mtime
    mapped = max(part.stat().st_mtime for part in folder.glob("part-*.json"))
    marks = [start, run["started_at"], planned, mapped, result["generated_at"], end]
    names = ("startup", "plan", "maps", "reduce", "exit")
    return {name: round(b - a, 2) for name, a, b in zip(names, marks[:-1], marks[1:], strict=True)}


def wait_for_quiet(limit_s: float) -> None:
    """Wait (at most ``limit_s``) until the machine is idle over 2 s (< 15 % busy): other work on a
    shared machine would blur the figures (``other_cores`` shows what still ran during a run)."""
    deadline = time.monotonic() + limit_s
    while True:
        busy0, total0 = nc.machine_busy_s()
        time.sleep(2.0)
        busy1, total1 = nc.machine_busy_s()
        share = (busy1 - busy0) / max(1e-9, total1 - total0)
        if share < 0.15 or time.monotonic() > deadline:
            if share >= 0.15:
                print(f">>> machine still {share:.0%} busy after {limit_s:g} s; measuring anyway", file=sys.stderr)
            return


def result_check(analyzer: str, result: dict[str, Any]) -> str:
    """A short proof that the run produced a real result."""
    if analyzer == "site-report":
        totals = result["totals"]
        return f"{totals['hosts']} hosts, {totals['pages']} pages, {totals['broken_links']} broken links"
    clusters = result.get("clusters", [])
    return f"{len(clusters)} clusters, {sum(c['size'] for c in clusters)} pages in them"


def run_child(command: list[str], env: dict[str, str], timeout_s: float, err: Path) -> tuple[int, str]:
    """Run a vcrawl command (stderr to ``err``); on any interruption, SIGTERM it (vcrawl then stops
    the workers it started), SIGKILL after 60 s. Returns (exit code, stdout)."""
    with open(err, "ab") as err_file:
        child = subprocess.Popen(command, env=env, cwd=nc.REPO, stdout=subprocess.PIPE, stderr=err_file,
                                 stdin=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        out, _ = child.communicate(timeout=timeout_s)
    except BaseException:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(10)
        raise
    return child.returncode, out


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Warm shutdown of a worker's process group (SIGTERM), SIGKILL of the group after 20 s."""
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
            if sig == signal.SIGTERM:  # the leader is gone; its pool children may not be
                os.killpg(process.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (analyzer, procs): the median of each figure over its runs, with the min and max of pages/s."""
    out = []
    for key in dict.fromkeys((row["analyzer"], row["procs"]) for row in rows):
        runs = [row for row in rows if (row["analyzer"], row["procs"]) == key]
        line: dict[str, Any] = {"analyzer": key[0], "procs": key[1], "runs": len(runs), "pages": runs[0]["pages"],
                                "chunks": runs[0]["chunks"]}  # fmt: skip
        for figure in ("wall_s", "elapsed_s", "pages_per_s", "worker_cpu_s", "worker_cpu_ms_per_page",
                       "worker_cores", "cli_cpu_s", "redis_cpu_s", "machine_busy", "other_cores"):  # fmt: skip
            line[figure] = round(statistics.median(row[figure] for row in runs), 3)
        line["phases_s"] = {k: round(statistics.median(r["phases_s"][k] for r in runs), 2) for k in runs[0]["phases_s"]}
        line["pages_per_s_range"] = [min(r["pages_per_s"] for r in runs), max(r["pages_per_s"] for r in runs)]
        out.append(line)
    return out


def run_line(row: dict[str, Any]) -> str:
    return (f"{row['analyzer']}, {row['procs']} process(es), round {row['round']}: {row['pages']} pages "
            f"({row['chunks']} chunks) in {row['wall_s']} s = {row['pages_per_s']} pages/s; worker CPU "
            f"{row['worker_cpu_s']} s ({row['worker_cores']} cores), CLI {row['cli_cpu_s']} s, Redis "
            f"{row['redis_cpu_s']} s; machine {row['machine_busy']:.0%} busy, other work {row['other_cores']} "
            f"cores; {row['result_check']}; phases {row['phases_s']}")  # fmt: skip


def print_table(summary: list[dict[str, Any]]) -> None:
    """The medians, one markdown row per setting (the table of docs/performance.md)."""
    print(
        "\n| analyzer | analysis processes | runs | pages | chunks | wall s | pages/s [min-max] | worker CPU s "
        "| worker CPU ms/page | worker cores | `vcrawl analyze` CPU s | Redis CPU s | other work (cores) "
        "| startup / plan / maps / reduce / exit s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in summary:
        lo, hi = s["pages_per_s_range"]
        print(f"| {s['analyzer']} | {s['procs']} | {s['runs']} | {s['pages']} | {s['chunks']} | {s['wall_s']} "
              f"| {s['pages_per_s']} [{lo}-{hi}] | {s['worker_cpu_s']} | {s['worker_cpu_ms_per_page']} "
              f"| {s['worker_cores']} | {s['cli_cpu_s']} | {s['redis_cpu_s']} | {s['other_cores']} "
              f"| {' / '.join(str(v) for v in s['phases_s'].values())} |")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
