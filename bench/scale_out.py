"""Scaling figure (issue 17): pages/s with 1, 2 and 4 worker nodes, on the host ring and on the shared queue.

Run: ``.venv/bin/python bench/scale_out.py [--quick]`` (``make scale-out``; about 10 minutes,
``--quick``: 1 and 2 nodes on smaller sites, about 3 minutes). Every point starts its own Redis
and N worker nodes (``celery -A tasks worker -Q download,download.dynamic,analysis -P threads
-c 16 -n N<i>@%h``, each a process group of its own; ``ring`` points give each
``VCRAWL_NODE_WEIGHT=100``, ``shared`` points no weight, so batches go to the shared ``download``
queue), submits the same job over the kit's universe through the tasks façade (what ``vcrawl
submit`` calls) and times it until the job is ``completed``. Two sites, each started once:

  off     ``--off-hosts`` 50 hosts, ``--off-pages`` 6000 pages, 100 +- 20 ms latency (aiohttp),
          politeness off (``min_interval_s`` 0, 16 per host): the site answers as fast as asked,
          so threads x nodes / latency bounds the rate, then the CPU;
  polite  ``--polite-hosts`` 50 hosts, ``--polite-pages`` 3000 pages, no latency (nginx),
          0.5 s per host, 1 per host, jitter 0: each host allows 2 pages/s, so the site bounds
          the rate (``per_host_bound``: pages / the busiest host's requests x its interval).

Measured per point (``/proc`` and Redis ``INFO`` before and after the timed part):
pages/s (reachable pages served 200, from the universe's access log, / wall time from submit to
completed); CPU of the worker process trees and of redis-server per page (``utime+stime``);
Redis commands per page (``total_commands_processed``) and requests per page
(``total_reads_processed``, a pipeline is one); TCP connections to the site per page: distinct
client endpoints facing the universe's port seen in ``/proc/net/tcp`` every 0.1 s (TIME_WAIT
keeps a closed one visible for 60 s, so short ones are counted too; vcrawl's fetcher exposes no
connection counter); the machine's busy share (``/proc/stat``, everyone's processes: other work
on the machine shows there too); the universe server's CPU. ``redis_saturation_pages_s`` is
1000 / (Redis CPU ms per page): the pages/s at which this Redis would use one whole core.

Departures from the shipped defaults, and why: both sites are made with ``--special-frac 0``
(no 429/503 Retry-After traps; they pause a host for seconds and would measure the traps, not
the nodes; docs/performance.md measures them); the polite job sets jitter 0 (the default 0.5
spreads the interval and blurs the per-host bound). Everything else (batch size, in-flight
batches, timeouts, retries, events) is the shipped default.
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
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import node_cluster as nc


def main() -> int:
    """Run every point; print its JSON line, then the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--modes", nargs="+", default=["ring", "shared"], choices=("ring", "shared"))
    parser.add_argument("--sites", nargs="+", default=["off", "polite"], choices=("off", "polite"))
    parser.add_argument("--threads", type=int, default=16, help="threads per node")
    parser.add_argument("--off-hosts", type=int, default=50)
    parser.add_argument("--off-pages", type=int, default=6000)
    parser.add_argument("--off-latency-ms", type=float, default=100.0)
    parser.add_argument("--polite-hosts", type=int, default=50)
    parser.add_argument("--polite-pages", type=int, default=3000)
    parser.add_argument("--polite-delay", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=300.0, help="hard stop of one point, seconds")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 and 2 nodes, 1500 and 1000 pages")
    parser.add_argument("--out", default="/tmp/vcrawl-scale-out.jsonl", help="JSON lines")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.off_pages, args.polite_pages = [1, 2], 1500, 1000
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the `finally`s stop what was started
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with open(args.out, "w") as out:
        for site in args.sites:
            for row in run_site(args, site):
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")
                rows.append(row)
    print(f">>> {time.monotonic() - started:.0f} s in all", file=sys.stderr)
    print_table(rows)
    return 0 if rows and all("error" not in row for row in rows) else 1


