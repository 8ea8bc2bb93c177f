"""vcrawl against Scrapy (and the ceiling client) on the same local universe, side by side.

Run: ``.venv/bin/python bench/compare.py [--cases a b c d] [--out FILE]`` (``make bench`` runs
all of them; about 12 minutes). Each case starts the universe of ../shared/bench, runs the
kit's Scrapy baseline (and, for (b), its ceiling client) with the kit's own runners, then
vcrawl through the kit's ``measure.py`` with the same politeness settings, and scores every run
from the server's access log against the manifest. Pages go to tmpfs for both crawlers.

Cases (issue 9):
  a  20 hosts x 6k pages, no latency, politeness off (Scrapy C32, 16 per host)
  b  100 hosts, 100 +- 20 ms latency, concurrency 64; ceiling client too
  c  polite: 50 hosts, 0.5 s per host, jitter off; vcrawl with 2 worker processes
  d  scale: vcrawl with 1 and with 2 worker processes on (a)

vcrawl runs two ways. ``vcrawl`` rows: a cluster already running, as a deployment keeps one
(a Redis and N worker processes started before the clock starts); the measured command is
``vcrawl submit --wait``, and measure.py adds the CPU of the Redis and worker process trees over
the run (``--extra-pid``, the kit's way for long-lived helpers). ``vcrawl-embedded`` rows: the
one-command ``vcrawl crawl``, which starts its private Redis and workers inside the measured time
(about 3 s to start, 2 s to stop). The goals are read from the ``vcrawl`` rows.

Prints one JSON line per run, then a table and the ratios against the goals.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import crawl_universe  # noqa: E402  (the universe start/stop helpers, shared with the other benches)

sys.path.insert(0, str(HERE.parent))  # the project itself: its local Redis and worker processes

SHARED = crawl_universe.SHARED
BENCH_PY = crawl_universe.BENCH_PY
VCRAWL = crawl_universe.VCRAWL

UNIVERSES = {
    "a": {"hosts": 20, "pages": 6000, "latency_ms": 0.0, "jitter_ms": 0.0},
    "b": {"hosts": 100, "pages": 6000, "latency_ms": 100.0, "jitter_ms": 20.0},
    "c": {"hosts": 50, "pages": 3000, "latency_ms": 0.0, "jitter_ms": 0.0},
}


def main() -> int:
    """Run the cases, print every run's JSON line, then the comparison table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["a", "d", "b", "c"], choices=["a", "b", "c", "d"])
    parser.add_argument("--out", default="/tmp/vcrawl-compare.jsonl", help="JSON lines of every run")
    parser.add_argument("--timeout", type=float, default=400.0, help="hard stop of one run, seconds")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with open(args.out, "w") as out:
        for universe in ("a", "b", "c"):
            wanted = [case for case in args.cases if UNIVERSES_OF[case] == universe]
            if wanted:
                for row in run_universe(universe, wanted, args.timeout):
                    print(json.dumps(row), flush=True)
                    out.write(json.dumps(row) + "\n")
                    rows.append(row)
    print_table(rows)
    return 0


UNIVERSES_OF = {"a": "a", "d": "a", "b": "b", "c": "c"}


