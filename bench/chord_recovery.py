"""Batch analysis after a worker loss: seconds from a SIGKILL mid-chord to the report, against an undisturbed run.

Run: ``.venv/bin/python bench/chord_recovery.py [--pages 3000] [--runs 2]`` (about 2 minutes a round on
2 cores). Everything is on loopback. What it does:

1. Crawls the kit's universe once (../shared/bench ``universe.py serve``, ``--hosts`` 10, ``--pages``
   3000, no latency) with ``vcrawl crawl --job`` into a private redis-server (the job of
   bench/node_cluster.py, no delay, 16 per host); then stops the universe.
2. Each round, for each scenario: starts two analysis workers as docs/cluster.md ships them
   (``celery -A tasks worker -Q analysis -c 1 -n analysis-a@%h`` and ``-b``: prefork, one process
   each on 2 cores; every setting shipped: node timeout 30 s, visibility timeout an hour), waits for
   their pings, runs ``vcrawl analyze JOB --analyzer site-report --json`` (default ``--chunk``), and:

   - ``undisturbed``: nothing else;
   - ``one killed``: SIGKILLs worker a's process group once half the chunks are mapped; b goes on alone;
   - ``both killed, restarted``: SIGKILLs both groups there and starts two new workers under the same
     names at once (a supervisor's restart: a worker restarted under its name hands back what its
     dead predecessor held);
   - ``both killed, new names``: the same with new names (other machines take over: what the dead
     held comes back when they are declared down, after the node timeout).

Measured: whether each report equals the undisturbed runs' (hosts, totals, urls), the ``vcrawl analyze``
wall time, the seconds from the kill to the report (the CLI's exit), the chunks mapped at the kill,
and how many lost maps the watchdog sent again (its warnings in the workers' logs).
Prints a line per run on stderr, then a markdown table (medians) and one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import hashlib
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
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import node_cluster as nc  # the universe helpers, the node environment; puts the project first on sys.path

crawl_universe = nc.crawl_universe
# bench/batch_analysis.py's crawl of the universe and its worker-group stop.
chord_bench = nc.bench_module("batch_analysis")

SCENARIOS = ("undisturbed", "one killed", "both killed, restarted", "both killed, new names")
SAME = {True: "yes", False: "NO"}
_LOST = re.compile(r"the messages of chunks \[([^\]]*)\] were lost; sent again")


def main() -> int:
    """Crawl once, then run every scenario ``--runs`` times; print the lines, the table and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--port", type=int, default=18893, help="the universe's port (not the kit's 8800)")
    parser.add_argument("--runs", type=int, default=2, help="rounds of every scenario (median)")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS, metavar="SCENARIO")
    parser.add_argument("--concurrency", type=int, default=1, help="pool processes per analysis worker")
    parser.add_argument("--kill-at", type=float, default=0.5, help="share of chunks mapped when the kill comes")
    parser.add_argument("--data-root", default="/dev/shm", help="where the job's temporary data dir goes")
    parser.add_argument("--timeout", type=float, default=900.0, help="hard stop of the crawl and of one run, s")
    args = parser.parse_args()
    if not 0 < args.kill_at < 1 or args.runs < 1 or args.concurrency < 1:
        parser.error("--kill-at must be in (0, 1); --runs and --concurrency at least 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the `finally`s stop what was started
    from cli.local_redis import LocalRedis

    work = Path(tempfile.mkdtemp(prefix="vcrawl-bench-recovery-"))
    data = Path(tempfile.mkdtemp(prefix="vcrawl-bench-recovery-", dir=args.data_root))
    state = work / "state.json"
    uni = argparse.Namespace(hosts=args.hosts, pages=args.pages, latency_ms=0.0, jitter_ms=0.0)
    server = crawl_universe.start_universe(uni, state, work, ["--port", str(args.port), "--crawl-delay-frac", "0"])
    redis_server = None
    ok = False
    try:
        site = crawl_universe.universe_row("recovery", state)
        redis_server = LocalRedis(work / "redis").start()
        env = nc.base_env(redis_server.url, data)
        crawl = chord_bench.crawl_once(args, state, env, work)
        print(f">>> crawl: job {crawl['job']} {crawl['state']}, {crawl['pages_stored']} pages stored in "
              f"{crawl['elapsed_s']} s", file=sys.stderr, flush=True)  # fmt: skip
        crawl_universe.stop_universe(server)  # analysis fetches nothing
        tasks = nc.use_cluster(env)
        client = redis.Redis.from_url(redis_server.url, decode_responses=True)
        rows = []
        for round_ in range(args.runs):
            for scenario in args.scenarios:
                row = one_run(scenario, crawl["job"], args, env, tasks, client, work / f"r{round_ + 1}")
                row["round"] = round_ + 1
                print(">>> " + run_line(row), file=sys.stderr, flush=True)
                rows.append(row)
        summary = summarize(rows)
        print_table(summary)
        settings = {"node_timeout_s": float(env["VCRAWL_NODE_TIMEOUT_S"]),
                    "visibility_timeout_s": float(env["VCRAWL_VISIBILITY_TIMEOUT_S"])}  # fmt: skip
        print(json.dumps({"bench": "chord-recovery", "site": site["note"], "crawl": crawl, "cores": os.cpu_count(),
                          "settings": settings, "medians": summary, "runs": rows}))  # fmt: skip
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


class AnalysisWorker:
    """One ``celery -A tasks worker -Q analysis`` in a process group of its own (killed as a machine dies)."""

    def __init__(self, name: str, env: dict[str, str], log: Path, concurrency: int) -> None:
        self.name = f"{name}@{socket.gethostname()}"
        command = [str(nc.CELERY), "-A", "tasks", "worker", "-Q", "analysis", "-c", str(concurrency),
                   "-n", self.name, "-l", "warning"]  # fmt: skip
        with open(log, "ab") as out:
            self.process = subprocess.Popen(command, env=env, cwd=nc.REPO, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.process.wait(10)


def start_workers(names: list[str], env: dict[str, str], tasks: Any, log_dir: Path, concurrency: int) -> list[Any]:
    """Start the workers together; return them once each answers a ping."""
    workers = [AnalysisWorker(name, env, log_dir / f"{name}.log", concurrency) for name in names]
    deadline = time.monotonic() + 90
    while tasks.ping_workers([w.name for w in workers]) != {w.name for w in workers}:
        if any(w.process.poll() is not None for w in workers) or time.monotonic() > deadline:
            for worker in workers:
                chord_bench.stop_group(worker.process)
            raise SystemExit(f"analysis workers did not start; see {log_dir}")
    return workers


def one_run(
    scenario: str, job_id: str, args: argparse.Namespace, env: dict[str, str], tasks: Any, client: redis.Redis,
    log_dir: Path,
) -> dict[str, Any]:  # fmt: skip
    """One ``vcrawl analyze`` with two analysis workers, disturbed as ``scenario`` says."""
    log_dir.mkdir(parents=True, exist_ok=True)
    tag = scenario.replace(" ", "-").replace(",", "")
    workers = start_workers([f"{tag}-a", f"{tag}-b"], env, tasks, log_dir, args.concurrency)
    command = [str(crawl_universe.VCRAWL), "analyze", job_id, "--analyzer", "site-report", "--json"]
    err = log_dir / f"analyze-{tag}.err"
    killed_at = mapped_at_kill = None
    try:
        with open(err, "ab") as err_file:
            cli = subprocess.Popen(command, env=env, cwd=nc.REPO, stdout=subprocess.PIPE, stderr=err_file,
                                   stdin=subprocess.DEVNULL, text=True, start_new_session=True)  # fmt: skip
        t0 = time.monotonic()
        try:
            if scenario != "undisturbed":
                run_id, chunks = wait_for_run(client, job_id, t0, args.timeout)
                mapped_at_kill = wait_for_mapped(client, job_id, run_id, int(chunks * args.kill_at), cli, args.timeout)
                killed_at = time.monotonic()
                for worker in workers[: 1 if scenario == "one killed" else 2]:
                    worker.kill()
                if scenario.startswith("both killed"):
                    names = [f"{tag}-a", f"{tag}-b"] if scenario.endswith("restarted") else [f"{tag}-c", f"{tag}-d"]
                    workers += start_workers(names, env, tasks, log_dir, args.concurrency)
            out, _ = cli.communicate(timeout=max(1.0, args.timeout - (time.monotonic() - t0)))
        except BaseException:
            chord_bench.stop_group(cli)
            raise
        done = time.monotonic()
    finally:
        for worker in workers:
            chord_bench.stop_group(worker.process)
    if cli.returncode != 0:
        raise SystemExit(f"vcrawl analyze exited {cli.returncode}; see {err}")
    run = json.loads(out.strip().splitlines()[-1])
    result = json.loads(Path(run["result"]).read_text())
    logs = "".join(path.read_text(errors="replace") for path in log_dir.glob(f"{tag}-*.log"))
    resent = sum(len(found.split(",")) for found in _LOST.findall(logs))
    return {
        "scenario": scenario, "chunks": run["chunks"], "pages": run["pages"], "wall_s": round(done - t0, 2),
        "kill_to_report_s": None if killed_at is None else round(done - killed_at, 2),
        "mapped_at_kill": mapped_at_kill, "lost_maps_sent_again": resent,
        "result_check": f"{result['totals']['hosts']} hosts, {result['totals']['pages']} pages", "run": run["run"],
        "report_digest": hashlib.sha256(json.dumps({key: result[key] for key in ("hosts", "totals", "urls")},
                                                   sort_keys=True).encode()).hexdigest()[:16],
    }  # fmt: skip


def wait_for_run(client: redis.Redis, job_id: str, t0: float, timeout_s: float) -> tuple[str, int]:
    """The run ``vcrawl analyze`` started (the job's newest, started after ``t0``): its id and chunks."""
    from batch_analysis.runs import AnalysisRuns

    runs = AnalysisRuns(client)
    started = time.time() - (time.monotonic() - t0)
    while time.monotonic() - t0 < timeout_s:
        for run in runs.list(job_id, limit=1):
            if (run.get("started_at") or 0) >= started - 1:
                return run["run"], int(run["chunks"])
        time.sleep(0.05)
    raise SystemExit("vcrawl analyze started no run")


def wait_for_mapped(
    client: redis.Redis, job_id: str, run_id: str, chunks: int, cli: subprocess.Popen[str], timeout_s: float
) -> int:
    """Wait until ``chunks`` chunks of the run are mapped; return how many are."""
    from vcrawl import redis_keys

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and cli.poll() is None:
        mapped = int(client.scard(redis_keys.analysis_chunks_done(job_id, run_id)))
        if mapped >= chunks:
            return mapped
        time.sleep(0.02)
    raise SystemExit(f"run {run_id}: {chunks} chunks not mapped before the run ended or the timeout")


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario: the median, min and max of the wall time and of the seconds from the kill to the report."""
    out = []
    for scenario in dict.fromkeys(row["scenario"] for row in rows):
        runs = [row for row in rows if row["scenario"] == scenario]
        line: dict[str, Any] = {"scenario": scenario, "runs": len(runs), "chunks": runs[0]["chunks"],
                                "pages": runs[0]["pages"]}  # fmt: skip
        for figure in ("wall_s", "kill_to_report_s"):
            values = [row[figure] for row in runs if row[figure] is not None]
            line[figure] = [round(statistics.median(values), 1), min(values), max(values)] if values else None
        line["lost_maps_sent_again"] = sum(row["lost_maps_sent_again"] for row in runs)
        undisturbed = {row["report_digest"] for row in rows if row["scenario"] == "undisturbed"}
        line["same_report"] = (all(row["report_digest"] in undisturbed for row in runs) if undisturbed
                               else None)  # fmt: skip
        out.append(line)
    return out


def run_line(row: dict[str, Any]) -> str:
    kill = "" if row["kill_to_report_s"] is None else (
        f", killed at {row['mapped_at_kill']}/{row['chunks']} chunks mapped: report {row['kill_to_report_s']} s "
        f"after the kill")  # fmt: skip
    return (f"{row['scenario']}, round {row['round']}: {row['pages']} pages ({row['chunks']} chunks) in "
            f"{row['wall_s']} s{kill}; {row['lost_maps_sent_again']} lost map(s) sent again; "
            f"{row['result_check']}")  # fmt: skip


def print_table(summary: list[dict[str, Any]]) -> None:
    """The medians [min-max], one markdown row per scenario (the table of docs/analysis.md)."""

    def shown(figure: list[float] | None) -> str:
        return "-" if figure is None else f"{figure[0]} [{figure[1]}-{figure[2]}]"

    print("\n| scenario | runs | pages | chunks | `vcrawl analyze` wall s | kill to report s | lost maps sent again "
          "| report as undisturbed |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for line in summary:
        print(f"| {line['scenario']} | {line['runs']} | {line['pages']} | {line['chunks']} | {shown(line['wall_s'])} "
              f"| {shown(line['kill_to_report_s'])} | {line['lost_maps_sent_again']} "
              f"| {SAME.get(line['same_report'], '-')} |")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
