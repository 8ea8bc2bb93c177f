"""The embedded runner behind ``vcrawl crawl``, ``vcrawl demo`` and ``vcrawl resume``.

A private redis-server (unless ``VCRAWL_REDIS_URL`` is set) and N local ``celery worker``
processes run one job, with a progress line and a summary at the end. With a local storage
root the private Redis keeps its data in ``DATA/.vcrawl-redis/`` (AOF, fsync every second),
so Ctrl-C or SIGTERM *pauses* the job: nothing more is dispatched, work in flight gets a
grace time to finish (what does not is redelivered later, ``acks_late``), the workers and then
Redis stop cleanly, and ``vcrawl resume JOB --data DATA`` goes on where it stopped. A second
Ctrl-C stops at once.

The cluster is reached through the ``tasks`` façade, imported where it is used: ``tasks`` reads
the configuration when imported, and the command line reports a broken one itself.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import logging
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cli.cluster import DEFAULT_THREADS, DEFAULT_WORKERS
from cli.progress import follow, redis_cost, report, summary_of
from cli.saved_state import RedisHome
from vcrawl import names
from vcrawl.errors import ConfigError
from vcrawl.jobs import JobSpec
from vcrawl.settings import Settings, child_environment
from vcrawl.targets.broker import redacted

__all__ = [
    "EXIT_INTERRUPTED",
    "add_network_option",
    "add_run_options",
    "allowing",
    "resume_job_locally",
    "run_job_locally",
    "uses_private_redis",
]

logger = logging.getLogger("vcrawl")

EXIT_INTERRUPTED = 130
_DEFAULT_GRACE_S = 4.0  # in-flight work may finish; then workers are stopped, by force if need be
_MIN_STOP_S = 2.0  # a warm shutdown of idle workers still takes a moment
_START_PING_S = 0.1  # a round of the start's pings; a worker that is up answers in milliseconds
_WORKER_STOP_S = 10.0  # at the end of a run: workers ship their records and WARC files
_REDIS_STOP_S = 60.0  # a clean Redis shutdown writes the AOF; never cut it short lightly
_REDIS_START_S = 300.0  # a big saved state takes a while to load (Redis answers LOADING meanwhile)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of a local run (``crawl``, ``demo``, ``resume``)."""
    parser.add_argument("--data", help="storage root (default: $VCRAWL_DATA or ./crawl-data)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary as the last stdout line")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="worker processes (one per core)")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                        help=f"threads per worker process (default {DEFAULT_THREADS})")  # fmt: skip
    parser.add_argument("--timeout", type=float, help="cancel the job after S seconds (default: no limit)")
    parser.add_argument("--grace", type=float, default=_DEFAULT_GRACE_S, metavar="S",
                        help=f"on Ctrl-C, seconds left to work in flight (default {_DEFAULT_GRACE_S:g})")  # fmt: skip
    parser.add_argument("--log-dir", type=Path, help="worker logs (default: DATA/logs)")


def add_network_option(parser: argparse.ArgumentParser) -> None:
    """``--allow-network CIDR`` (``crawl`` and ``resume``)."""
    parser.add_argument("--allow-network", action="append", metavar="CIDR", type=_network,
                        help="let this run's workers also fetch from CIDR (e.g. a private network)")  # fmt: skip


def _network(value: str) -> str:
    """A CIDR from the command line (argparse reports a bad one and exits with 2)."""
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a CIDR network: {value!r}") from None


def allowing(settings: Settings, networks: list[str]) -> Settings:
    """``settings`` whose workers may also fetch from ``networks`` (the cluster list: a job's can only narrow it)."""
    return replace(settings, allowed_networks=(*settings.allowed_networks, *networks)) if networks else settings


def uses_private_redis(settings: Settings) -> bool:
    """True unless ``VCRAWL_REDIS_URL`` names a cluster's Redis.

    Raises:
        ConfigError: ``VCRAWL_FRONTIER_URL`` without ``VCRAWL_REDIS_URL`` (a private run keeps its whole
            state in its own Redis, so that ``vcrawl resume`` finds it there).
    """
    if settings.is_given("redis_url"):
        return False
    if settings.frontier_url is not None:
        raise ConfigError("VCRAWL_FRONTIER_URL is set but VCRAWL_REDIS_URL is not: a run on the embedded default "
                          "keeps the frontier in its private Redis; set both to use a cluster's")  # fmt: skip
    return True