def run_universe(name: str, cases: list[str], timeout_s: float) -> list[dict[str, Any]]:
    """Start one universe and run the cases that use it."""
    work = Path(tempfile.mkdtemp(prefix=f"vcrawl-compare-{name}-"))
    state = work / "state.json"
    server = crawl_universe.start_universe(argparse.Namespace(**UNIVERSES[name]), state, work)
    rows: list[dict[str, Any]] = []
    try:
        runs = []
        if "a" in cases:
            runs += [
                ("a", "scrapy", scrapy(["--concurrency", "32", "--per-host", "16", "--delay", "0"])),
                ("a", "vcrawl", vcrawl(workers=2, threads=16, per_host=16)),
                ("a", "vcrawl-embedded", vcrawl(workers=2, threads=16, per_host=16, embedded=True)),
                ("a", "vcrawl-host", vcrawl(workers=2, threads=16, per_host=16, retry_after="host")),
            ]
        if "d" in cases:
            runs += [
                ("d", "vcrawl-1proc", vcrawl(workers=1, threads=16, per_host=16)),
                *([] if "a" in cases else [("d", "vcrawl", vcrawl(workers=2, threads=16, per_host=16))]),
            ]
        if "b" in cases:
            runs += [
                ("b", "scrapy", scrapy(["--concurrency", "64", "--per-host", "16", "--delay", "0"])),
                ("b", "ceiling", [BENCH_PY, str(SHARED / "ceiling.py"), "--concurrency", "64"]),
                ("b", "vcrawl", vcrawl(workers=2, threads=32, per_host=16)),
            ]
        if "c" in cases:
            polite = ["--delay", "0.5"]
            runs += [
                ("c", "scrapy", scrapy(["--concurrency", "64", "--per-host", "1", *polite, "--jitter", "0"])),
                ("c", "vcrawl", vcrawl(workers=2, threads=32, per_host=1, delay_s=0.5)),
                ("c", "vcrawl-embedded", vcrawl(workers=2, threads=32, per_host=1, delay_s=0.5, embedded=True)),
                ("c", "vcrawl-host", vcrawl(workers=2, threads=32, per_host=1, delay_s=0.5, retry_after="host")),
            ]
        for case, tool, command in runs:
            print(f">>> ({case}) {tool}", file=sys.stderr, flush=True)
            row = run_one(case, tool, command, state, work, timeout_s)
            rows.append(row)
    finally:
        crawl_universe.stop_universe(server)
    return rows


def scrapy(options: list[str]) -> list[str]:
    """The kit's Scrapy baseline runner (it measures itself)."""
    return [str(SHARED / "scrapy_baseline" / "run_scrapy.sh"), *options]


def vcrawl(
    *, workers: int, threads: int, per_host: int, delay_s: float = 0.0, retry_after: str = "url", embedded: bool = False
) -> dict[str, Any]:
    """How to run vcrawl over the whole universe (``run_one`` builds the command)."""
    return {"workers": workers, "threads": threads, "per_host": per_host, "delay_s": delay_s,
            "retry_after": retry_after, "embedded": embedded}  # fmt: skip


class Cluster:
    """A Redis and worker processes started before a measured run and stopped after it, as a
    deployment keeps them running; ``pids`` go to measure.py's ``--extra-pid``."""

    def __init__(self, work: Path, data: Path, workers: int, threads: int) -> None:
        from cli.cluster import LocalWorkers
        from cli.local_redis import LocalRedis
        from vcrawl.settings import Settings

        self.redis = LocalRedis(tempfile.mkdtemp(prefix="redis-", dir=work)).start()
        try:
            settings = Settings(
                redis_url=self.redis.url, data=str(data), allowed_networks=("127.0.0.0/8",), task_events=False
            )
            self.env = {**_clean_env(), **settings.to_env()}
            ping = _pinger(settings)
            self.workers = LocalWorkers(workers, threads, self.env, Path(tempfile.mkdtemp(dir=work)), ping).start()
        except BaseException:
            self.redis.stop()
            raise
        self.pids = [self.redis.pid or 0, *self.workers.pids]

    def redis_cost(self) -> dict[str, float]:
        """Requests, commands and CPU seconds of the cluster's Redis so far."""
        info = redis.Redis.from_url(self.redis.url).info()
        return {"requests": info["total_reads_processed"], "commands": info["total_commands_processed"],
                "cpu_s": float(info["used_cpu_user"]) + float(info["used_cpu_sys"])}  # fmt: skip

    def stop(self) -> None:
        """Stop the workers, then Redis."""
        try:
            self.workers.stop()
        finally:
            self.redis.stop()


def _pinger(settings: Any) -> Any:
    """A ping over this cluster's Redis (each cluster has a Redis of its own)."""
    import tasks

    tasks.configure(settings)
    return tasks.ping_workers


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")}


