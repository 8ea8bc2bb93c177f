"""Redis broker against RabbitMQ broker on the same job (issue 39): pages/s, a killed worker, a restarted broker.

Run: ``.venv/bin/python bench/brokers.py [--rounds 3] [--brokers redis rabbitmq]
[--scenarios undisturbed kill restart] [--out FILE]`` (``bench/run.sh brokers ...``). It measures the
checkout it lives in. A full run (3 rounds, 2 brokers, 3 scenarios: 18 jobs) takes about 15-20 minutes.

Every run is a fresh cluster as the acceptance check 26-rabbitmq starts one, shipped settings otherwise:
``redis-server`` with AOF on a free loopback port (``cli.local_redis``); for ``rabbitmq`` also a private
RabbitMQ node (``tests/rabbitmq.py``'s ``LocalRabbitMQ``: own ports, data directory and epmd) and
``VCRAWL_BROKER_URL`` pointing at it, Redis keeping the frontier, results and the rest; two download workers
(every queue but ``analysis``) and one analysis worker, each a plain ``celery -A tasks worker -Q ... -n X@%h
-l warning`` (the shipped pool and concurrency); one job submitted with ``vcrawl submit`` over the kit's
universe (10 hosts, 2,000 pages, ``--special-frac 0 --crawl-delay-frac 0``), politeness 0.05 s and 2 per
host. The disturbance comes when the job has analysed ``--at-analysed`` pages (1,000 of about 2,000:
mid-job), the same moment of the job for both brokers:

  undisturbed  nothing: pages/s (pages stored / seconds from the submission to ``completed``), the CPU of
               the workers and of the broker(s) over that time, and the seconds from the mark to completion
               (the rest of the job: what the other scenarios add to).
  kill         a download worker (d1) SIGKILLed (its whole process group), a replacement (d3) started at once.
  restart      the broker restarted: Redis stopped (SIGTERM: AOF written), 1 s down, started again on the
               same port and directory (the acceptance checks' restart; on the Redis broker this is also
               the frontier's Redis); RabbitMQ stopped with ``rabbitmqctl stop`` and started again on the
               same ports and data (Redis untouched).

Per run one JSON line: seconds from the disturbance to completion (``after_s``), the broker's time down,
the longest stall after it (no page stored and no analysis finished), the whole job's seconds, pages/s,
recall, pages fetched twice and robots violations from the kit's ``universe.evaluate``, and the load
average. Rounds are interleaved (each round runs every scenario on every broker, the broker order
alternating), so both brokers meet the machine's load at the same moments. At the end a table of medians
and [min-max] per broker and scenario and one JSON summary line. A recall below 1.0 is a finding: the
run's logs are kept and named.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))  # the project itself: its local Redis, the tasks façade, the RabbitMQ harness
import crawl_universe  # noqa: E402  (universe start/stop, shared with the other benches)
import dead_worker  # noqa: E402  (the cluster of a run: Redis, plain workers, a Redis restart)
import node_cluster as nc  # noqa: E402  (job file, scoring, CPU of process trees, the tasks façade)

from celeryconfig import ANALYSIS_QUEUE  # noqa: E402
from tests.rabbitmq import LocalRabbitMQ  # noqa: E402

BROKERS = ("redis", "rabbitmq")
SCENARIOS = ("undisturbed", "kill", "restart")
UNIVERSE = ["--special-frac", "0", "--crawl-delay-frac", "0"]  # no Retry-After or Crawl-delay tail
DELAY_S, PER_HOST = 0.05, 2  # the acceptance check's job_file delay=0.05 per_host=2
POLL_S = 0.25


class Cluster(dead_worker.Cluster):
    """Redis (and, for ``rabbitmq``, a RabbitMQ node) and the three workers of one run: dead_worker's
    cluster, its workers run as the acceptance check runs them (Celery's own pool and start-up)."""

    def __init__(self, broker: str, logs: Path, data: Path, label: str) -> None:
        super().__init__(logs, data)
        self.broker = broker
        self.rabbit: LocalRabbitMQ | None = None
        if broker == "rabbitmq":  # the broker is what a user adds: VCRAWL_BROKER_URL
            self.rabbit = LocalRabbitMQ(logs / "rabbitmq", name=label)
            self.rabbit.start()
            self.env["VCRAWL_BROKER_URL"] = self.rabbit.url
            self.tasks = nc.use_cluster(self.env)

    def start_worker(self, name: str, role: str, **options: Any) -> dead_worker.Worker:
        level = os.environ.get("BENCH_WORKER_LOG_LEVEL", "warning")  # info: a diagnosis (skipped batches)
        return super().start_worker(name, role, options=[], level=level)

    def restart_broker(self) -> None:
        if self.rabbit is not None:
            self.rabbit.restart()  # rabbitmqctl stop, then start on the same ports and data directory
            return
        self.restart_redis()

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of the live workers (with their pool children), Redis, and the RabbitMQ node."""
        alive = [w.process.pid for w in self.workers.values() if w.process.poll() is None]
        out = {"workers": nc.cpu_s(alive), "redis": nc.cpu_s([self.redis.pid] if self.redis.pid else [])}
        server = getattr(self.rabbit, "_server", None)  # the node's rabbitmq-server script: beam.smp below it
        if server is not None and server.poll() is None:
            out["rabbitmq"] = nc.cpu_s([server.pid])
        return out

    def broker_state(self) -> dict[str, Any]:
        """What the broker holds now, per vcrawl queue: messages ready, delivered but unacknowledged, consumers."""
        if self.rabbit is not None:
            columns = ("name", "messages_ready", "messages_unacknowledged", "consumers")
            listing = self.rabbit.ctl("list_queues", *columns, "--quiet", "--no-table-headers")
            rows = [line.split() for line in listing.stdout.decode(errors="replace").splitlines()]
            return {row[0]: dict(zip(columns[1:], map(int, row[1:]), strict=True)) for row in rows if len(row) == 4}
        try:
            held = nc_redis_held(self.redis.url)
        except Exception as exc:  # a diagnosis: say why there is none
            return {"error": repr(exc)}
        return held

    def rabbitmq_queues(self) -> list[str] | None:
        """The queues the RabbitMQ node holds (vcrawl's must be there: VCRAWL_BROKER_URL taken); None on Redis."""
        if self.rabbit is None:
            return None
        listing = self.rabbit.ctl("list_queues", "name", "--quiet", "--no-table-headers")
        return sorted(line for line in listing.stdout.decode(errors="replace").split() if not line.startswith("celery"))

    def stop(self) -> None:
        super().stop()
        if self.rabbit is not None:
            self.rabbit.stop()


def nc_redis_held(url: str) -> dict[str, Any]:
    """On the Redis broker: messages waiting per queue list and kombu's ``unacked`` hash size."""
    import redis

    from celeryconfig import DOWNLOAD_QUEUE, queue_lists

    with redis.Redis.from_url(url, socket_timeout=5) as client:
        out: dict[str, Any] = {q: sum(client.llen(n) for n in queue_lists(q)) for q in (DOWNLOAD_QUEUE, ANALYSIS_QUEUE)}
        out["unacked"] = client.hlen("unacked")
        return out


def _status(cluster: Cluster, job_id: str) -> dict[str, Any] | None:
    try:
        return cluster.tasks.job_status(job_id, with_outputs=False)
    except Exception:  # Redis restarting: ask again on the next poll
        return None


class Run:
    """One job on a fresh cluster of one broker, and one disturbance; ``measure`` returns its JSON row."""

    def __init__(self, broker: str, scenario: str, index: int, args: argparse.Namespace) -> None:
        self.broker, self.scenario, self.index, self.args = broker, scenario, index, args
        self.notes: list[str] = []

    def measure(self, state: Path, job_file: Path, work: Path) -> dict[str, Any]:
        logs = work / f"{self.broker}-{self.scenario}-{self.index}"
        logs.mkdir(parents=True)
        data = logs / "data"
        label = f"bench-brokers-{os.getpid()}-{self.index}-{self.scenario}"
        cluster = Cluster(self.broker, logs, data, label)
        try:
            for name, role in (("d1", "download"), ("d2", "download"), ("a1", "analysis")):
                cluster.start_worker(name, role)
            cluster.wait_ready()
            offset = nc.log_offset(state)
            cpu0 = cluster.cpu()
            t0 = time.monotonic()
            job_id = nc.vcrawl(cluster.env, "submit", str(job_file)).strip().splitlines()[-1]
            ended = self._wait_mark(cluster, job_id, t0)
            tk = time.monotonic()
            down_s = None
            if ended is not None:
                self.notes.append(f"job {ended} before {self.args.at_analysed} pages were analysed")
            else:
                down_s = self._disturb(cluster)
            t1, status, stall_s = self._follow(cluster, job_id, tk)
            cpu1 = cluster.cpu()
            held = cluster.broker_state()  # a stuck job's diagnosis; on a completed one, what was left over
            time.sleep(1.5)  # the universe flushes its access log every second
            score = nc.evaluate(state, offset, None)
            done = status.get("state") == "completed"
            stored = int(status.get("pages_stored") or 0)
            cpu = {f"cpu_{k}_s": round(cpu1[k] - cpu0.get(k, 0.0), 2) for k in cpu1}
            return {
                "bench": "brokers", "broker": self.broker, "scenario": self.scenario, "round": self.index,
                "commit": commit(), "job": job_id, "state": status.get("state"), "completed": done,
                "mark_s": round(tk - t0, 1), "broker_down_s": down_s,
                "after_s": round(t1 - tk, 1) if done else None, "total_s": round(t1 - t0, 1) if done else None,
                "longest_stall_s": round(stall_s, 1), "pages_stored": stored,
                "pages_per_s": round(stored / (t1 - t0), 1) if done else None,
                **cpu, "worker_cpu_ms_per_page": round(1000 * cpu["cpu_workers_s"] / stored, 2) if stored else None,
                "queues_on_rabbitmq": cluster.rabbitmq_queues(),
                "pending": status.get("pending"), "queued": status.get("queued"),
                "in_flight_batches": status.get("in_flight_batches"), "broker_held": held, "recall": score["recall"],
                "fetched_twice": score["duplicate_page_fetches"], "robots_violations": score["robots_violations"],
                "requests": score["requests"], "loadavg": [round(x, 2) for x in os.getloadavg()],
                "notes": self.notes, "logs": str(logs),
            }  # fmt: skip
        finally:
            cluster.stop()
            shutil.rmtree(data, ignore_errors=True)
            shutil.rmtree(logs / "redis" / "appendonlydir", ignore_errors=True)  # 30 MB a run; redis.log stays
            shutil.rmtree(logs / "rabbitmq" / "mnesia", ignore_errors=True)  # its logs stay

    def _wait_mark(self, cluster: Cluster, job_id: str, t0: float) -> str | None:
        """Until the job has analysed ``--at-analysed`` pages (bounded); its state if it ended before."""
        while time.monotonic() - t0 < self.args.give_up_s:
            status = _status(cluster, job_id)
            if status is not None:
                if status.get("state") not in (None, "running"):
                    return str(status.get("state"))
                if int(status.get("analysed") or 0) >= self.args.at_analysed:
                    return None
            time.sleep(POLL_S)
        return "still short of the mark"

    def _disturb(self, cluster: Cluster) -> float | None:
        """The scenario's disturbance; the broker's seconds away for ``restart``."""
        if self.scenario == "kill":
            cluster.workers["d1"].sigkill()
            cluster.start_worker("d3", "download")
            self.notes.append("SIGKILL d1 (process group), d3 started")
        elif self.scenario == "restart":
            started = time.monotonic()
            cluster.restart_broker()
            self.notes.append(f"{self.broker} stopped and started on the same port(s) and data")
            return round(time.monotonic() - started, 1)
        return None

    def _follow(self, cluster: Cluster, job_id: str, tk: float) -> tuple[float, dict[str, Any], float]:
        """Until the job is no longer running or ``--give-up-s`` after ``tk`` (``dead_worker.follow_job``)."""
        return dead_worker.follow_job(lambda: _status(cluster, job_id), tk, self.args.give_up_s, poll_s=POLL_S)


def commit() -> str:
    done = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return done.stdout.strip()


def _spread(values: list[float], digits: int = 1) -> str:
    if not values:
        return "-"
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}]"


