"""Crawl the shared synthetic web ("universe") with vcrawl and score it; prints one JSON line per run.

Run: ``.venv/bin/python bench/crawl_universe.py [--hosts 20] [--pages 6000] [--workers 2] ...``
(``make bench`` runs it with the defaults). It uses ../shared/bench as it is: ``universe.py
serve`` for the sites, and ``measure.py`` to run ``vcrawl crawl`` and score the server's
access log against the manifest (recall, robots violations, duplicate fetches, per-host
gaps). CPU is that of the whole vcrawl process tree: the CLI, redis-server and the workers.
Pages go to tmpfs (/dev/shm) so disk noise does not blur the CPU figure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = Path(os.environ.get("VCRAWL_BENCH_KIT", REPO.parent / "shared" / "bench"))
BENCH_PY = os.environ.get("BENCH_PY", "/tmp/venv-bench/bin/python")
VCRAWL = REPO / ".venv" / "bin" / "vcrawl"


def main() -> int:
    """Start the universe, crawl it with vcrawl, print the measured JSON line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--pages", type=int, default=6000)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--workers", type=int, default=2, help="vcrawl worker processes")
    parser.add_argument("--threads", type=int, default=16, help="threads per worker process")
    parser.add_argument("--delay", type=float, default=0.0, help="per-host interval (0: politeness off)")
    parser.add_argument("--jitter", type=float, default=0.0, help="per-host interval jitter")
    parser.add_argument("--per-host", type=int, default=16, help="parallel fetches per host when --delay is 0")
    parser.add_argument("--retry-after", choices=("host", "url"), default="host", help="what a Retry-After pauses")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--label", default="vcrawl")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vcrawl-bench-"))
    state = work / "state.json"
    server = start_universe(args, state, work)
    try:
        manifest = json.loads(Path(json.loads(state.read_text())["manifest"]).read_text())
        job = {
            "seeds": manifest["seeds"],
            "max_depth": 1000,
            "max_pages": 10 * len(manifest["reachable_pages"]) + 1000,
            "politeness": {
                "min_interval_s": args.delay,
                "jitter": args.jitter,
                "per_host": args.per_host if args.delay == 0 else 1,
                "retry_after": args.retry_after,
            },
            "limits": {"retries": 1},
        }
        job_file = work / "job.json"
        job_file.write_text(json.dumps(job))
        pages = Path("/dev/shm") / f"vcrawl-bench-{os.getpid()}"
        command = [
            BENCH_PY, str(SHARED / "measure.py"), "--state", str(state), "--pages-dir", str(pages),
            "--timeout", str(args.timeout), "--label", args.label,
            *(["--delay", str(args.delay)] if args.delay else []),
            "--", str(VCRAWL), "crawl", "--job", str(job_file), "--data", str(pages),
            "--log-dir", str(work / "logs"), "--workers", str(args.workers), "--threads", str(args.threads),
            "--allow-network", "127.0.0.0/8",  # the universe is on loopback, which vcrawl refuses by default
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")}
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout + 120)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            return done.returncode
        print(done.stdout.strip().splitlines()[-1], flush=True)
        subprocess.run(["rm", "-rf", str(pages)], check=False)
        return 0
    finally:
        stop_universe(server)


def start_universe(
    args: argparse.Namespace, state: Path, work: Path, extra: list[str] | None = None
) -> subprocess.Popen[bytes]:
    command = [
        BENCH_PY, str(SHARED / "universe.py"), "serve", "--state", str(state), "--hosts", str(args.hosts),
        "--pages", str(args.pages), "--latency-ms", str(args.latency_ms), "--jitter-ms", str(args.jitter_ms),
        *(extra or []),
    ]  # fmt: skip
    if args.latency_ms:
        command += ["--engine", "aiohttp"]
    with open(work / "serve.out", "wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300  # the first start of a universe generates its files
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"universe server exited: {(work / 'serve.out').read_text()[-2000:]}")
        if state.exists() and b'"ready"' in (work / "serve.out").read_bytes():
            return server
        time.sleep(0.2)
    stop_universe(server)
    raise SystemExit("universe server did not become ready")


def stop_universe(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)


def universe_row(name: str, state: Path) -> dict[str, object]:
    """The JSON line describing a universe: its size and its Crawl-delay hosts, which bound a run.

    The kit makes ``max(1, round(hosts x frac))`` Crawl-delay hosts, so ``--crawl-delay-frac 0``
    can still leave one (a 15-page host at 1 s in (a): no run can be shorter than about 15 s).
    """
    st = json.loads(state.read_text())
    manifest = json.loads(Path(st["manifest"]).read_text())
    delayed = {host: robots["crawl_delay"] for host, robots in manifest["robots"].items() if robots["crawl_delay"]}
    polite_s = max(manifest["min_polite_time_s"].values(), default=0.0)
    note = (f"universe {st['tag']} on port {manifest['port']}: {len(manifest['hosts'])} hosts, "
            f"{len(manifest['reachable_pages'])} reachable pages, {len(delayed)} Crawl-delay host(s)"
            + (f" ({', '.join(f'{h} {d:g} s' for h, d in delayed.items())}): a polite run takes >= {polite_s:g} s"
               if delayed else ""))  # fmt: skip
    return {"case": name, "tool": "site", "site": st["tag"], "note": note, "crawl_delay_hosts": delayed,
            "reachable_pages": len(manifest["reachable_pages"]), "min_polite_time_s": polite_s}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())


def busiest_host_s(state: Path, offset: int, delay_s: float) -> float:
    """Seconds the busiest host needs for its requests of a run: requests x its interval (its
    Crawl-delay when longer), from the universe's access log after ``offset``; a polite run's bound
    is the pages fetched over this."""
    from collections import Counter

    st = json.loads(Path(state).read_text())
    manifest = json.loads(Path(st["manifest"]).read_text())
    crawl_delays = {host: robots["crawl_delay"] or 0.0 for host, robots in manifest["robots"].items()}
    requests: Counter[str] = Counter()
    with open(st["log"], "rb") as log:
        log.seek(offset)
        for line in log:
            parts = line.split()
            if len(parts) >= 6:
                requests[parts[2].decode()] += 1
    return max((n * max(delay_s, crawl_delays.get(host, 0.0)) for host, n in requests.items()), default=0.0)