def run_one(
    case: str, tool: str, run: list[str] | dict[str, Any], state: Path, work: Path, timeout_s: float
) -> dict[str, Any]:
    """Run one crawler (measured by the kit), score it, and add what this comparison needs."""
    pages = Path("/dev/shm") / f"vcrawl-compare-{os.getpid()}-{case}-{tool}"
    log_path = Path(json.loads(state.read_text())["log"])
    offset = log_path.stat().st_size
    env = {**_clean_env(), "BENCH_PY": BENCH_PY}
    cluster: Cluster | None = None
    redis_cost: dict[str, Any] | None = None
    if isinstance(run, dict):
        manifest = json.loads(Path(json.loads(state.read_text())["manifest"]).read_text())
        job_file = work / f"job-{case}-{tool}.json"
        job_file.write_text(json.dumps(job_for(manifest, run["per_host"], run["delay_s"], run["retry_after"])))
        measure = [
            BENCH_PY, str(SHARED / "measure.py"), "--state", str(state), "--pages-dir", str(pages),
            "--timeout", str(timeout_s), "--label", f"{case}-{tool}",
            *(["--delay", str(run["delay_s"])] if run["delay_s"] else []),
        ]  # fmt: skip
        if run["embedded"]:
            command = [
                *measure, "--", str(VCRAWL), "crawl", "--job", str(job_file), "--data", str(pages), "--json",
                "--log-dir", str(work / f"logs-{case}-{tool}"), "--workers", str(run["workers"]),
                "--threads", str(run["threads"]),
                "--allow-network", "127.0.0.0/8",  # the universe is on loopback, which vcrawl refuses by default
            ]  # fmt: skip
        else:
            subprocess.run(["rm", "-rf", str(pages)], check=True)
            pages.mkdir()
            cluster = Cluster(work, pages, run["workers"], run["threads"])
            env.update(cluster.env)
            redis_before = cluster.redis_cost()
            extra = [arg for pid in cluster.pids for arg in ("--extra-pid", str(pid))]
            command = [*measure, "--keep-dir", *extra, "--", str(VCRAWL), "submit", str(job_file), "--wait", "--json"]
    else:
        command = [*run, "--state", str(state), "--label", f"{case}-{tool}", "--timeout", str(timeout_s)]
        command += ["--out", str(pages)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s + 180)
        if cluster is not None:
            after = cluster.redis_cost()
            redis_cost = {key: after[key] - redis_before[key] for key in after}
    finally:
        if cluster is not None:
            cluster.stop()
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        return {"case": case, "tool": tool, "error": f"exit {done.returncode}"}
    row = json.loads(lines[-1])
    for line in lines[:-1]:  # vcrawl's own --json summary comes before measure.py's line
        summary = json.loads(line)
        if "redis" in summary:
            redis_cost = summary["redis"]
    row["case"], row["tool"] = case, tool
    if redis_cost is not None:
        fetched = max(1, row["reachable_fetched"])
        row["redis_requests_per_page"] = round(redis_cost["requests"] / fetched, 2)
        row["redis_commands_per_page"] = round(redis_cost["commands"] / fetched, 2)
        row["redis_cpu_ms_per_page"] = round(1000 * redis_cost["cpu_s"] / fetched, 3)
    if case == "c":
        row.update(per_host_bound(log_path, offset, row, state, delay_s=0.5))
    subprocess.run(["rm", "-rf", str(pages)], check=False)
    return row


def job_for(manifest: dict[str, Any], per_host: int, delay_s: float, retry_after: str) -> dict[str, Any]:
    """The whole universe as one vcrawl job, with the same politeness as the Scrapy run.

    The universe's 429/503 traps throttle single URLs (the host's other pages answer at once),
    and Scrapy does not honour Retry-After at all. The main rows let a Retry-After hold only its
    URL (``retry_after: url``); the ``-host`` rows show vcrawl's default, which pauses the host.
    """
    return {
        "seeds": manifest["seeds"],
        "max_depth": 1000,
        "max_pages": 10 * len(manifest["reachable_pages"]) + 1000,
        "politeness": {"min_interval_s": delay_s, "jitter": 0.0, "per_host": per_host, "retry_after": retry_after},
        "limits": {"retries": 1},  # the universe's 429/503/500 traps never recover
    }


