"""vcrawl against Scrapy, Crawlee and the ceiling client on the same local sites, side by side.

Run: ``.venv/bin/python bench/compare.py [--cases u t l a d b c e p] [--rounds N] [--out FILE]``
(``make compare`` runs issue 36's cases u, t and l, two rounds interleaved, about 15 minutes;
``bench/run.sh`` runs every case once). Each case starts the universe of ../shared/bench (or, for
(e), a real documentation site: bench/doc_site.py), runs the kit's Scrapy baseline (and, for (a),
its Crawlee baseline; for (b), its ceiling client) with the kit's own runners, then vcrawl through
the kit's ``measure.py`` with the same politeness settings, and scores every run from the
server's access log against the manifest. Pages go to tmpfs for every crawler.

Cases (issues 9, 16, 35 and 36):
  a  20 hosts x 6k pages, no latency, --crawl-delay-frac 0, politeness off (Scrapy C32, 16 per host)
  b  100 hosts, 100 +- 20 ms latency, concurrency 64; ceiling client too
  c  polite: 50 hosts, 0.5 s per host, jitter off; vcrawl with 2 worker processes
  d  scale: vcrawl with 1 and with 2 worker processes on (a)
  e  Debian's python3.11-doc (526 pages reachable) served by Python's http.server, 16 per host
  u  U20 clean (issue 36): 20 hosts x 6k pages, no latency, no trap URLs, no Crawl-delay host;
     Scrapy C32/16, Crawlee C32 uvloop, the ceiling client C64, vcrawl's defaults (the check 09 run)
  t  U20 with its trap URLs (universe (a)): the same runs; what the traps cost, no goal
  l  latency (issue 36): 100 hosts x 6k pages, 100 +- 20 ms, no trap URLs, no Crawl-delay host;
     Scrapy C64/16, Crawlee C64 uvloop, the ceiling client C64, vcrawl's defaults on a running
     cluster (``vcrawl-cluster``: default workers and threads) and through ``vcrawl crawl --job``
  p  polite at scale (issue 35): 200 hosts x 4k pages, no trap URLs, no Crawl-delay, 0.25 s per
     host, one request at a time, jitter off (Scrapy DOWNLOAD_DELAY 0.25, one per domain)

vcrawl runs three ways. ``vcrawl-defaults`` rows: what a new user runs, and exactly what the
acceptance check 09-performance runs: ``vcrawl crawl --job JOB`` with a job that sets only
politeness like Scrapy's, everything else vcrawl's default (``-url``: the same with
``retry_after: url`` instead of the default ``auto``). ``vcrawl`` rows (tuned: a
Retry-After holds only its URL, one retry): a cluster already running, as a deployment keeps one
(a Redis and N worker processes started before the clock starts); the measured command is
``vcrawl submit --wait``, and measure.py adds the CPU of the Redis and worker process trees over
the run (``--extra-pid``, the kit's way for long-lived helpers); ``-host`` differs only in
``retry_after: host``. ``vcrawl-embedded`` rows: the tuned job through the one-command ``vcrawl
crawl``, which starts its private Redis and workers inside the measured time (about 3 s to
start, 2 s to stop).

Prints one JSON line per run, then a table and the ratios against the goals (compare_table.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import compare_table  # noqa: E402  (the table and the goals)
import crawl_universe  # noqa: E402  (the universe start/stop helpers, shared with the other benches)
import doc_site  # noqa: E402  (case (e): the documentation site)

sys.path.insert(0, str(HERE.parent))  # the project itself: its local Redis and worker processes
from cli.cluster import DEFAULT_THREADS, DEFAULT_WORKERS  # noqa: E402  (what `vcrawl crawl` starts)

SHARED = crawl_universe.SHARED
BENCH_PY = crawl_universe.BENCH_PY
VCRAWL = crawl_universe.VCRAWL
CRAWLEE_PY = os.environ.get("CRAWLEE_PY", "/tmp/venv-crawlee/bin/python")  # the kit's Crawlee venv
LOOPBACK = "127.0.0.0/8"  # every site here is on loopback, which vcrawl refuses by default

# Ports of our own, not the kit's default 8800: on a shared machine another session's crawler
# pointed at 8800 once fetched 3000 pages inside a measured run, and the log scores whoever asks.
UNIVERSES = {
    # (a) measures throughput: no Crawl-delay host (its tail would bound the run); (c) keeps them.
    "a": {"hosts": 20, "pages": 6000, "latency_ms": 0.0, "jitter_ms": 0.0, "port": 18871, "no_crawl_delay": True},
    "b": {"hosts": 100, "pages": 6000, "latency_ms": 100.0, "jitter_ms": 20.0, "port": 18872},
    "c": {"hosts": 50, "pages": 3000, "latency_ms": 0.0, "jitter_ms": 0.0, "port": 18873},
    "u": {
        "hosts": 20,
        "pages": 6000,
        "latency_ms": 0.0,
        "jitter_ms": 0.0,
        "port": 18875,
        "no_crawl_delay": True,
        "no_traps": True,
    },
    "l": {
        "hosts": 100,
        "pages": 6000,
        "latency_ms": 100.0,
        "jitter_ms": 20.0,
        "port": 18876,
        "no_crawl_delay": True,
        "no_traps": True,
    },
    "p": {
        "hosts": 200,
        "pages": 4000,
        "latency_ms": 0.0,
        "jitter_ms": 0.0,
        "port": 18874,
        "no_crawl_delay": True,
        "no_traps": True,
    },
}
UNIVERSES_OF = {"a": "a", "d": "a", "t": "a", "b": "b", "c": "c", "e": "e", "p": "p", "u": "u", "l": "l"}
ISSUE_36_CASES = ["u", "t", "l"]  # ``make compare``'s default: the fetch engine's three sites
POLITE_AT_SCALE_S = 0.25


def main() -> int:
    """Run the cases, print every run's JSON line, then the comparison table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--cases",
        nargs="+",
        default=ISSUE_36_CASES,
        choices=sorted(UNIVERSES_OF),
        help="cases to run (default: u t l; the earlier issues' cases a d b c e p on request)",
    )
    parser.add_argument("--tools", nargs="+", help="only these tools' runs (e.g. ceiling vcrawl-cluster)")
    parser.add_argument("--rounds", type=int, default=2, help="run every case this many times, interleaved")
    parser.add_argument("--out", default="/tmp/vcrawl-compare.jsonl", help="JSON lines of every run")
    parser.add_argument("--timeout", type=float, default=400.0, help="hard stop of one run, seconds")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the `finally`s stop what was started
    rows: list[dict[str, Any]] = []
    with open(args.out, "w") as out:
        rounds = [(n, u) for n in range(1, args.rounds + 1) for u in ("u", "a", "l", "b", "c", "e", "p")]
        for round_no, universe in rounds:
            wanted = [case for case in args.cases if UNIVERSES_OF[case] == universe]
            if wanted:
                started = time.monotonic()
                for row in run_universe(universe, wanted, args.timeout, args.tools):
                    row["round"] = round_no
                    print(json.dumps(row), flush=True)
                    out.write(json.dumps(row) + "\n")
                    rows.append(row)
                took = time.monotonic() - started
                print(f">>> cases {' '.join(wanted)}: {took:.0f} s", file=sys.stderr, flush=True)
    compare_table.print_table(rows)
    return 0