def run_site(args: argparse.Namespace, site: str) -> list[dict[str, Any]]:
    """Start one site and measure every (nodes, mode) point on it."""
    work = Path(tempfile.mkdtemp(prefix=f"vcrawl-scale-{site}-"))
    state = work / "state.json"
    if site == "off":
        uni = argparse.Namespace(hosts=args.off_hosts, pages=args.off_pages, latency_ms=args.off_latency_ms,
                                 jitter_ms=args.off_latency_ms / 5)  # fmt: skip
        port, delay_s, per_host = 18841, 0.0, 16
    else:
        uni = argparse.Namespace(hosts=args.polite_hosts, pages=args.polite_pages, latency_ms=0.0, jitter_ms=0.0)
        port, delay_s, per_host = 18842, args.polite_delay, 1
    server = nc.crawl_universe.start_universe(uni, state, work, ["--port", str(port), "--special-frac", "0"])
    rows: list[dict[str, Any]] = []
    try:
        rows.append(nc.crawl_universe.universe_row(site, state))
        manifest = json.loads(Path(json.loads(state.read_text())["manifest"]).read_text())
        job = nc.job_for(manifest, delay_s, per_host)
        for count in args.nodes:
            for mode in args.modes:
                print(f">>> {site}: {count} node(s), {mode}", file=sys.stderr, flush=True)
                point = Point(site, count, mode, args.threads, delay_s, port)
                try:
                    rows.append(point.run(job, state, server.pid, work, args.timeout))
                except (SystemExit, RuntimeError, OSError, redis.RedisError) as exc:
                    rows.append({"site": site, "nodes": count, "mode": mode, "error": str(exc)[-500:]})
    finally:
        nc.crawl_universe.stop_universe(server)
    if all("error" not in row for row in rows):
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f">>> logs of the failed point(s) in {work}", file=sys.stderr)
    return rows


class Point:
    """One measured point: a fresh Redis, N nodes, one job."""

    def __init__(self, site: str, nodes: int, mode: str, threads: int, delay_s: float, port: int) -> None:
        self.site, self.count, self.mode, self.threads = site, nodes, mode, threads
        self.delay_s, self.port = delay_s, port

    def run(self, job: dict[str, Any], state: Path, server_pid: int, work: Path, timeout_s: float) -> dict[str, Any]:
        from cli.local_redis import LocalRedis

        logs = work / f"{self.count}-{self.mode}"
        logs.mkdir()
        pages = Path("/dev/shm") / f"vcrawl-scale-{self.count}-{self.mode}-{time.time_ns()}"
        redis_server = LocalRedis(logs / "redis").start()
        nodes: list[nc.Node] = []
        try:
            env = nc.base_env(redis_server.url, pages)
            tasks = nc.use_cluster(env)
            weight = 100 if self.mode == "ring" else None
            nodes = [nc.Node(f"N{i}", weight, self.threads, env, logs).start() for i in range(self.count)]
            self._wait_ready(tasks, nodes)
            return self._measure(tasks, job, state, server_pid, redis_server, nodes, timeout_s)
        finally:
            nc.stop_all(nodes)
            redis_server.stop()
            shutil.rmtree(pages, ignore_errors=True)

    def _wait_ready(self, tasks: Any, nodes: list[nc.Node]) -> None:
        names = [f"{node.letter}@{socket.gethostname()}" for node in nodes]
        deadline = time.monotonic() + 90
        waiting = set(names)
        while waiting and time.monotonic() < deadline:
            if any(not node.running() for node in nodes):
                raise SystemExit(f"a node exited at start; see {nodes[0].log.parent}")
            waiting -= tasks.ping_workers(sorted(waiting))
        if waiting:
            raise SystemExit(f"nodes {sorted(waiting)} did not answer in 90 s")
        if self.mode == "ring":
            while time.monotonic() < deadline:
                listed = tasks.ring_nodes(with_hosts=False)
                if listed["alive"] == len(nodes):
                    break
                time.sleep(0.5)
            else:
                raise SystemExit("ring nodes not all listed alive in 90 s")
        time.sleep(2)  # every node's view of the ring settles before the job starts

    def _measure(
        self, tasks: Any, job: dict[str, Any], state: Path, server_pid: int, redis_server: Any,
        nodes: list[nc.Node], timeout_s: float,
    ) -> dict[str, Any]:  # fmt: skip
        client = redis.Redis.from_url(redis_server.url)
        worker_pids = [node.pid for node in nodes]
        offset = nc.log_offset(state)

        def snapshot() -> tuple[Any, ...]:
            """Redis INFO; CPU s of the nodes, Redis, the site; machine busy/total s; the bench's own CPU s."""
            return (client.info(), nc.cpu_s(worker_pids), nc.cpu_s([redis_server.pid]), nc.cpu_s([server_pid]),
                    *nc.machine_busy_s(), nc.cpu_s([os.getpid()], descendants=False))  # fmt: skip

        with nc.ConnectionCounter(self.port) as conns:
            info0, w0, r0, s0, busy0, total0, me0 = snapshot()
            t0 = time.monotonic()
            job_id = tasks.start_job(job)
            deadline = t0 + timeout_s
            while tasks.job_state(job_id) not in ("completed", "failed", "cancelled") and time.monotonic() < deadline:
                if any(not node.running() for node in nodes):
                    raise SystemExit(f"a node exited during the run; see {nodes[0].log.parent}")
                time.sleep(0.2)
            wall = time.monotonic() - t0
            info1, w1, r1, s1, busy1, total1, me1 = snapshot()
        final_state = tasks.job_state(job_id)
        time.sleep(1.5)  # the server flushes its access log every second
        score = nc.evaluate(state, offset, self.delay_s or None)
        fetched = max(1, score["reachable_fetched"])
        commands = info1["total_commands_processed"] - info0["total_commands_processed"]
        reads = info1["total_reads_processed"] - info0["total_reads_processed"]
        redis_cpu = r1 - r0
        row: dict[str, Any] = {
            "site": self.site, "nodes": self.count, "mode": self.mode, "threads": self.threads,
            "state": final_state, "wall_s": round(wall, 2), "reachable_fetched": score["reachable_fetched"],
            "pages_per_s": round(score["reachable_fetched"] / wall, 1), "requests": score["requests"],
            "recall": score["recall"], "robots_violations": score["robots_violations"],
            "duplicate_page_fetches": score["duplicate_page_fetches"],
            "worker_cpu_ms_per_page": round(1000 * (w1 - w0) / fetched, 2),
            "worker_cores": round((w1 - w0) / wall, 2),
            "redis_cpu_ms_per_page": round(1000 * redis_cpu / fetched, 3),
            "redis_cores": round(redis_cpu / wall, 3),
            "redis_commands_per_page": round(commands / fetched, 1),
            "redis_requests_per_page": round(reads / fetched, 1),
            "connections": len(conns.seen), "connections_per_page": round(len(conns.seen) / fetched, 3),
            "conn_samples": conns.samples,
            "server_cores": round((s1 - s0) / wall, 2),
            "machine_busy": round((busy1 - busy0) / max(1e-9, total1 - total0), 3),
            "bench_cores": round((me1 - me0) / wall, 2),
            # CPU of everything else on the machine (another user's work shows here)
            "other_cores": round(((busy1 - busy0) - (w1 - w0) - redis_cpu - (s1 - s0) - (me1 - me0)) / wall, 2),
            "redis_saturation_pages_s": round(1000 / max(1e-9, 1000 * redis_cpu / fetched)),
        }  # fmt: skip
        if self.delay_s:
            row["gaps_below_delay"] = score.get("gaps_below_delay")
            row["per_host_bound"] = per_host_bound(state, offset, score["reachable_fetched"], self.delay_s)
        else:
            latency_s = 0.1
            row["concurrency_bound"] = round(self.count * self.threads / latency_s)
        row["limit"] = limit_of(row)
        return row


