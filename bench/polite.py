"""A polite page against an impolite one on the same workers (issue 35): pages/s, and Redis commands
and CPU per page, the frontier's Redis apart from the broker's, with the commands that make them.

Run: ``.venv/bin/python bench/polite.py [--quick] [--shared]``. Each job gets a fresh broker Redis
and a fresh frontier Redis (``VCRAWL_FRONTIER_URL``; ``--shared``: one Redis for both, as before
issue 35) and two plain ``celery -A tasks worker -Q download,download.dynamic,analysis`` processes
at the shipped pool and concurrency, then the job is started through the tasks façade (what
``vcrawl submit`` calls) and timed until ``completed``. The jobs are those of issue 35, over the
kit's universe (no trap URLs, no Crawl-delay, zero latency: nginx):

  impolite  20 hosts, 4000 pages, ``min_interval_s`` 0, 16 per host
  polite    200 hosts, 4000 pages, 0.25 s per host, one request at a time, jitter 0 (bound:
            200 hosts x 4 pages/s = 800 pages/s)

Measured between the job's start and its end (``INFO commandstats`` and ``INFO cpu`` of each Redis,
``/proc`` for the workers): pages (stored), pages/s, commands per page (the commands scripts run
count one each, as Redis counts them), Redis CPU ms per page, workers' CPU ms per page, and the
frontier's ten busiest commands per page. ``--quick``: 1000 pages each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import crawl_universe as cu
import node_cluster as nc

from cli.local_redis import LocalRedis

JOBS = {
    "impolite": {"hosts": 20, "delay_s": 0.0, "per_host": 16},
    "polite": {"hosts": 200, "delay_s": 0.25, "per_host": 1},
}
DONE_LIMIT_S = 900.0


def redis_sample(url: str) -> dict[str, Any]:
    """Commands by name (calls) and CPU seconds of the Redis at ``url``."""
    with redis.Redis.from_url(url) as client:
        stats = client.info("commandstats")
        cpu = client.info("cpu")
    calls = {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}
    return {"calls": calls, "cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])}


def cost(before: dict[str, Any], after: dict[str, Any], pages: int) -> dict[str, Any]:
    """Per page: commands, CPU ms, and the ten commands called most."""
    calls = {name: n - before["calls"].get(name, 0) for name, n in after["calls"].items()}
    top = sorted(((n, name) for name, n in calls.items() if n > 0), reverse=True)[:10]
    return {
        "commands_per_page": round(sum(calls.values()) / pages, 1),
        "cpu_ms_per_page": round((after["cpu_s"] - before["cpu_s"]) * 1000 / pages, 3),
        "top": {name: round(n / pages, 2) for n, name in top},
    }


CORES = os.cpu_count() or 1


def run_job(name: str, pages: int, shared: bool, work: Path) -> dict[str, Any]:
    shape = JOBS[name]
    args = argparse.Namespace(hosts=shape["hosts"], pages=pages, latency_ms=0, jitter_ms=0)
    state = work / f"uni-{name}.json"
    extra = ["--special-frac", "0", "--crawl-delay-frac", "0", "--port", "18835"]
    server = cu.start_universe(args, state, work, extra)
    broker = LocalRedis(work / f"{name}-broker").start()
    frontier = broker if shared else LocalRedis(work / f"{name}-frontier").start()
    nodes: list[nc.Node] = []
    try:
        env = nc.base_env(broker.url, Path(tempfile.mkdtemp(prefix=f"polite-{name}-", dir="/dev/shm")))
        if not shared:
            env["VCRAWL_FRONTIER_URL"] = frontier.url
        env.pop("VCRAWL_NODE_WEIGHT", None)
        nodes = [nc.Node(letter, None, None, env, work).start() for letter in "ab"]  # the shipped pool
        time.sleep(6)  # the workers are up (as the acceptance checks wait)
        tasks = nc.use_cluster(env)
        manifest = json.loads(Path(json.loads(state.read_text())["manifest"]).read_text())
        job = nc.job_for(manifest, shape["delay_s"], shape["per_host"])
        front0, broker0 = redis_sample(frontier.url), redis_sample(broker.url)
        cpu0, machine0 = nc.cpu_s([node.pid for node in nodes]), nc.machine_busy_s()  # each process once
        started = time.monotonic()
        job_id = tasks.start_job(job)
        status: dict[str, Any] = {}
        while time.monotonic() - started < DONE_LIMIT_S:
            status = tasks.job_status(job_id) or {}
            if status.get("state") not in (None, "running"):
                break
            time.sleep(0.5)
        wall = time.monotonic() - started
        front1, broker1 = redis_sample(frontier.url), redis_sample(broker.url)
        cpu1, machine1 = nc.cpu_s([node.pid for node in nodes]), nc.machine_busy_s()
        stored = int(status.get("pages_stored", 0)) or 1
        row = {
            "job": name, "state": status.get("state"), "pages": stored, "wall_s": round(wall, 1),
            "pages_s": round(stored / wall, 1), "workers_cpu_ms_per_page": round((cpu1 - cpu0) * 1000 / stored, 2),
            # the machine's cores busy on average: near their number, CPU bounds the rate
            "machine_busy_cores": round((machine1[0] - machine0[0]) / (machine1[1] - machine0[1]) * CORES, 2),
            "frontier": cost(front0, front1, stored), "shared_redis": shared,
        }  # fmt: skip
        if not shared:
            row["broker"] = cost(broker0, broker1, stored)
        return row
    finally:
        nc.stop_all(nodes)
        if frontier is not broker:
            frontier.stop()
        broker.stop()
        cu.stop_universe(server)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1000 pages per job")
    parser.add_argument("--shared", action="store_true", help="one Redis for the broker and the frontier")
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    args = parser.parse_args()
    pages = 1000 if args.quick else 4000
    rows = []
    with tempfile.TemporaryDirectory(prefix="vcrawl-polite-") as tmp:
        for name in args.jobs:
            row = run_job(name, pages, args.shared, Path(tmp))
            print(json.dumps(row), flush=True)
            rows.append(row)
    if len(rows) == 2:
        print(f"polite / impolite pages/s: {rows[1]['pages_s'] / rows[0]['pages_s']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