@dataclass(frozen=True)
class Vcrawl:
    """How to run vcrawl over a site (``run_one`` builds the command).

    ``defaults``: the acceptance check's run, ``vcrawl crawl --job`` with ``acceptance_job`` (only
    politeness set, plus ``retry_after`` when not None) and no tuning flags. Otherwise the tuned
    ``job_for`` with explicit workers and threads, on a running cluster or ``embedded``.
    ``defaults`` and ``running``: the acceptance check's job on a running cluster of default workers
    and threads (``vcrawl submit --wait``), as a deployment runs it.
    """

    per_host: int
    workers: int = DEFAULT_WORKERS
    threads: int = DEFAULT_THREADS
    delay_s: float = 0.0
    retry_after: str | None = "url"
    embedded: bool = False
    defaults: bool = False
    running: bool = False


def run_universe(name: str, cases: list[str], timeout_s: float, tools: list[str] | None = None) -> list[dict[str, Any]]:
    """Start one universe (or the doc site) and run the cases that use it."""
    if name == "e" and (why := doc_site.unavailable()) is not None:
        return [{"case": "e", "tool": "doc-site", "skipped": why}]
    work = Path(tempfile.mkdtemp(prefix=f"vcrawl-compare-{name}-"))
    state = work / "state.json"
    if name == "e":
        server = doc_site.start_doc_site(work, state)
    else:
        spec = dict(UNIVERSES[name])
        extra = [
            "--port",
            str(spec.pop("port")),
            *(["--crawl-delay-frac", "0"] if spec.pop("no_crawl_delay", 0) else []),
            *(["--special-frac", "0"] if spec.pop("no_traps", 0) else []),
        ]
        server = crawl_universe.start_universe(argparse.Namespace(**spec), state, work, extra)
    rows: list[dict[str, Any]] = []
    try:
        rows.append(doc_site.site_row(state) if name == "e" else crawl_universe.universe_row(name, state))
        for case, tool, command in planned_runs(cases):
            if tools and tool not in tools:
                continue
            print(f">>> ({case}) {tool}", file=sys.stderr, flush=True)
            if isinstance(command, str):  # a baseline that cannot run here
                rows.append({"case": case, "tool": tool, "skipped": command})
                continue
            rows.append(run_one(case, tool, command, state, work, timeout_s))
    finally:
        crawl_universe.stop_universe(server)
    if all("error" not in row for row in rows):
        shutil.rmtree(work, ignore_errors=True)  # kept, with the logs, when a run failed
    else:
        print(f">>> logs of the failed run(s) in {work}", file=sys.stderr)
    return rows