def per_host_bound(state: Path, offset: int, fetched: int, delay_s: float) -> float:
    """Pages / (the busiest host's requests x its interval, Crawl-delay included): a polite run's bound."""
    busiest_s = nc.crawl_universe.busiest_host_s(state, offset, delay_s)
    return round(fetched / busiest_s, 1) if busiest_s else 0.0


def limit_of(row: dict[str, Any]) -> str:
    """What bounds a point, from its own figures (a rule of thumb; the docs discuss it)."""
    if row["machine_busy"] >= 0.9:
        return (
            f"CPU: machine {row['machine_busy']:.0%} busy (workers {row['worker_cores']}, Redis "
            f"{row['redis_cores']}, site {row['server_cores']}, others {row['other_cores']} cores)"
        )
    if "per_host_bound" in row and row["pages_per_s"] >= 0.8 * row["per_host_bound"]:
        return f"politeness: {row['pages_per_s'] / row['per_host_bound']:.0%} of the per-host bound"
    if "concurrency_bound" in row and row["pages_per_s"] >= 0.6 * row["concurrency_bound"]:
        return f"latency x threads: {row['pages_per_s'] / row['concurrency_bound']:.0%} of nodes x threads / 0.1 s"
    return f"neither CPU ({row['machine_busy']:.0%} busy) nor the site: dispatch/scheduling"


def print_table(rows: list[dict[str, Any]]) -> None:
    """The markdown table of the docs."""
    points = [r for r in rows if "pages_per_s" in r]
    print(
        "\n| site | nodes | queue | pages/s | worker CPU ms/page | Redis CPU ms/page | Redis commands/page "
        "| connections/page | machine busy | other work (cores) | Redis saturates at (pages/s) | limit |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in points:
        print(
            f"| {r['site']} | {r['nodes']} | {r['mode']} | {r['pages_per_s']} | {r['worker_cpu_ms_per_page']} "
            f"| {r['redis_cpu_ms_per_page']} | {r['redis_commands_per_page']} | {r['connections_per_page']} "
            f"| {r['machine_busy']:.0%} | {r['other_cores']} | {r['redis_saturation_pages_s']} | {r['limit']} |"
        )
    for r in rows:
        if "error" in r:
            print(f"\n{r['site']} {r['nodes']} {r['mode']}: ERROR {r['error']}")


if __name__ == "__main__":
    sys.exit(main())