def run_job_locally(spec: JobSpec, settings: Settings, args: argparse.Namespace) -> int:
    """Run a new job to its end on the embedded default; return the exit code.

    Raises:
        ConfigError: the settings cannot run a crawl (before anything is started).
    """
    import tasks

    tasks.check_job_secrets(spec, settings)  # its workers get these settings: a missing secret is known now
    run = _LocalRun(settings, args)
    try:
        with run.stack:
            code = run.open_redis(resuming=False)
            if code is not None:
                return code
            run.park_earlier_jobs()
            run.start_workers()

            def begin() -> str:
                job_id = tasks.start_job(spec)
                print(f"job {job_id}: {len(spec.seeds)} seed(s), depth {spec.max_depth}{run.resume_hint(job_id)}",
                      file=sys.stderr)  # fmt: skip
                return job_id

            return run.follow_to_end(begin)
    except KeyboardInterrupt:  # a signal while starting up; everything started is stopped again
        print("\ninterrupted before the job started", file=sys.stderr)
        return EXIT_INTERRUPTED


def resume_job_locally(job_id: str, settings: Settings, args: argparse.Namespace) -> int:
    """Restart the private Redis of ``--data`` from its saved state and run a job there to its end.

    Raises:
        ConfigError: the settings cannot run a crawl (before anything is started).
    """
    run = _LocalRun(settings, args)
    if run.home is None:
        print(f"vcrawl: nothing to resume: a remote data root ({run.data_dir}) keeps no saved state", file=sys.stderr)
        return 1
    if not run.home.has_saved_state():
        print(f"vcrawl: no saved crawl state in {run.data_dir} (no {run.home.directory}/appendonlydir): "
              f"nothing to resume; give the --data of the interrupted run", file=sys.stderr)  # fmt: skip
        return 1
    try:
        with run.stack:
            code = run.open_redis(resuming=True)
            if code is not None:
                return code
            return _resume(run, job_id)
    except KeyboardInterrupt:
        print("\ninterrupted before the job was resumed; its saved state is kept", file=sys.stderr)
        return EXIT_INTERRUPTED


def _resume(run: _LocalRun, job_id: str) -> int:
    import tasks

    status = tasks.job_status(job_id)
    if status is None:
        known = ", ".join(tasks.list_jobs(limit=10)) or "none"
        print(f"vcrawl: no job {job_id!r} in the saved state of {run.data_dir} (jobs there: {known})",
              file=sys.stderr)  # fmt: skip
        return 1
    if status["state"] in (names.STATE_CANCELLED, names.STATE_FAILED):
        print(f"vcrawl: job {job_id} was {status['state']}; it cannot be resumed", file=sys.stderr)
        return 1
    if status["state"] == names.STATE_COMPLETED:
        print(f"job {job_id} had already completed; nothing to resume", file=sys.stderr)
        return run.finish(status)
    restored = tasks.requeue_unacked()  # before any worker runs: every such message is an orphan
    if restored:
        print(f"{restored} message(s) of workers stopped by force put back on their queues", file=sys.stderr)
    site = _demo_site_of(job_id, status)
    if site is not None:
        run.stack.enter_context(site)
        print(f"demo site at {site.url} again", file=sys.stderr)
        # As in `vcrawl demo`: the workers may fetch exactly the demo site's (loopback) address.
        run.settings = replace(run.settings, allowed_networks=(*run.settings.allowed_networks, site.network))
    run.start_workers()

    def begin() -> str:
        state = tasks.resume_job(job_id) if status["state"] == names.STATE_PAUSED else status["state"]
        print(f"job {job_id} resumed ({state}): {status['pages_stored']} pages stored before, "
              f"{status['pending']} URLs to go{run.resume_hint(job_id)}", file=sys.stderr)  # fmt: skip
        return job_id

    return run.follow_to_end(begin)


class _Signals:
    """SIGINT and SIGTERM: one exception while starting up; once the job runs, only counted."""

    def __init__(self) -> None:
        self.count = 0
        self._raise = True
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.count += 1
        if self._raise:
            self._raise = False
            raise KeyboardInterrupt

    def count_only(self) -> None:
        """From now on, signals are counted; the loops act on them (never mid-way through a Redis call)."""
        self._raise = False