def planned_runs(cases: list[str]) -> list[tuple[str, str, list[str] | Vcrawl | str]]:
    """(case, tool, how) of every run of these cases: a kit command, a Vcrawl, or why it is skipped."""
    runs: list[tuple[str, str, list[str] | Vcrawl | str]] = []
    if "a" in cases:
        runs += [
            ("a", "scrapy", scrapy(["--concurrency", "32", "--per-host", "16", "--delay", "0"])),
            ("a", "crawlee", crawlee(["--concurrency", "32", "--uvloop", "--delay", "0"])),
            ("a", "vcrawl-defaults", Vcrawl(per_host=16, retry_after=None, defaults=True)),
            ("a", "vcrawl-defaults-url", Vcrawl(per_host=16, retry_after="url", defaults=True)),
            ("a", "vcrawl", Vcrawl(per_host=16)),
            ("a", "vcrawl-host", Vcrawl(per_host=16, retry_after="host")),
            ("a", "vcrawl-embedded", Vcrawl(per_host=16, embedded=True)),
        ]
    for case in ("u", "t"):  # U20 clean, and with its trap URLs: the fetch engine against the peers
        if case in cases:
            runs += [
                (case, "scrapy", scrapy(["--concurrency", "32", "--per-host", "16", "--delay", "0"])),
                (case, "crawlee", crawlee(["--concurrency", "32", "--uvloop", "--delay", "0"])),
                (case, "ceiling", [BENCH_PY, str(SHARED / "ceiling.py"), "--concurrency", "64"]),
                (case, "vcrawl-defaults", Vcrawl(per_host=16, retry_after=None, defaults=True)),
            ]
    if "l" in cases:  # at 100 ms the peers get 64 at once, as the ceiling client has
        runs += [
            ("l", "scrapy", scrapy(["--concurrency", "64", "--per-host", "16", "--delay", "0"])),
            ("l", "crawlee", crawlee(["--concurrency", "64", "--uvloop", "--delay", "0"])),
            ("l", "ceiling", [BENCH_PY, str(SHARED / "ceiling.py"), "--concurrency", "64"]),
            ("l", "vcrawl-cluster", Vcrawl(per_host=16, retry_after=None, defaults=True, running=True)),
            ("l", "vcrawl-defaults", Vcrawl(per_host=16, retry_after=None, defaults=True)),
        ]
    if "d" in cases:
        runs += [
            ("d", "vcrawl-1proc", Vcrawl(per_host=16, workers=1)),
            *([] if "a" in cases else [("d", "vcrawl", Vcrawl(per_host=16))]),
        ]
    if "b" in cases:
        runs += [
            ("b", "scrapy", scrapy(["--concurrency", "64", "--per-host", "16", "--delay", "0"])),
            ("b", "ceiling", [BENCH_PY, str(SHARED / "ceiling.py"), "--concurrency", "64"]),
            ("b", "vcrawl", Vcrawl(per_host=16, threads=32)),
        ]
    if "c" in cases:
        polite = ["--delay", "0.5"]
        runs += [
            ("c", "scrapy", scrapy(["--concurrency", "64", "--per-host", "1", *polite, "--jitter", "0"])),
            ("c", "vcrawl", Vcrawl(per_host=1, threads=32, delay_s=0.5)),
            ("c", "vcrawl-embedded", Vcrawl(per_host=1, threads=32, delay_s=0.5, embedded=True)),
            ("c", "vcrawl-host", Vcrawl(per_host=1, threads=32, delay_s=0.5, retry_after="host")),
        ]
    if "p" in cases:
        polite = ["--delay", str(POLITE_AT_SCALE_S), "--jitter", "0"]
        runs += [
            ("p", "scrapy", scrapy(["--concurrency", "64", "--per-host", "1", *polite])),
            ("p", "vcrawl-defaults", Vcrawl(per_host=1, delay_s=POLITE_AT_SCALE_S, retry_after=None, defaults=True)),
            ("p", "vcrawl", Vcrawl(per_host=1, delay_s=POLITE_AT_SCALE_S)),
        ]
    if "e" in cases:  # one host: 16 per host is the whole concurrency for every crawler
        runs += [
            ("e", "scrapy", scrapy(["--concurrency", "32", "--per-host", "16", "--delay", "0"])),
            ("e", "vcrawl-defaults", Vcrawl(per_host=16, retry_after=None, defaults=True)),
            ("e", "vcrawl", Vcrawl(per_host=16)),
        ]
    return runs


