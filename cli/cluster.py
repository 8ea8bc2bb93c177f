"""A local cluster for the embedded default: Celery workers (`tasks.celery_worker`) we start and stop by PID."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from vcrawl.errors import ConfigError

__all__ = ["LocalWorkers"]

logger = logging.getLogger(__name__)


DEFAULT_WORKERS = os.cpu_count() or 1
"""Worker processes a local run starts: one per core."""
DEFAULT_THREADS = 64
"""Threads per worker process of a local run."""


class LocalWorkers:
    """Start N worker processes (``tasks.celery_worker``: thread pool, both queues); stop them on exit.

    Each worker process also runs a frontier pump, so a job is dispatched as long as any runs.
    """

    def __init__(
        self,
        count: int,
        threads: int,
        env: Mapping[str, str],
        log_dir: Path,
        ping: Callable[[list[str]], set[str]],
        start_timeout_s: float = 60.0,
    ) -> None:
        self._count, self._threads = count, threads
        self._env = dict(env)
        self._log_dir = log_dir
        self._ping = ping
        self._start_timeout_s = start_timeout_s
        self._processes: list[subprocess.Popen[bytes]] = []
        self.names = [f"vcrawl{index}@{os.uname().nodename}-{os.getpid()}" for index in range(count)]

    def start(self) -> LocalWorkers:
        """Start the workers and wait until every one answers a ping.

        Raises:
            ConfigError: a worker exited or did not answer in time (see its log).
        """
        self._log_dir.mkdir(parents=True, exist_ok=True)
        for name in self.names:
            log = self._log_dir / f"{name.split('@')[0]}.log"
            # `celery -A tasks worker -P threads -c N -Q ... -n NAME -l WARNING --without-mingle
            # --without-gossip`, less the command line's own start-up (tasks.celery_worker).
            command = [sys.executable, "-m", "tasks.celery_worker", name, str(self._threads),
                       "download,download.dynamic,analysis", "WARNING"]  # fmt: skip
            with open(log, "ab") as out:
                # A session of its own: a terminal's Ctrl-C reaches the vcrawl process only, which
                # pauses the job first and then stops the workers itself (warm, then by force).
                process = subprocess.Popen(
                    command, env=self._env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )  # fmt: skip
            self._processes.append(process)
        deadline = time.monotonic() + self._start_timeout_s
        waiting = set(self.names)
        while waiting and time.monotonic() < deadline:
            for process, name in zip(self._processes, self.names, strict=True):
                if process.poll() is not None:
                    self.stop()
                    raise ConfigError(f"worker {name} exited with {process.returncode}; see {self._log_dir}")
            waiting -= self._ping(sorted(waiting))
        if waiting:
            self.stop()
            late = sorted(waiting)
            raise ConfigError(f"workers {late} did not start in {self._start_timeout_s}s; see {self._log_dir}")
        return self

    @property
    def pids(self) -> list[int]:
        """PIDs of the worker processes."""
        return [process.pid for process in self._processes]

    def stop(self, grace_s: float = 10.0, hurry: Callable[[], bool] = lambda: False) -> None:
        """Warm shutdown (SIGTERM); SIGKILL whatever still runs after ``grace_s``, or once ``hurry()``.

        A warm shutdown lets running tasks finish; messages a worker took but did not start go
        back to the broker. A killed worker's running tasks are redelivered (``acks_late``).
        """
        for process in self._processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and not hurry():
            if all(process.poll() is not None for process in self._processes):
                break
            time.sleep(0.05)
        for process in self._processes:
            if process.poll() is None:
                logger.warning("worker %s did not stop in time; killing it", process.pid)
                process.kill()
            process.wait(5)
        self._processes = []

    def __enter__(self) -> LocalWorkers:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