class _LocalRun:
    """One local run: its data root, private Redis, workers, and how it stops."""

    def __init__(self, settings: Settings, args: argparse.Namespace) -> None:
        import tasks

        data = args.data if args.data is not None else settings.data
        self.remote = "://" in data and not data.startswith("file://")
        self.data_dir = data.rstrip("/") if self.remote else str(Path(data).resolve())  # hdfs://... stays a URL
        self.settings = replace(settings, data=self.data_dir)
        # Before Redis and the workers start: a setting the workers need but lack would otherwise
        # fail every fetch batch while the run waits for pages that never come.
        tasks.check_settings(self.settings)
        self.args = args
        self.private = uses_private_redis(settings)
        if self.private and not settings.is_given("task_events"):
            # Task events cost a fanout publish per task (about a tenth of a worker's CPU here),
            # and nobody watches a private Redis; Flower, if pointed at it, turns them on itself.
            self.settings = replace(self.settings, task_events=False)
        self.home = RedisHome(self.data_dir) if self.private and not self.remote else None
        self.stack = ExitStack()
        self.signals = _Signals()
        self.started = time.monotonic()
        self._discard_state = False
        self._workers: Any = None

    def open_redis(self, resuming: bool) -> int | None:
        """Start the private Redis (from the saved state, if any) and point ``tasks`` at it.

        Returns an exit code when the data root's Redis is in use by another run, else None.
        """
        import tasks
        from cli.local_redis import LocalRedis

        if self.private:
            if self.home is None:  # a remote data root: a temporary Redis, as nothing is kept
                local = LocalRedis()
            else:
                if not self.home.try_lock():
                    print(f"vcrawl: {self.data_dir} is in use by another vcrawl run ({self.home.holder()}); "
                          f"wait for it to end, or stop it, or give another --data", file=sys.stderr)  # fmt: skip
                    return 1
                self.stack.callback(self.home.unlock)
                self.stack.callback(self._discard_if_done)
                local = LocalRedis(self.home.directory, start_timeout_s=_REDIS_START_S, pass_fds=[self.home.lock_fd],
                                   stop_timeout_s=_REDIS_STOP_S)  # fmt: skip
            self.stack.callback(local.stop)  # before start: an interrupt while it starts must stop it too
            local.start()
            if self.home is not None:
                self.home.record(pid=os.getpid(), redis_pid=local.pid or 0, port=local.port)
            self.settings = replace(self.settings, redis_url=local.url)
            where = f", data in {self.home.directory}" if self.home is not None else ""
            verb = "restarted the" if resuming else "started a"
            print(f"{verb} private redis-server (pid {local.pid}){where}", file=sys.stderr)
        tasks.configure(self.settings)
        return None

    def park_earlier_jobs(self) -> None:
        """Leave the saved state's jobs to ``vcrawl resume``, and say so.

        A job still ``running`` there belongs to a run that was killed (this one holds the lock):
        it is paused, so the new job's workers do not take it up unasked.
        """
        import tasks

        for job_id in self._resumable_jobs():
            tasks.pause_job(job_id)
            print(f"note: job {job_id} of an earlier run is paused here; it goes on with"
                  f"{self.resume_hint(job_id, note=False)}", file=sys.stderr)  # fmt: skip

    def start_workers(self) -> None:
        """Start the local worker processes; they stop when the run ends."""
        import tasks
        from cli.cluster import LocalWorkers

        env = child_environment(self.settings)
        if self.args.log_dir is not None:
            log_dir = self.args.log_dir
        elif self.remote:
            log_dir = Path(tempfile.mkdtemp(prefix="vcrawl-logs-"))
        else:
            log_dir = Path(self.data_dir) / "logs"
        # A worker misses a ping sent before it listens: short pings, asked again, see it up sooner.
        ping = functools.partial(tasks.ping_workers, timeout_s=_START_PING_S)
        self._workers = LocalWorkers(self.args.workers, self.args.threads, env, log_dir, ping)
        self.stack.callback(self._workers.stop, grace_s=_WORKER_STOP_S, hurry=lambda: self.signals.count > 1)
        self._workers.start()
        print(f"started {self.args.workers} worker processes (pids {self._workers.pids})", file=sys.stderr)
        if self.settings.broker_url is not None:
            print(f"Celery's messages go through RabbitMQ at {redacted(self.settings.broker_url)}", file=sys.stderr)

    def resume_hint(self, job_id: str, note: bool = True) -> str:
        """How to go on with ``job_id`` after an interrupt, for the messages."""
        if self.home is None:
            return ""
        command = self._resume_command(job_id)
        return f" (Ctrl-C pauses it; {command} goes on)" if note else f" {command}"

    def _resume_command(self, job_id: str) -> str:
        words = ["vcrawl", "resume", job_id, "--data", self.data_dir]
        for network in getattr(self.args, "allow_network", None) or []:  # not saved: the workers need it again
            words += ["--allow-network", network]
        return shlex.join(words)

    def follow_to_end(self, begin: Callable[[], str]) -> int:
        """Start or resume the job, follow it, and report; on a signal, pause and stop cleanly."""
        self.signals.count_only()
        if self.signals.count:  # came just before: nothing was started yet
            raise KeyboardInterrupt
        job_id = begin()
        status = follow(job_id, self.args.timeout, interrupted=lambda: self.signals.count > 0)
        if status is None:
            return self._interrupt(job_id)
        return self.finish(status)

    def finish(self, status: dict[str, Any]) -> int:
        """Report the run; the saved state goes too once no job in it can be resumed."""
        summary = summary_of(status, time.monotonic() - self.started, self.data_dir)
        if self.private:  # the run had Redis to itself: what it cost there is this run's
            summary = replace(summary, redis=redis_cost())
        report(summary, as_json=self.args.json)
        self._discard_state = self.home is not None and not self._resumable_jobs()
        return 0 if summary.state == names.STATE_COMPLETED else 1

    def _interrupt(self, job_id: str) -> int:
        import tasks

        if self.private and self.home is None:  # a temporary Redis: there is nothing to come back to
            tasks.cancel_job(job_id)
            print(f"\ninterrupted: job {job_id} cancelled (a remote --data root keeps no saved state, "
                  f"so it cannot be resumed); stopping the workers", file=sys.stderr)  # fmt: skip
            self._workers.stop(grace_s=self.args.grace, hurry=lambda: self.signals.count > 1)
            return EXIT_INTERRUPTED
        if not tasks.pause_job(job_id):
            status = tasks.job_status(job_id) or {}
            if status.get("state") in names.FINAL_STATES:  # it ended as the signal came
                return self.finish(status)
        print(f"\ninterrupted: job {job_id} paused; in-flight work may finish for up to {self.args.grace:g}s "
              f"(Ctrl-C again to stop at once)", file=sys.stderr)  # fmt: skip
        deadline = time.monotonic() + self.args.grace
        drained = _drain(job_id, deadline, hurry=lambda: self.signals.count > 1)
        self._workers.stop(grace_s=max(_MIN_STOP_S, deadline - time.monotonic()),
                           hurry=lambda: self.signals.count > 1)  # fmt: skip
        status = tasks.job_status(job_id) or {}
        left = "nothing was in flight" if drained else "work still in flight is redelivered when resumed"
        print(f"job {job_id} paused: {status.get('pages_stored', 0)} pages stored, "
              f"{status.get('pending', 0)} URLs to go; {left}", file=sys.stderr)  # fmt: skip
        if self.home is not None:
            print(f"resume it with: {self._resume_command(job_id)}", file=sys.stderr)
        else:
            print(f"resume it with: vcrawl resume {shlex.quote(job_id)} (on the cluster's workers)", file=sys.stderr)
        return EXIT_INTERRUPTED

    def _resumable_jobs(self) -> list[str]:
        import tasks

        return [job for job in tasks.list_jobs(limit=1000) if tasks.job_state(job) in names.ACTIVE_STATES]

    def _discard_if_done(self) -> None:
        if self._discard_state and self.home is not None:
            self.home.discard_state()


def _drain(job_id: str, deadline: float, hurry: Callable[[], bool]) -> bool:
    """Wait until the paused job has nothing in flight: every unfinished URL is back in its queue."""
    import tasks

    while time.monotonic() < deadline and not hurry():
        status = tasks.job_status(job_id, with_outputs=False) or {}
        if status.get("state") != names.STATE_PAUSED:
            return True
        if status["in_flight_batches"] == 0 and status["pending"] <= status["queued"]:
            return True
        time.sleep(0.1)
    return False


def _demo_site_of(job_id: str, status: dict[str, Any]) -> Any:
    """The bundled demo site again on its old port, for a job ``vcrawl demo`` started (else None)."""
    from cli.demo import DemoSite

    seeds = status.get("seeds", [])
    if not job_id.startswith("demo-") or len(seeds) != 1:
        return None
    parts = urlsplit(seeds[0])
    if parts.hostname != "127.0.0.1" or parts.port is None or parts.path != "/":
        return None
    try:
        return DemoSite(port=parts.port)
    except OSError as exc:
        raise ConfigError(f"the demo site cannot listen on port {parts.port} again: {exc}") from None