def summary(rows: list[dict[str, Any]], brokers: list[str], scenarios: list[str]) -> tuple[str, dict[str, Any]]:
    """A markdown table (median [min-max] per broker and scenario) and the same figures as one dict."""
    lines = [
        "| broker | scenario | runs | completed | pages/s | s after the disturbance | broker down s | longest stall s "
        "| worker CPU ms/page | broker CPU s | recall min | fetched twice | robots viol. |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    figures: dict[str, Any] = {}
    for broker in brokers:
        for scenario in scenarios:
            mine = [row for row in rows if row["broker"] == broker and row["scenario"] == scenario]
            if not mine:
                continue
            done = [row for row in mine if row["completed"]]

            def values(key: str, among: list[dict[str, Any]] = done) -> list[float]:
                return [row[key] for row in among if row.get(key) is not None]

            broker_cpu = [row.get("cpu_rabbitmq_s", 0.0) + row.get("cpu_redis_s", 0.0) for row in done]
            figures[f"{broker}/{scenario}"] = {
                "runs": len(mine), "completed": len(done), "pages_per_s": values("pages_per_s"),
                "after_s": values("after_s"), "broker_down_s": values("broker_down_s", mine),
                "longest_stall_s": values("longest_stall_s", mine), "worker_cpu_ms_per_page":
                values("worker_cpu_ms_per_page"), "broker_cpu_s": [round(v, 2) for v in broker_cpu],
                "recall": values("recall", mine), "fetched_twice": values("fetched_twice", mine),
                "robots_violations": sum(values("robots_violations", mine)),
            }  # fmt: skip
            lines.append(
                f"| {broker} | {scenario} | {len(mine)} | {len(done)} | {_spread(values('pages_per_s'))} "
                f"| {_spread(values('after_s'))} | {_spread(values('broker_down_s', mine))} "
                f"| {_spread(values('longest_stall_s', mine))} | {_spread(values('worker_cpu_ms_per_page'), 2)} "
                f"| {_spread(broker_cpu)} | {min(values('recall', mine), default=0):.4f} "
                f"| {_spread(values('fetched_twice', mine), 0)} | {int(sum(values('robots_violations', mine)))} |"
            )
    return "\n".join(lines), figures


def main() -> int:
    """Start the universe, run the rounds (interleaved), print a JSON line per run, the table and a summary."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", nargs="+", choices=BROKERS, default=list(BROKERS))
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every scenario on every broker")
    parser.add_argument("--at-analysed", type=int, default=1000, help="pages analysed when the disturbance comes")
    parser.add_argument("--give-up-s", type=float, default=75.0, help="a run not completed this long after the "
                        "disturbance counts as not completed")  # fmt: skip
    parser.add_argument("--port", type=int, default=18839, help="the universe's port (files generated once per port)")
    parser.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (worker and broker logs)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vcrawl-brokers-"))
    state = work / "state.json"
    site = SimpleNamespace(hosts=10, pages=2000, latency_ms=0.0, jitter_ms=0.0)
    load_start = [round(x, 2) for x in os.getloadavg()]
    server = crawl_universe.start_universe(site, state, work, [*UNIVERSE, "--port", str(args.port)])  # type: ignore[arg-type]
    rows: list[dict[str, Any]] = []
    try:
        manifest = json.loads(Path(json.loads(state.read_text())["manifest"]).read_text())
        job_file = work / "job.json"
        job_file.write_text(json.dumps(nc.job_for(manifest, DELAY_S, PER_HOST)))
        for index in range(args.rounds):
            for scenario in args.scenarios:
                order = args.brokers if index % 2 == 0 else list(reversed(args.brokers))
                for broker in order:
                    row = Run(broker, scenario, index, args).measure(state, job_file, work)
                    rows.append(row)
                    line = json.dumps(row)
                    print(line, flush=True)
                    if args.out is not None:
                        with open(args.out, "a") as out:
                            out.write(line + "\n")
        table, figures = summary(rows, args.brokers, args.scenarios)
        load_end = [round(x, 2) for x in os.getloadavg()]
        print(f"\ncommit {commit()}; load average at start {load_start}, at end {load_end}\n{table}", flush=True)
        print(json.dumps({"bench": "brokers", "summary": figures, "commit": commit(), "rounds": args.rounds,
                          "at_analysed": args.at_analysed, "loadavg_start": load_start, "loadavg_end": load_end}),
              flush=True)  # fmt: skip
        return 0
    finally:
        crawl_universe.stop_universe(server)
        # The logs of a run that did not complete, or missed pages, are what its diagnosis needs.
        if args.keep or not rows or not all(row["completed"] and row["recall"] >= 1.0 for row in rows):
            print(f"logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