def per_host_bound(log_path: Path, offset: int, row: dict[str, Any], state: Path, delay_s: float) -> dict[str, Any]:
    """The per-host bound of a polite run: pages / (the busiest host's requests x its delay)."""
    manifest = json.loads(Path(json.loads(state.read_text())["manifest"]).read_text())
    crawl_delays = {host: robots["crawl_delay"] or 0.0 for host, robots in manifest["robots"].items()}
    requests: Counter[str] = Counter()
    with open(log_path, "rb") as log:
        log.seek(offset)
        for line in log:
            parts = line.split()
            if len(parts) >= 6:
                requests[parts[2].decode()] += 1
    busiest_s = max((n * max(delay_s, crawl_delays.get(host, 0.0)) for host, n in requests.items()), default=0.0)
    bound = row["reachable_fetched"] / busiest_s if busiest_s else 0.0
    return {"per_host_bound": round(bound, 1), "busiest_host_s": round(busiest_s, 1)}


def print_table(rows: list[dict[str, Any]]) -> None:
    """The side-by-side table and the goals of issue 9."""
    print("\n| case | crawler | pages/s (server) | wall s | CPU ms/page | recall | robots viol. | dup. fetches "
          "| Crawl-delay viol. | gaps < delay | peak RSS MB | Redis req./page | Redis CPU ms/page |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['case']} | {r['tool']} | {r['error']} |")
            continue
        gaps = f"{r['gaps_below_delay']}/{r['gaps_total']}" if "gaps_below_delay" in r else "-"
        print(f"| {r['case']} | {r['tool']} | {r['fetched_per_s']} | {r['wall_s']} | {r['cpu_ms_per_page']} "
              f"| {r['recall']} | {r['robots_violations']} | {r['duplicate_page_fetches']} "
              f"| {r['crawl_delay_violated_hosts']} | {gaps} | {r['peak_rss_mb']} "
              f"| {r.get('redis_requests_per_page', '-')} | {r.get('redis_cpu_ms_per_page', '-')} |")  # fmt: skip
    by = {(r["case"], r["tool"]): r for r in rows if "error" not in r}
    print("\n| goal | measured | met |\n|---|---|---|")

    def goal(name: str, value: float | None, target: float, at_least: bool = True, unit: str = "x") -> None:
        if value is None:
            return
        met = value >= target if at_least else value <= target
        sign = ">=" if at_least else "<="
        print(f"| {name} {sign} {target:g}{unit} | {value:.2f}{unit} | {'yes' if met else 'no'} |")

    a, s = by.get(("a", "vcrawl")), by.get(("a", "scrapy"))
    if a and s:
        goal("(a) pages/s vs Scrapy", a["fetched_per_s"] / s["fetched_per_s"], 3.0)
        goal("(a) CPU/page vs Scrapy", a["cpu_ms_per_page"] / s["cpu_ms_per_page"], 0.5, at_least=False)
        goal("(a) recall", a["recall"], 1.0, unit="")
        goal("(a) robots violations", a["robots_violations"], 0, at_least=False, unit="")
        goal("(a) duplicate page fetches", a["duplicate_page_fetches"], 0, at_least=False, unit="")
    b, ceiling = by.get(("b", "vcrawl")), by.get(("b", "ceiling"))
    if b and ceiling:
        goal("(b) pages/s vs the ceiling client", b["fetched_per_s"] / ceiling["fetched_per_s"], 0.8)
    c = by.get(("c", "vcrawl"))
    if c and c.get("per_host_bound"):
        goal("(c) pages/s vs the per-host bound", c["fetched_per_s"] / c["per_host_bound"], 0.95)
        goal("(c) gaps below the delay", c.get("gaps_below_delay", 0), 0, at_least=False, unit="")
        sc = by.get(("c", "scrapy"))
        if sc and sc.get("per_host_bound"):
            print(f"| (c) Scrapy vs its per-host bound (reference) | {sc['fetched_per_s'] / sc['per_host_bound']:.2f}x "
                  f"| - |")  # fmt: skip
    one, two = by.get(("d", "vcrawl-1proc")), by.get(("a", "vcrawl")) or by.get(("d", "vcrawl"))
    if one and two:
        goal("(d) 2 worker processes vs 1", two["fetched_per_s"] / one["fetched_per_s"], 1.8)


if __name__ == "__main__":
    sys.exit(main())