def scrapy(options: list[str]) -> list[str]:
    """The kit's Scrapy baseline runner (it measures itself)."""
    return [str(SHARED / "scrapy_baseline" / "run_scrapy.sh"), *options]


def crawlee(options: list[str]) -> list[str] | str:
    """The kit's Crawlee baseline runner, or why it cannot run (its venv is missing or broken)."""
    if not os.access(CRAWLEE_PY, os.X_OK):
        return f"no {CRAWLEE_PY} (bench/run.sh sets it up; the kit README's 'Crawlee baseline')"
    probe = subprocess.run([CRAWLEE_PY, "-c", "import crawlee"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"{CRAWLEE_PY} cannot import crawlee: {probe.stderr.strip().splitlines()[-1:]}"
    return [str(SHARED / "crawlee_baseline" / "run_crawlee.sh"), *options]


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
                redis_url=self.redis.url, data=str(data), allowed_networks=(LOOPBACK,), task_events=False
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


def run_one(case: str, tool: str, run: list[str] | Vcrawl, state: Path, work: Path, timeout_s: float) -> dict[str, Any]:
    """Run one crawler (measured by the kit), score it, and add what this comparison needs."""
    pages = Path("/dev/shm") / f"vcrawl-compare-{os.getpid()}-{case}-{tool}"
    log_path = Path(json.loads(state.read_text())["log"])
    offset = log_path.stat().st_size
    env = {**_clean_env(), "BENCH_PY": BENCH_PY, "CRAWLEE_PY": CRAWLEE_PY}
    cluster: Cluster | None = None
    redis_cost: dict[str, Any] | None = None
    if isinstance(run, Vcrawl):
        measure = [
            BENCH_PY, str(SHARED / "measure.py"), "--state", str(state), "--pages-dir", str(pages),
            "--timeout", str(timeout_s), "--label", f"{case}-{tool}",
            *(["--delay", str(run.delay_s)] if run.delay_s else []),
        ]  # fmt: skip
        command, cluster = vcrawl_command(run, measure, state, work / f"{case}-{tool}", pages, env)
    else:
        command = [*run, "--state", str(state), "--label", f"{case}-{tool}", "--timeout", str(timeout_s)]
        command += ["--out", str(pages)]
    try:
        redis_before = cluster.redis_cost() if cluster is not None else {}
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s + 180)
        if cluster is not None:
            after = cluster.redis_cost()
            redis_cost = {key: after[key] - redis_before[key] for key in after}
    finally:
        if cluster is not None:
            cluster.stop()
        subprocess.run(["rm", "-rf", str(pages)], check=False)
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
    # CPU per page counted server-side (reachable pages served 200), as the acceptance check does:
    # independent of what else a crawler writes into its page store (logs, binaries).
    cpu_s = row["cpu_user_s"] + row["cpu_sys_s"]
    row["cpu_ms_per_fetched"] = round(1000 * cpu_s / max(1, row["reachable_fetched"]), 3)
    if redis_cost is not None:
        fetched = max(1, row["reachable_fetched"])
        row["redis_requests_per_page"] = round(redis_cost["requests"] / fetched, 2)
        row["redis_commands_per_page"] = round(redis_cost["commands"] / fetched, 2)
        row["redis_cpu_ms_per_page"] = round(1000 * redis_cost["cpu_s"] / fetched, 3)
    if case in ("c", "p"):
        row.update(per_host_bound(offset, row, state, delay_s=0.5 if case == "c" else POLITE_AT_SCALE_S))
    return row


def vcrawl_command(
    run: Vcrawl, measure: list[str], state: Path, work: Path, pages: Path, env: dict[str, str]
) -> tuple[list[str], Cluster | None]:
    """The measured vcrawl command of ``run`` (``env`` gains what it needs) and the cluster it runs on."""
    manifest = json.loads(Path(json.loads(state.read_text())["manifest"]).read_text())
    job_file = work.with_name(f"job-{work.name}.json")
    if run.defaults and not run.running:  # byte for byte the acceptance check's command and environment
        job = acceptance_job(manifest, run.retry_after, run.per_host, run.delay_s)
        job_file.write_text(json.dumps(job, indent=1))
        env["VCRAWL_ALLOWED_NETWORKS"] = LOOPBACK
        return [*measure, "--", str(VCRAWL), "crawl", "--job", str(job_file), "--data", str(pages), "--json"], None
    if run.defaults:
        job_file.write_text(json.dumps(acceptance_job(manifest, run.retry_after, run.per_host, run.delay_s)))
    else:
        job_file.write_text(json.dumps(job_for(manifest, run.per_host, run.delay_s, run.retry_after or "host")))
    if run.embedded:
        return [
            *measure, "--", str(VCRAWL), "crawl", "--job", str(job_file), "--data", str(pages), "--json",
            "--log-dir", str(work.with_name(f"logs-{work.name}")), "--workers", str(run.workers),
            "--threads", str(run.threads), "--allow-network", LOOPBACK,
        ], None  # fmt: skip
    subprocess.run(["rm", "-rf", str(pages)], check=True)
    pages.mkdir()
    cluster = Cluster(work.parent, pages, run.workers, run.threads)
    env.update(cluster.env)
    extra = [arg for pid in cluster.pids for arg in ("--extra-pid", str(pid))]
    return [*measure, "--keep-dir", *extra, "--", str(VCRAWL), "submit", str(job_file), "--wait", "--json"], cluster


def acceptance_job(
    manifest: dict[str, Any], retry_after: str | None, per_host: int = 16, delay_s: float = 0.0
) -> dict[str, Any]:
    """The job of the acceptance check 09-performance (its ``job_file ... delay=0 per_host=16``), or of
    24-past-one-redis with ``per_host`` 1 and ``delay_s`` 0.25.

    Politeness like Scrapy's (no delay, 16 per host, robots obeyed); everything else is vcrawl's
    default: retries, backoff, ``retry_after: host``, workers and threads. ``retry_after`` (not
    None) is the one change of the ``-url`` row.
    """
    hosts = sorted({seed.split("/")[2].split(":")[0] for seed in manifest["seeds"]})
    politeness: dict[str, Any] = {"min_interval_s": delay_s, "jitter": 0.0, "per_host": per_host, "obey_robots": True}
    if retry_after is not None:
        politeness["retry_after"] = retry_after
    return {"seeds": manifest["seeds"], "scope": {"hosts": hosts}, "max_depth": 100, "max_pages": 1000000,
            "politeness": politeness, "allowed_networks": [LOOPBACK]}  # fmt: skip


def job_for(manifest: dict[str, Any], per_host: int, delay_s: float, retry_after: str) -> dict[str, Any]:
    """The whole universe as one tuned vcrawl job, with the same politeness as the Scrapy run.

    The universe's 429/503 traps throttle single URLs (the host's other pages answer at once),
    and Scrapy does not honour Retry-After at all. The tuned rows let a Retry-After hold only its
    URL (``retry_after: url``); the ``-host`` rows show vcrawl's default, which pauses the host.
    """
    return {
        "seeds": manifest["seeds"],
        "max_depth": 1000,
        "max_pages": 10 * len(manifest["reachable_pages"]) + 1000,
        "politeness": {"min_interval_s": delay_s, "jitter": 0.0, "per_host": per_host, "retry_after": retry_after},
        "limits": {"retries": 1},  # the universe's 429/503/500 traps never recover
    }


def per_host_bound(offset: int, row: dict[str, Any], state: Path, delay_s: float) -> dict[str, Any]:
    """The per-host bound of a polite run: pages / (the busiest host's requests x its delay)."""
    busiest_s = crawl_universe.busiest_host_s(state, offset, delay_s)
    bound = row["reachable_fetched"] / busiest_s if busiest_s else 0.0
    return {"per_host_bound": round(bound, 1), "busiest_host_s": round(busiest_s, 1)}


if __name__ == "__main__":
    sys.exit(main())
